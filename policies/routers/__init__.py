"""The built-in routers, registered by name (``policies.routing.get_router``).

``simple``: round-robin, random, least-load (Vidur's lor), power-of-two, session-affinity.
"""

from . import simple  # noqa: F401  registers them
