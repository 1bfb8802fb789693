"""The built-in routers, registered by name (``policies.routing.get_router``).

``simple``: round-robin, random, least-load (Vidur's lor), power-of-two, session-affinity.
The field's cache-aware routers, one module each (its rule as pure functions, then the
router): ``sglang`` (sglang-cache-aware), ``dynamo`` (dynamo-kv), ``llmd`` (llm-d),
``mooncake``, ``preble``.
"""

from . import simple  # noqa: F401  registers them

from . import dynamo, llmd, mooncake, preble, sglang  # noqa: F401  # isort: skip
