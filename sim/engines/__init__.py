"""Engines: the request protocol, scheduler and memory semantics of a real server.

``sglang``: SGLang 0.5.23's scheduler over the radix KV cache (``sim.kvcache``);
``vllm``: vLLM 0.33's V1 scheduler over its prefix-caching block pool
(``sim.kvcache.blockpool``). Eviction policies (``policies``) are orthogonal to engines: an
engine says which it can express (``EngineBase.unsupported``). ``ENGINES`` names them;
``sim.run.build`` builds each replica's engine with ``ENGINES[name].build``.
"""

from costmodel.registry import Registry

from .base import EngineBase
from .request import Req
from .sglang import SGLangServer
from .vllm import VllmServer

ENGINES: Registry[type[EngineBase]] = Registry("engine")
ENGINES.register("sglang", SGLangServer)
ENGINES.register("vllm", VllmServer)

__all__ = ["ENGINES", "EngineBase", "Req", "SGLangServer", "VllmServer"]
