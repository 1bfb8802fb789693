"""Context strategies (seed 003): how a session's history is managed on purpose, not under
memory pressure -- text trimming and summarization (context engineering), AKV drop / repos,
Leyline splice, region budgets (cache engineering). ``strategies`` decides, ``session``
turns decisions into keys and edits, ``plan`` into computed ranges and prices, ``run`` wires
a run. kvsim prices serving only: it does not model what any of them does to task accuracy.
"""

from sim.kvcache import native

native.install()  # the prompt may run compiled: decided before it loads

from .prefill import prefill_ranges  # noqa: E402
from .prompt import FullPrompt, PrefillOnlyPrompt, Prompt  # noqa: E402
from .run import COUNTERS, ContextRun, apply_edit, context_summary  # noqa: E402
from .strategies import (  # noqa: E402
    ACCURACY_NOTE,
    ContextError,
    Strategy,
    context_problem,
    parse_context,
)
from .view import RequestView  # noqa: E402

__all__ = ["ACCURACY_NOTE", "COUNTERS", "ContextError", "ContextRun", "FullPrompt",
           "PrefillOnlyPrompt", "Prompt", "RequestView", "Strategy", "apply_edit",
           "context_problem", "context_summary", "parse_context", "prefill_ranges"]
