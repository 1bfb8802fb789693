"""Refactor guard: save what the CLI outputs today, and compare it with a later checkout.

    python tests/snapshot.py save LABEL [--out DIR] [--only NAME,...]
    python tests/snapshot.py compare LABEL_A LABEL_B [--out DIR]

``save`` runs every command of ``COMMANDS`` from the repository root through the installed
``kvsim`` of this checkout (``.venv/bin/kvsim``) and keeps, per command, its ``--json``
document (stdout) and a sha1 of every file it wrote under its ``--out`` folder (Parquet
tables by content, so a rewrite of the same rows hashes the same). ``compare`` lists every
command and file whose output differs between two labels. A refactor that is meant to change
no result must compare equal on every entry. The snapshots live outside the repository
(default ``/tmp/kvsim-snapshots``); the trace cache is a fresh folder per save, so nothing
carries over between checkouts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = "synthetic:claude-code?sessions=8"
CC = "../shared/data/cc-traces"
MOONCAKE = "../shared/data/mooncake/synthetic_trace.jsonl.gz"
BASE = ["run", "--trace", TINY, "--max-context", "64k", "--gaps", "tool", "--sessions", "3"]
RUN = [*BASE, "--gpu-cache", "96k"]
PRESSED = ["run", "--trace", TINY, "--max-context", "32k", "--gaps", "tool", "--sessions", "6"]
GPU48, TIERS = ["--gpu-cache", "48k"], ["--gpu-cache", "40k", "--cpu-cache", "32k"]

# name -> argv after ``kvsim``; ``{out}`` is replaced by a fresh folder
COMMANDS: dict[str, list[str]] = {
    **{f"reproduce-{n}": ["reproduce", n, "--quick", "--json"] for n in (
        "figure1", "gpu-only", "ablation", "fcfs", "two-tier", "cpu-sweep", "policies",
        "cache-engineering", "fleet", "pool")},
    "reproduce-policies-vllm": ["reproduce", "policies", "--engine", "vllm", "--quick",
                                "--json"],
    "run-presets": [*RUN, "--preset", "sglang,vllm,penelope", "--json", "--out", "{out}"],
    "run-vllm": [*RUN, "--engine", "vllm", "--preset", "vllm,penelope", "--json", "--out",
                 "{out}"],
    "run-vllm-patch": [*RUN, "--engine", "vllm", "--vllm-patch", "penelope", "--preset",
                       "vllm", "--json", "--out", "{out}"],
    "run-continuum": [*RUN, "--engine", "vllm", "--vllm-patch", "continuum", "--preset",
                      "vllm", "--json", "--out", "{out}"],
    "run-unified": [*BASE, "--gpu-cache", "72k", "--cpu-cache", "48k", "--scheduler", "lpm-cpu",
                    "--preset", "sglang,penelope", "--json", "--out", "{out}"],
    "run-hicache": [*BASE, "--gpu-cache", "72k", "--cpu-cache", "48k", "--tiering", "hicache",
                    "--hicache-write-policy", "write_back", "--preset", "sglang", "--json",
                    "--out", "{out}"],
    "run-context-drop": [*RUN, "--context", "drop:4", "--preset", "penelope", "--json",
                         "--out", "{out}"],
    "run-context-budget": [*RUN, "--context", "budget:16k", "--preset", "penelope", "--json"],
    "run-zoo": [*RUN, "--policy", "memdecay", "--json"],
    "run-oracle": [*RUN, "--policy", "clairvoyant", "--json"],
    **{f"fleet-{r}": [*RUN, "--replicas", "3", "--router", r, "--preset", "penelope",
                      "--json", "--out", "{out}"]
       for r in ("round-robin", "least-load", "session-affinity", "sglang-cache-aware",
                 "dynamo-kv", "llm-d", "preble", "mooncake")},
    "fleet-vllm": [*RUN, "--engine", "vllm", "--replicas", "2", "--router", "dynamo-kv",
                   "--preset", "vllm", "--json"],
    "fleet-pool": [*RUN, "--replicas", "2", "--router", "round-robin", "--pool", "1m",
                   "--preset", "penelope", "--json", "--out", "{out}"],
    "fleet-pool-write-back": [*RUN, "--replicas", "2", "--cpu-cache", "48k", "--tiering",
                              "hicache", "--hicache-write-policy", "write_back", "--pool",
                              "1m", "--pool-write", "write-back", "--preset", "sglang",
                              "--json"],
    # KV events under pressure: lags, both Dynamo index versions, tiers, small pools
    **{f"events-{name}": [*PRESSED, "--replicas", "2", "--router", router, *extra, "--json",
                          "--out", "{out}"]
       for name, router, extra in (
           ("dynamo-lag", "dynamo-kv?event_lag_s=2", [*GPU48, "--preset", "penelope"]),
           ("dynamo-classic-lag", "dynamo-kv?version=classic&event_lag_s=0.5",
            [*GPU48, "--preset", "sglang"]),
           ("llmd-precise-lag", "llm-d?precise=true&event_lag_s=1",
            [*GPU48, "--preset", "vllm"]),
           ("mooncake-lag", "mooncake?event_lag_s=0.25", [*GPU48, "--preset", "penelope"]),
           ("vllm-lag", "dynamo-kv?event_lag_s=1", [*GPU48, "--engine", "vllm", "--preset",
                                                     "penelope"]),
           ("unified", "dynamo-kv?event_lag_s=0.5", [*TIERS, "--preset", "penelope"]),
           ("hicache", "dynamo-kv?version=classic",
            ["--gpu-cache", "40k", "--cpu-cache", "64k", "--tiering", "hicache", "--preset",
             "sglang"]),
           ("hicache-lag", "dynamo-kv?event_lag_s=1",
            ["--gpu-cache", "36k", "--cpu-cache", "96k", "--tiering", "hicache",
             "--hicache-write-policy", "write_back", "--preset", "sglang"]),
           ("pool-small", "dynamo-kv", [*GPU48, "--pool", "24k", "--preset", "penelope"]),
           ("pool-small-write-back", "round-robin",
            [*TIERS, "--tiering", "hicache", "--pool", "24k", "--pool-write", "write-back",
             "--preset", "sglang"]))},
    "mooncake-open": ["run", "--trace", MOONCAKE, "--gpu-cache", "1m", "--preset", "sglang",
                      "--replicas", "2", "--router", "dynamo-kv", "--json"],
    "sweep": ["sweep", "tests/snapshot_sweep.yaml", "--out", "{out}", "-j", "2"],
    "capacity": ["capacity", TINY, "--cache", "64k,256k", "--json"],
    "capacity-fleet": ["capacity", MOONCAKE, "--cache", "256k,1m", "--replicas", "2",
                       "--router", "round-robin", "--pool", "1m", "--json"],
    "trace-stats": ["trace", "stats", CC, "--json"],
}


def _digest(path: Path) -> str:
    if path.suffix == ".parquet":
        import pandas as pd

        return hashlib.sha1(pd.read_parquet(path).to_csv(index=False).encode()).hexdigest()
    return hashlib.sha1(path.read_bytes()).hexdigest()


def save(label: str, root: Path, only: set[str] | None) -> int:
    dest = root / label
    dest.mkdir(parents=True, exist_ok=True)
    kvsim = str(REPO / ".venv" / "bin" / "kvsim")
    cache = tempfile.mkdtemp(prefix="kvsim-snapshot-cache-")
    failures = 0
    for name, argv in COMMANDS.items():
        if only and name not in only:
            continue
        out = Path(tempfile.mkdtemp(prefix=f"kvsim-snapshot-{name}-"))
        shutil.rmtree(out)
        args = [a.replace("{out}", str(out)) for a in argv]
        env = {**os.environ, "KVSIM_CACHE_DIR": cache}
        res = subprocess.run([kvsim, *args], cwd=REPO, env=env, capture_output=True, text=True,
                             check=False)
        doc: dict = {"argv": argv, "exit": res.returncode, "stdout": res.stdout,
                     "files": {}}
        if out.is_dir():
            for f in sorted(out.rglob("*")):
                if f.is_file() and f.suffix != ".png" and f.name != "sweep.lock":
                    doc["files"][str(f.relative_to(out))] = _digest(f)
            shutil.rmtree(out)
        if res.returncode != 0:
            failures += 1
            doc["stderr"] = res.stderr[-4000:]
        (dest / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"{name}: exit {res.returncode}, {len(doc['files'])} files", file=sys.stderr)
    shutil.rmtree(cache, ignore_errors=True)
    return 1 if failures else 0


# Where the shared data lies differs between checkouts (a worktree's ../shared is not the main
# checkout's): the trace paths a document echoes are compared from "shared/" on.
_SHARED_PATH = re.compile(r'"[^"]*/shared/data/')


def _normalized_stdout(text: str) -> object:
    text = _SHARED_PATH.sub('"../shared/data/', text)
    try:
        return json.loads(text)
    except ValueError:
        return text


def compare(a: str, b: str, root: Path) -> int:
    da, db = root / a, root / b
    names = sorted({p.stem for p in da.glob("*.json")} | {p.stem for p in db.glob("*.json")})
    diffs = 0
    for name in names:
        pa, pb = da / f"{name}.json", db / f"{name}.json"
        if not (pa.exists() and pb.exists()):
            print(f"{name}: only in {'A' if pa.exists() else 'B'}")
            diffs += 1
            continue
        x, y = json.loads(pa.read_text()), json.loads(pb.read_text())
        problems = []
        if x["exit"] != y["exit"]:
            problems.append(f"exit {x['exit']} != {y['exit']}")
        if _normalized_stdout(x["stdout"]) != _normalized_stdout(y["stdout"]):
            problems.append("stdout differs")
        for f in sorted(set(x["files"]) | set(y["files"])):
            if x["files"].get(f) != y["files"].get(f):
                problems.append(f"file {f} differs")
        if problems:
            diffs += 1
            print(f"{name}: " + "; ".join(problems))
    print(f"{len(names) - diffs} of {len(names)} identical")
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("label")
    s.add_argument("--only", default="")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    for p in (s, c):
        p.add_argument("--out", default="/tmp/kvsim-snapshots")
    args = ap.parse_args(argv)
    root = Path(args.out)
    if args.cmd == "save":
        return save(args.label, root, set(filter(None, args.only.split(","))) or None)
    return compare(args.a, args.b, root)


if __name__ == "__main__":
    raise SystemExit(main())
