"""Engines: the request protocol, scheduler and memory semantics of a real server.

``sglang``: SGLang 0.5's scheduler over the radix KV cache (``sim.kvcache``). Eviction
policies (``policies``) are orthogonal to engines.
"""

from .base import EngineBase
from .request import Req
from .sglang import SGLangServer

ENGINES: dict[str, type[EngineBase]] = {"sglang": SGLangServer}

__all__ = ["ENGINES", "EngineBase", "Req", "SGLangServer"]
