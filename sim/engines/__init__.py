"""Engines: the request protocol, scheduler and memory semantics of a real server.

``sglang``: SGLang 0.5.23's scheduler over the radix KV cache (``sim.kvcache``);
``vllm``: vLLM 0.33's V1 scheduler over its prefix-caching block pool
(``sim.kvcache.blockpool``). Eviction policies (``policies``) are orthogonal to engines: an
engine says which it can express (``EngineBase.check``). ``ENGINES`` names them and
``VLLM_PATCHES`` the patched vLLMs; ``engine_class(cfg)`` is the class that serves a config,
whose ``build`` ``sim.run.build`` calls for each replica.
"""

from costmodel.registry import Registry
from costmodel.specs import get_spec
from sim.config import SGLangKnobs, VllmKnobs

from .base import EngineBase, StepObserver
from .request import Req
from .sglang import SGLangServer, hybrid_tree_kind
from .sglang_hybrid import SGLangHybridServer
from .vllm import VllmServer
from .vllm_patch import VLLM_PATCHES

ENGINES: Registry[type[EngineBase]] = Registry("engine")
ENGINES.register("sglang", SGLangServer)
ENGINES.register("vllm", VllmServer)


def engine_class(cfg) -> type[EngineBase]:
    """The class that serves a ``sim.config.RunConfig``: a named vLLM patch's (each
    subclasses ``VllmServer``; only ``VllmKnobs`` has a patch), SGLang's over its hybrid
    radix tree for a model SGLang keeps in one (``sglang_hybrid.py``), else its engine's."""
    knobs = cfg.engine
    if isinstance(knobs, VllmKnobs) and knobs.vllm_patch != "none":
        return VLLM_PATCHES[knobs.vllm_patch]
    if isinstance(knobs, SGLangKnobs) and hybrid_tree_kind(
            get_spec(cfg.cache.model, cfg.cache.kv_dtype), knobs) is not None:
        return SGLangHybridServer
    return ENGINES[knobs.name]


__all__ = ["ENGINES", "VLLM_PATCHES", "EngineBase", "Req", "SGLangHybridServer", "SGLangServer",
           "StepObserver", "VllmServer", "engine_class"]
