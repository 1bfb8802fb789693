"""`make bench`: run every benchmarks/bench_*.py module's `main([])` in name order.

Each benchmark prints its own table; a benchmark that fails is reported and the others still
run; the exit status is 1 if any failed.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
import traceback
from pathlib import Path


def bench_modules() -> list[str]:
    here = Path(__file__).resolve().parent
    # bench_peers runs bench_dynamo and bench_capacity_peer again, as one table
    return [f"benchmarks.{p.stem}" for p in sorted(here.glob("bench_*.py"))
            if p.stem != "bench_peers"]


def main(argv: list[str] | None = None) -> int:
    failed = []
    for name in bench_modules():
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(name)
            entry = getattr(module, "main", None)
            if entry is None:
                print("   (no main(), skipped)")
                continue
            # main(argv) gets [] (defaults, not run_all's own argv); a bare main() nothing
            rc = entry([]) if inspect.signature(entry).parameters else entry()
            if rc:
                failed.append(name)
        except SystemExit as exc:
            if exc.code:
                failed.append(name)
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"== {name} done in {time.perf_counter() - t0:.1f} s\n", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
