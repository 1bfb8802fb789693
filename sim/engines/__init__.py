"""Engines: the request protocol, scheduler and memory semantics of a real server.

``sglang``: SGLang 0.5.23's scheduler over the radix KV cache (``sim.kvcache``);
``vllm``: vLLM 0.33's V1 scheduler over its prefix-caching block pool
(``sim.kvcache.blockpool``). Eviction policies (``policies``) are orthogonal to engines: an
engine says which it can express (``EngineBase.check``). ``ENGINES`` names them and
``VLLM_PATCHES`` the patched vLLMs; ``engine_class(cfg)`` is the class that serves a config,
whose ``build`` ``sim.run.build`` calls for each replica.
"""

from costmodel.registry import Registry
from sim.config import VllmKnobs

from .base import EngineBase, StepObserver
from .request import Req
from .sglang import SGLangServer
from .vllm import VllmServer
from .vllm_patch import VLLM_PATCHES

ENGINES: Registry[type[EngineBase]] = Registry("engine")
ENGINES.register("sglang", SGLangServer)
ENGINES.register("vllm", VllmServer)


def engine_class(cfg) -> type[EngineBase]:
    """The class that serves a ``sim.config.RunConfig``: a named vLLM patch's (each
    subclasses ``VllmServer``; only ``VllmKnobs`` has a patch), else
    its engine's."""
    knobs = cfg.engine
    if isinstance(knobs, VllmKnobs) and knobs.vllm_patch != "none":
        return VLLM_PATCHES[knobs.vllm_patch]
    return ENGINES[knobs.name]


__all__ = ["ENGINES", "VLLM_PATCHES", "EngineBase", "Req", "SGLangServer", "StepObserver",
           "VllmServer", "engine_class"]
