"""The SGLang engine on hybrid models (sim/engines/sglang_hybrid.py, issue 54): SGLang's hybrid
radix tree (sim/kvcache/hybridtree.py) wired into the engine, and the eviction policies on it,
Penelope's holes included (docs/hybrid.md, "The SGLang engine on hybrid models").

- the tree under every start position and granularity: every counter recounted after every op
  of random agent streams (sessions that grow, a shared prefix, chunked prefills, decode),
  nothing held at the end (hypothesis);
- a hit on a path with holes against a brute force over every refill start and hit point
  (tests/test_hybrid_refill.py's, position by position on the path the tree keeps);
- Penelope's holes start at restart points: their refill has no run-up;
- the engine: which cache each model gets, runs of every preset alone, in a fleet and with PD
  (the tree recounted after every op: --debug-cache), and one-line refusals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kvcache.hybridtree import STARTS, Freed, HybridRadixCache, HybridRequest
from tests.test_hybrid_refill import brute


# --- the tree alone: random agent streams --------------------------------------------------
@dataclass
class Live:
    h: HybridRequest
    prompt: np.ndarray
    final: np.ndarray
    done: int  # blocks computed (pages held) so far
    stage: int = 0  # 0: prefill, 1: decoded


@dataclass
class Stream:
    tree: HybridRadixCache
    chunk: int
    sessions: list[np.ndarray] = field(default_factory=list)
    live: dict[int, Live] = field(default_factory=dict)
    next_id: int = 1000
    rid: int = 0
    refills: int = 0  # admissions whose hit went through holes

    def new_ids(self, n: int) -> np.ndarray:
        out = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        return out

    def check_hit(self, h: HybridRequest, prompt: np.ndarray) -> None:
        """The hit and the phantom's ranges against the brute force, read off the path."""
        t = self.tree
        holes, live, states, pos = [], [], [], 0
        node = t.root
        while pos < len(prompt):
            child = node.children.get(int(prompt[pos]))
            if child is None:
                break
            n = min(len(child), len(prompt) - pos)
            if not np.array_equal(child.ids[:n], prompt[pos:pos + n]):
                break
            if child.hole:
                holes.append((pos, pos + n))
            if child.swa:
                live.append((pos, pos + n))
            if child.state and n == len(child):
                states.append(pos + n)
            pos += n
            node = child
            if n < len(child):
                break
        if not holes or pos > 9:  # (the brute force is exponential in the hit position)
            return
        windows = [(-(-t.window // t.bs), live)] if t.has_swa else []
        best = brute(pos, holes, windows, states if t.has_mamba else None)
        computed = {p for a, b in h.refill for p in range(a, b)} | set(range(h.hit, pos))
        assert frozenset(computed) in best, (h.hit, h.refill, holes, live, states)

    def admit(self, prompt: np.ndarray, final: np.ndarray) -> None:
        t = self.tree
        freed = Freed()
        h = t.admit(prompt[:max(0, len(prompt) - 1)], prompt, freed)
        assert all(b <= h.hit for _, b in h.refill)
        self.refills += bool(h.refill)
        self.check_hit(h, prompt[:max(0, len(prompt) - 1)])
        if not t.fill(h, freed):
            t.release(h, freed)
            return
        self.rid += 1
        self.live[self.rid] = Live(h, prompt, final, h.hit)

    def step(self, rid: int) -> None:
        t, x = self.tree, self.live[rid]
        freed = Freed()
        if x.stage == 0:
            n = min(self.chunk, len(x.prompt) - x.done)
            if n <= 0 or not t.allocate(x.h, n, freed):
                t.release(x.h, freed)
                del self.live[rid]
                return
            x.done += n
            if x.done < len(x.prompt):
                t.checkpoint(x.h, x.done, False, freed)
            else:
                x.stage = 1
            return
        n = len(x.final) - x.done
        if n > 0 and not t.allocate(x.h, n, freed):
            t.release(x.h, freed)
            del self.live[rid]
            return
        x.h.ids = x.final
        t.decode_to(x.h, len(x.final) * t.bs, freed)
        t.checkpoint(x.h, len(x.final), True, freed)
        t.release(x.h, freed)
        del self.live[rid]
        self.sessions.append(x.final)


def drive(tree: HybridRadixCache, chunk: int, ops: list[tuple[int, int, int]]) -> Stream:
    """Run ``ops`` (kind, prompt growth, output blocks) on ``tree``: a new turn (a session
    grows, or a new one starts over the shared prefix) or the next step of a live request;
    the tree recounted after every op, nothing held once every request is done."""
    s = Stream(tree, chunk)
    shared = s.new_ids(2)
    cap = (tree.state_capacity - 1) // 2 if tree.has_mamba else 1 << 30  # (the engine's)
    for kind, grow, out in ops:
        if (kind < 4 and len(s.live) < cap) or not s.live:
            grown = s.sessions and kind % 2
            base = s.sessions.pop(kind % len(s.sessions)) if grown else shared
            prompt = np.concatenate([base, s.new_ids(grow)])
            s.admit(prompt, np.concatenate([prompt, s.new_ids(out)]))
        else:
            s.step(sorted(s.live)[kind % len(s.live)])
        tree.check()
    for rid in list(s.live):
        tree.release(s.live.pop(rid).h, Freed())
    tree.check()
    assert tree.idle()
    return s


def _tree(mamba: bool, full: int, swa: int, window: int, slots: int, start: str,
          block: bool) -> HybridRadixCache:
    if mamba:
        return HybridRadixCache(full, block_size=1, state_slots=slots, start=start, block=block)
    return HybridRadixCache(full, min(swa, full), window, 1, start=start, block=block)


@settings(max_examples=120, deadline=None)
@given(mamba=st.booleans(), start=st.sampled_from(STARTS), block=st.booleans(),
       full=st.integers(10, 30), swa=st.integers(6, 16), window=st.integers(1, 4),
       slots=st.integers(4, 12), chunk=st.integers(2, 5),
       ops=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 3), st.integers(1, 2)),
                    min_size=5, max_size=80))
