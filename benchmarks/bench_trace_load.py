"""Load time and peak memory of reading all of ../shared/data/cc-traces (and the npz reload).

Each measurement runs in a fresh child process so its peak RSS (``ru_maxrss``) is its own.
Budget (issue 3): peak RSS under 1 GiB. ``python -m benchmarks.bench_trace_load [--json]``
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cc-traces"
BUDGET_MIB = 1024

_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import traces
t_import = time.perf_counter() - t0
t0 = time.perf_counter()
tr = traces.load_trace(sys.argv[1], shared_prefix="auto", cache_dir=sys.argv[2] or None)
t_load = time.perf_counter() - t0
t0 = time.perf_counter()
for r in range(len(tr)):
    tr.block_ids(r)
t_ids = time.perf_counter() - t0
print(json.dumps({"load_s": t_load, "import_s": t_import, "block_ids_all_s": t_ids,
                  "requests": len(tr), "sessions": len(tr.sessions),
                  "trace_mib": tr.nbytes() / 2**20, "pool_ids": int(tr._pool.shape[0]),
                  "block_refs": int((tr.prompt_tokens // tr.block_size).sum()),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(path: Path, cache_dir: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), cache_dir],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    as_json = "--json" in (argv or [])
    if not DATA.is_dir():
        print("../shared/data/cc-traces is absent: skipped")
        return 0
    with tempfile.TemporaryDirectory() as cache:
        cold = measure(DATA)
        measure(DATA, cache)  # writes the npz
        warm = measure(DATA, cache)
    doc = {"parse": cold, "npz_reload": warm, "budget_mib": BUDGET_MIB}
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        for name, m in (("parse JSON", cold), ("npz reload", warm)):
            print(f"{name:>11}: {m['load_s']:6.2f} s load, peak RSS {m['peak_rss_mib']:6.0f} MiB, "
                  f"trace {m['trace_mib']:.1f} MiB ({m['pool_ids']:,} stored ids for "
                  f"{m['block_refs']:,} block references), all block_ids "
                  f"{m['block_ids_all_s']:.2f} s, {m['requests']:,} requests")
    over = max(cold["peak_rss_mib"], warm["peak_rss_mib"]) > BUDGET_MIB
    if over:
        print(f"peak RSS over the {BUDGET_MIB} MiB budget", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
