"""One side of the compiled-core differential test (tests/test_native_core.py): run in a
subprocess on the path ``KVSIM_PURE`` selects, it prints as JSON which path ran and every
observable result, for the test to compare the two sides exactly.

    python tests/native_probe.py ops SEED COUNT   # random op streams on the radix cache
    python tests/native_probe.py runs             # the standard runs (sim.run.run)
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim import native
from sim.kvcache import CapacityError, RadixKVCache
from tests.cachepair import counters, structure
from tests.chained import Universe

# (policy, cache keywords): every tiering and both deletion ends
CACHES = [
    ("sglang", {}),
    ("penelope", {}),
    ("penelope", {"cpu_capacity_blocks": 10, "tiering": "unified", "swap_buffer_blocks": 2}),
    ("sglang", {"cpu_capacity_blocks": 10, "tiering": "hicache"}),
    ("sglang", {"cpu_capacity_blocks": 8, "tiering": "hicache", "write_policy": "write_back"}),
    ("sglang", {"cpu_capacity_blocks": 8, "tiering": "hicache",
                "write_policy": "write_through_selective"}),
]


def _ids(arrays) -> list:
    return [a.tolist() for a in arrays]


def _stream(seed: int, policy: str, kw: dict) -> list:
    """A random agentic op stream (prompts re-sending and extending earlier ones, request
    ends, evictions, CPU loads) and everything each op returned, plus the tree after it."""
    rng = random.Random(seed)
    cache = RadixKVCache(rng.randint(8, 32), policy, debug=rng.random() < 0.5, **kw)
    universe, history, locked, log = Universe(), [], [], []
    for _ in range(rng.randint(5, 40)):
        kind = rng.randrange(4)
        if kind == 0 or not history:
            base = history[rng.randrange(len(history))] if history else []
            choices = base[: rng.randint(0, len(base))] + \
                [rng.randrange(3) for _ in range(rng.randint(1, 12))]
            history.append(choices)
            ids = universe.prompt(choices)
            m = cache.match(ids)
            entry = ["match", m.matched_blocks, m.hit_blocks, [list(map(int, s)) for s in
                                                               m.segments]]
            room = cache.make_room(len(ids))
            entry += [room.ok, room.freed_blocks, room.deleted_blocks, room.demoted_blocks,
                      room.holes_made, _ids(room.freed)]
            lock = rng.random() < 0.6
            try:
                ins = cache.insert(ids, lock=lock)
            except CapacityError as e:
                entry.append(f"capacity: {e}")
            else:
                entry += [ins.new_blocks, ins.filled_blocks, ins.existing_blocks]
                if lock:
                    locked.append(ins.node)
        elif kind == 1 and locked:
            cache.unlock(locked.pop(rng.randrange(len(locked))))
            entry = ["end"]
        elif kind == 2 and kw.get("cpu_capacity_blocks") and history:
            m = cache.match(universe.prompt(history[rng.randrange(len(history))]))
            cache.lock(m.node)  # a load moves a locked match (as the engines do)
            locked.append(m.node)
            ld = cache.load(m.node)
            entry = ["load", ld.ok, ld.loaded_blocks, ld.skipped, ld.demoted_blocks,
                     ld.deleted_blocks, _ids(ld.loaded)]
        else:
            ev = cache.evict(rng.randint(1, 20))
            entry = ["evict", ev.ok, ev.freed_blocks, ev.deleted_blocks, ev.demoted_blocks,
                     ev.holes_made, _ids(ev.freed), _ids(ev.demoted)]
        entry += [counters(cache), structure(cache)]
        log.append(entry)
    return log


def ops(seed: int, count: int) -> dict:
    return {f"{s}/{p}/{i}": _stream(s, p, kw) for s in range(seed, seed + count)
            for i, (p, kw) in enumerate(CACHES)}


# The standard runs: each preset, engine and tiering, a context-editing policy and a fleet
# behind the KV router, on synthetic Claude Code sessions under cache pressure.
TRACE = "synthetic:claude-code?sessions=12"
RUNS = {
    "sglang": ({"gpu_cache": 98304}, "sglang"),
    "penelope": ({"gpu_cache": 98304, "shared_prefix": "auto"}, "penelope"),
    "vllm": ({"gpu_cache": 98304, "engine": "vllm"}, "vllm"),
    "penelope-vllm": ({"gpu_cache": 98304, "engine": "vllm"}, "penelope"),
    "unified": ({"gpu_cache": 65536, "cpu_cache": 65536, "tiering": "unified",
                 "scheduler": "lpm-cpu"}, "penelope"),
    "hicache": ({"gpu_cache": 65536, "cpu_cache": 65536, "tiering": "hicache",
                 "scheduler": "lpm-cpu"}, "sglang"),
    "fleet": ({"gpu_cache": 98304, "replicas": 3, "router": "dynamo-kv", "sessions": 8},
              "penelope"),
    "drop": ({"gpu_cache": 98304, "context": "drop:4"}, "penelope"),  # versioned keys
    "splice": ({"gpu_cache": 98304, "context": "splice:4"}, "sglang"),
}


def standard_runs() -> dict:
    from sim.config import RunConfig
    from sim.run import run

    out = {}
    for name, (fields, preset) in RUNS.items():
        fields = {"trace": TRACE, "max_context": 131072, "sessions": 4, "gaps": "cap:10",
                  **fields}
        res = run(RunConfig.from_flat(**fields).with_preset(preset))
        frame = res.requests.to_csv(index=False, float_format=repr).encode()
        out[name] = {"summary": json.dumps(res.summary, sort_keys=True, default=repr),
                     "requests": hashlib.sha256(frame).hexdigest(), "rows": len(res.requests)}
    return out


def main(argv: list[str]) -> int:
    result = ops(int(argv[1]), int(argv[2])) if argv[0] == "ops" else standard_runs()
    compiled, why = native.current()
    print(json.dumps({"compiled": compiled, "reason": why, "result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