def test_tree_policies_keep_their_invariants(mamba: bool, start: str, block: bool, full: int,
                                             swa: int, window: int, slots: int, chunk: int,
                                             ops: list[tuple[int, int, int]]) -> None:
    """Every start position and granularity on SWA and Mamba trees (``drive``), every hit on
    a path with holes the brute force's."""
    drive(_tree(mamba, full, swa, window, slots, start, block), chunk, ops)


def test_hits_through_holes_are_the_brute_forces(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 seeded streams under pressure: Penelope's holes are refilled and each hit through
    them is checked against the brute force (more than 50 times)."""
    import random

    import tests.test_hybrid_refill as ref

    calls = []
    monkeypatch.setattr(__import__(__name__, fromlist=["brute"]), "brute",
                        lambda *a: calls.append(1) or ref.brute(*a))
    refills = 0
    for seed in range(200):
        rng = random.Random(seed)
        tree = _tree(seed % 2 == 0, rng.randint(10, 24), rng.randint(6, 12), rng.randint(1, 3),
                     rng.randint(4, 10), STARTS[seed % 3], bool(seed % 5))
        ops = [(rng.randint(0, 9), rng.randint(1, 3), rng.randint(1, 2)) for _ in range(80)]
        s = drive(tree, rng.randint(2, 5), ops)
        refills += s.refills
    assert len(calls) > 50 and refills > 50


def _history(tree: HybridRadixCache, ids: np.ndarray, upto: list[int]) -> None:
    """One request computes ``ids`` with chunk checkpoints at ``upto`` and finishes."""
    freed = Freed()
    h = tree.admit(ids[:0], ids, freed)
    assert tree.allocate(h, len(ids), freed)
    for u in upto:
        tree.checkpoint(h, u, False, freed)
    tree.decode_to(h, len(ids) * tree.bs, freed)
    tree.checkpoint(h, len(ids), True, freed)
    tree.release(h, freed)


@pytest.mark.parametrize(("mamba", "hole"), [(False, (5, 8)), (True, (6, 9))])
def test_penelope_holes_start_at_restart_points(mamba: bool, hole: tuple[int, int]) -> None:
    """A private history (13 blocks, a chunk checkpoint at 6) after a 3-block shared prefix
    that ends without a window or a state: Penelope's hole starts at the history's first
    restart point, where the window before it is live (SWA, 2 tokens: block 5) or a state
    sits (Mamba: the checkpoint at 6), so the phantom refills exactly the hole (no run-up)
    and the next turn still hits the whole history."""
    kw = dict(state_slots=8) if mamba else dict(swa_blocks=40, window=2)
    tree = HybridRadixCache(40, block_size=1, start="private-head", block=True,
                            **kw)  # type: ignore[arg-type]
    shared = np.arange(1, 4, dtype=np.int64)
    a = np.concatenate([shared, np.arange(10, 20, dtype=np.int64)])
    b = np.concatenate([shared, np.arange(30, 33, dtype=np.int64)])
    _history(tree, a, [6])
    _history(tree, b, [])
    freed = Freed()
    tree.evict(3, 0, freed)  # the least recently used leaf: a's history
    assert tree.hole_blocks == 3
    tree.check()
    turn = np.concatenate([a, [100, 101]])
    h = tree.admit(turn[:-1], turn, freed)
    assert h.refill == (hole,)
    assert h.hit == len(a)
    assert tree.fill_blocks(h) == 3 and tree.fill(h, freed)
    tree.check()
    tree.release(h, freed)
    tree.check()
    assert tree.idle()


# --- the engine -----------------------------------------------------------------------------
TRACE = dict(trace="synthetic:claude-code?sessions=4", max_context=32768, gaps="tool",
             sessions=2, gpu_cache=65536, debug_cache=True)


def _config(model: str, preset: str, **kw):
    from sim.config import RunConfig

    return RunConfig.from_flat(model=model, engine="sglang", **TRACE, **kw).with_preset(preset)


def test_each_model_gets_its_cache() -> None:
    from costmodel.specs import get_spec
    from sim.engines import SGLangHybridServer, SGLangServer, engine_class
    from sim.engines.sglang import hybrid_tree_kind

    assert hybrid_tree_kind(get_spec("gpt-oss-120b")) == "swa"
    assert hybrid_tree_kind(get_spec("qwen3-next-80b-a3b")) == "mamba"
    for name in ("qwen3-8b", "deepseek-v3.2", "deepseek-v3"):
        assert hybrid_tree_kind(get_spec(name)) is None
    assert engine_class(_config("gpt-oss-120b", "sglang")) is SGLangHybridServer
    assert engine_class(_config("qwen3-8b", "sglang")) is SGLangServer
    # --hybrid-swa-memory off (SGLang's --disable-hybrid-swa-memory): one pool of every layer;
    # SGLang has no such switch for its mamba pool
    off = dict(hybrid_swa_memory=False)
    assert engine_class(_config("gpt-oss-120b", "sglang", **off)) is SGLangServer
    assert engine_class(_config("qwen3-next-80b-a3b", "sglang", **off)) is SGLangHybridServer
    # DeepSeek-V4: its compressed entries in the full pool (indexed by token), every layer's
    # window in the SWA pool (DeepSeekV4TokenToKVPool is a BaseSWAKVPool); no one-pool form
    assert hybrid_tree_kind(get_spec("deepseek-v4-flash")) == "swa"
    for hsm in (True, False):
        assert engine_class(_config("deepseek-v4-flash", "sglang",
                                    hybrid_swa_memory=hsm)) is SGLangHybridServer


def test_gemma3_is_one_pool_on_sglang(tmp_path) -> None:
    """SGLang 0.5.23 never gives Gemma 2/3 its hybrid pools (its overrides set
    disable_hybrid_swa_memory; is_hybrid_swa_model does not list them): gemma-3-27b and a
    Gemma 3 config.json get the one-pool server whatever --hybrid-swa-memory says; the same
    layers under another architecture (or none stated) keep the hybrid tree."""
    import json
    from dataclasses import replace

    from costmodel.hfconfig import load_spec
    from costmodel.specs import get_spec
    from sim.engines import SGLangHybridServer, SGLangServer, engine_class
    from sim.engines.sglang import hybrid_tree_kind
    from tests.test_hybrid_models import GEMMA3

    gemma = get_spec("gemma-3-27b")
    assert gemma.architecture == "Gemma3ForConditionalGeneration"
    assert hybrid_tree_kind(gemma) is None
    for hsm in (True, False):
        assert engine_class(_config("gemma-3-27b", "sglang",
                                    hybrid_swa_memory=hsm)) is SGLangServer
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3))
    read = load_spec(str(path))
    assert read.architecture == "Gemma3ForCausalLM" and hybrid_tree_kind(read) is None
    for arch in ("", "Gemma4ForCausalLM"):
        assert hybrid_tree_kind(replace(gemma, architecture=arch)) == "swa"
    assert get_spec("gpt-oss-120b").architecture == "GptOssForCausalLM"
    assert engine_class(_config("gpt-oss-120b", "penelope")) is SGLangHybridServer


SHAPES = {"single": {}, "fleet": dict(replicas=2, router="dynamo-kv"),
          "pd": dict(prefill_replicas=1, decode_replicas=1)}


@pytest.mark.parametrize("model", ["gpt-oss-120b", "qwen3-next-80b-a3b", "deepseek-v4-flash"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_hybrid_runs_every_preset(model: str, shape: str) -> None:
    """sglang, vllm and penelope on the hybrid tree alone, in a fleet and disaggregated: every
    request served, the tree recounted after every op, Penelope's holes refilled."""
    from sim.run.driver import run

    for preset in ("sglang", "vllm", "penelope"):
        res = run(_config(model, preset, **SHAPES[shape]))
        s = res.summary
        assert s["requests"] > 0 and s["dropped_requests"] == 0, (preset, s)
        assert 0 < s["hit_rate"] <= 1 and s["ttft_mean_s"] > 0
        # every recomputed range is a request's (a PD decode side recomputes none of what
        # landed: the by-group ranges, which count both pools, add up to the requests')
        assert [g["tokens"] for g in s["recompute_by_group"]] == (
            [s["recomputed_tokens"]] * len(s["recompute_by_group"])), preset


@pytest.mark.parametrize(("kw", "field"), [
    (dict(cpu_cache=65536), "cpu_cache"),
    (dict(context="drop:4"), "context"),
    (dict(context="drop:4+repos"), "context"),
    (dict(context="splice:4"), "context"),
    (dict(context="budget:16k"), "context"),
])
def test_hybrid_tree_refuses_in_one_line(kw: dict, field: str) -> None:
    from sim.config import ConfigError
    from sim.run.check import check

    with pytest.raises(ConfigError, match=f"field '{field}'.*hybrid radix tree"):
        check(_config("gpt-oss-120b", "sglang", **kw))
    if field == "context":  # one pool takes every strategy
        check(_config("gpt-oss-120b", "sglang", hybrid_swa_memory=False, **kw))


@pytest.mark.parametrize(("model", "fields"), [
    ("gpt-oss-120b", dict(hybrid_swa_memory=False)),
    ("gemma-3-27b", {}),
    ("gemma-3-27b", dict(hybrid_swa_memory=False)),
])
def test_one_pool_is_sized_from_bytes(model: str, fields: dict) -> None:
    """One pool of every layer holds every token in every layer, window layers included: a
    byte budget (--gpu-cache 40GiB, or --gpu) holds it at the full-attention bytes of all
    layers; vLLM keeps its sliding-window groups."""
    from costmodel.specs import get_spec
    from sim.config import RunConfig
    from sim.deploy import resolve_gpu_fields
    from sim.run.check import check

    spec = get_spec(model)
    cell = spec.layers * 2 * spec.kv_heads * spec.head_dim * 2  # bf16 K and V, every layer
    point = dict(model=model, engine="sglang", **fields)
    out = resolve_gpu_fields({**point, "gpu_cache": "40GiB"}, "t")
    assert out["gpu_cache"] == 40 * 2**30 // cell // 64 * 64
    check(RunConfig.from_flat(**{**TRACE, **out}).with_preset("sglang"))
    gpu = resolve_gpu_fields({**point, "gpu": "H100", "tp": 4}, "t")["gpu_cache"]
    hybrid = resolve_gpu_fields({"model": model, "engine": "sglang", "gpu": "H100", "tp": 4,
                                 "hybrid_swa_memory": True}, "t")["gpu_cache"]
    assert (gpu == hybrid) == model.startswith("gemma")  # gemma: one pool either way
    vllm = resolve_gpu_fields({**point, "engine": "vllm", "gpu_cache": "40GiB"}, "t")
    assert vllm["gpu_cache"] > out["gpu_cache"]
    if not fields:  # kvsim capacity --cache 40GiB sizes the same pool (no such flag there)
        from sim.cli.capacity import ByteSizes, bytes_to_tokens

        assert bytes_to_tokens(ByteSizes([40 * 2**30]), model, "bf16", "sglang", 64) == [
            out["gpu_cache"]]
