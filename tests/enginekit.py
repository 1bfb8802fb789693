"""A tiny hand-built trace with the ``traces.Trace`` interface, for engine tests whose
expected numbers are computed by hand from the cost model; and what those tests share: the
cc-traces writer, summary equality, the instances a run builds (``instances``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from costmodel.profile import load_profile
from costmodel.specs import get_spec
from costmodel.units import range_units, ranges_units
from sim.config import RunConfig

# The model and profile the hand-computed engine timelines are priced on (the tests pin
# ``profile=PROF.name``); DEFAULT_PROF is the one a run without ``--profile`` uses (the PD tests').
SPEC = get_spec("qwen3-8b")
PROF = load_profile("derived-h100-qwen3-8b")
DEFAULT_PROF = load_profile(None, "qwen3-8b")
KVB = SPEC.kv_bytes_per_token


def prefill(*ranges: tuple[int, int]) -> float:
    """One prefill of token ``ranges`` on PROF."""
    return PROF.prefill_seconds(ranges_units(SPEC, ranges))


def prefill_s(a: int, b: int) -> float:
    """One prefill of tokens ``[a, b)`` on DEFAULT_PROF."""
    return DEFAULT_PROF.prefill_seconds(range_units(SPEC, a, b))


def row(res, session: str, turn: int):
    """The request row of ``session``'s ``turn`` in a run's result."""
    df = res.requests
    return df[(df.session == session) & (df.turn == turn)].iloc[0]


def lpm_cfg(**kw) -> RunConfig:
    """SGLang-like engine, LPM scheduler, 64 new tokens, priced on PROF; ``preset`` picks the
    policy preset (penelope unless given)."""
    base = dict(gpu_cache=1 << 20, sessions=4, scheduler="lpm", max_new_tokens=64,
                debug_cache=True, profile=PROF.name)
    base.update(kw)
    preset = base.pop("preset", "penelope")
    return RunConfig.from_flat(**base).with_preset(preset)


@dataclass
class KitSession:
    id: str
    first: int
    count: int
    parent: int = -1
    after_request: int = -1
    start_offset_s: float = 0.0
    shared_prefix_blocks: int = 0
    agent_type: str = ""


class KitTrace:
    """Sessions of requests given as (prompt_tokens, output_tokens, gap_s). Each session's
    prompt ``k`` extends prompt ``k-1`` (append-only); ids are unique per session, so sessions
    share nothing unless ``shared_blocks`` gives them a common prefix (one count for every
    session, or one per session)."""

    name = "kit"
    block_size = 64
    skipped = 0  # records a lenient load skipped (traces.Trace)

    def __init__(self, sessions: list[list[tuple[int, int, float]]],
                 shared_blocks: int | list[int] = 0):
        self.sessions: list[KitSession] = []
        rows = []
        if isinstance(shared_blocks, int):
            shared_blocks = [shared_blocks] * len(sessions)
        for s, reqs in enumerate(sessions):
            self.sessions.append(KitSession(f"s{s}", len(rows), len(reqs),
                                            shared_prefix_blocks=shared_blocks[s]))
            rows += [(s, *r) for r in reqs]
        self.session = np.array([r[0] for r in rows], dtype=np.int32)
        self.prompt_tokens = np.array([r[1] for r in rows], dtype=np.int64)
        self.output_tokens = np.array([r[2] for r in rows], dtype=np.int64)
        self.gap_s = np.array([r[3] for r in rows], dtype=np.float64)
        self.send_time_s = np.cumsum(self.gap_s)
        first = np.zeros(len(rows), dtype=bool)
        first[[x.first for x in self.sessions]] = True
        self.gap_kind = np.where(first, 0, 1).astype(np.int8)  # traces.GAP_KINDS: first, tool
        self.shared_blocks = shared_blocks
        self.options: dict = {}

    def __len__(self) -> int:
        return len(self.session)

    def _ids(self, s: int, n: int) -> np.ndarray:
        ids = np.arange(n, dtype=np.int64) + 1_000_000 * (s + 1)
        k = min(n, self.shared_blocks[s])
        ids[:k] = np.arange(k)
        return ids

    def block_ids(self, r: int) -> np.ndarray:
        return self._ids(int(self.session[r]), int(self.prompt_tokens[r]) // 64)

    def block_regions(self, r: int) -> None:
        """No regions recorded (policies see ``Arrival.block_regions = None``)."""
        return None

    def finish_block_ids(self, r: int) -> np.ndarray:
        n = (int(self.prompt_tokens[r]) + int(self.output_tokens[r]) - 1) // 64
        return self._ids(int(self.session[r]), n)

    def gaps(self, model: str) -> np.ndarray:
        return self.gap_s.copy()

    def start_offsets(self, model: str) -> np.ndarray:
        return np.array([s.start_offset_s for s in self.sessions], dtype=np.float64)


def write_cc_traces(folder, sessions: int = 3, turns: int = 6, seed: int = 0) -> None:
    """Write a tiny cc-traces folder (one JSON session per file, the published format):
    append-only prompts of a few thousand tokens, tool-result gaps of a few seconds."""
    import json
    from pathlib import Path

    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(sessions):
        prompt, t, reqs = 3000 + 500 * s, 0.0, []
        for k in range(turns):
            out = int(rng.integers(20, 200))
            reqs.append({
                "t": round(t, 3), "type": "n", "model": "claude-test", "in": prompt, "out": out,
                "hash_ids": list(range(1, prompt // 64 + 1)),
                "input_types": ["text"] if k == 0 else ["tool_result"],
                "output_types": ["tool_use"], "stop": "tool_use", "api_time": 1.0,
                "think_time": 0.0 if k == 0 else 3.0})
            t += 4.0
            prompt += out + int(rng.integers(300, 1500))
        doc = {"id": f"trace_{s:04d}", "models": ["claude-test"], "block_size": 64,
               "hash_id_scope": "local", "tool_tokens": 1000, "system_tokens": 500,
               "requests": reqs}
        (folder / f"trace_{s:04d}.json").write_text(json.dumps(doc))


def same_summary(a: dict, b: dict) -> bool:
    """Two run summaries with equal figures, NaN (an empty figure) equal to NaN, nested ones
    too: a dict's == matches NaN by identity only, and the compiled core makes a new NaN
    object each run (JSON writes it as NaN, floats by their exact repr)."""
    import json

    def text(d: dict) -> str:
        return json.dumps(d, sort_keys=True, default=str)

    return text(a) == text(b)


T = TypeVar("T")


def instances(monkeypatch: Any, cls: type[T]) -> list[T]:
    """Every ``cls`` (or subclass) made while ``monkeypatch`` holds, in order: a run's servers
    or pools, to look at after the run (``cls.__init__`` spied)."""
    made: list[T] = []
    init = cls.__init__

    def spy(self: T, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        made.append(self)

    monkeypatch.setattr(cls, "__init__", spy)
    return made


# a vLLM run whose decode runs cut by memory and arrivals are exercised: 4 sessions of 6
# growing turns over a shared prefix
DECODE_RUN_TRACE = [[(1500 + 700 * k, 400 + 150 * k, 1.0 + 0.3 * k) for k in range(6)]
                    for _ in range(4)]


def assert_decode_runs_are_steps(monkeypatch: Any, cfg: RunConfig, trace: Any,
                                 columns: tuple[str, ...]) -> None:
    """A vLLM run taking its decode runs in one event equals the run taking one event per
    V1 step (``VllmServer.decode_runs`` off) in ``columns`` of every request, with times
    equal to rounding; the run must evict and retract, and the runs must save events."""
    from sim.engines import VllmServer
    from sim.run import run

    fast = run(cfg, trace)
    monkeypatch.setattr(VllmServer, "decode_runs", False)
    slow = run(cfg, trace)
    monkeypatch.undo()
    assert fast.summary["retractions"] > 0 and fast.summary["evicted_tokens"] > 0
    assert fast.summary["decode_events"] < slow.summary["decode_events"] / 10
    for col in columns:
        assert fast.requests[col].tolist() == slow.requests[col].tolist(), col
    for col in ("ttft_s", "end_s", "admit_s"):
        np.testing.assert_allclose(fast.requests[col], slow.requests[col], rtol=1e-9)
