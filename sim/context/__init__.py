"""Context strategies (seed 003): how a session's history is managed on purpose, not under
memory pressure -- text trimming and summarization (context engineering), AKV drop / repos,
Leyline splice, region budgets (cache engineering). ``strategies`` decides, ``session``
turns decisions into keys and edits, ``plan`` into computed ranges and prices, ``run`` wires
a run. kvsim prices serving only: it does not model what any of them does to task accuracy.
"""

from .prefill import prefill_ranges
from .prompt import FullPrompt, PrefillOnlyPrompt, Prompt
from .run import COUNTERS, ContextRun, apply_edit, context_summary
from .strategies import (
    ACCURACY_NOTE,
    ContextError,
    Strategy,
    context_problem,
    parse_context,
)
from .view import RequestView

__all__ = ["ACCURACY_NOTE", "COUNTERS", "ContextError", "ContextRun", "FullPrompt",
           "PrefillOnlyPrompt", "Prompt", "RequestView", "Strategy", "apply_edit",
           "context_problem", "context_summary", "parse_context", "prefill_ranges"]
