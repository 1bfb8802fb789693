"""Small, realistic measured runs written by the tests (traces/measured.py reads them): a
``vllm bench serve --save-result --save-detailed`` JSON with the keys vllm 0.33's
``vllm/benchmarks/serve.py`` writes, and an inference-perf 0.7.0 report folder (its config
YAML and a ``stage_<n>_lifecycle_metrics.json`` shaped as ``reportgen/base.py``
``summarize_requests`` writes it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_vllm_bench(path: Path, n: int = 24, seed: int = 1, **extra) -> dict:
    """A detailed result of ``n`` requests at 4 req/s; returns the document."""
    rng = np.random.default_rng(seed)
    inp = rng.integers(200, 1500, n).tolist()
    out = rng.integers(20, 120, n).tolist()
    start = np.cumsum(rng.exponential(0.25, n)) + 1000.0
    ttft = (0.05 + 0.0002 * np.asarray(inp)).tolist()
    itls = [[0.02 + 0.001 * (k % 3) for k in range(o - 1)] for o in out]
    lat = [t + sum(i) for t, i in zip(ttft, itls, strict=True)]
    doc = {
        "date": "20260801-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
        "model_id": "meta-llama/Llama-3.1-8B", "tokenizer_id": "meta-llama/Llama-3.1-8B",
        "num_prompts": n, "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None,
        "duration": float(max(s + x for s, x in zip(start, lat, strict=True)) - start[0]),
        "completed": n, "failed": 0, "total_input_tokens": sum(inp),
        "total_output_tokens": sum(out), "request_throughput": 1.0, "output_throughput": 1.0,
        "input_lens": inp, "output_lens": out, "ttfts": ttft, "itls": itls, "latencies": lat,
        "start_times": start.tolist(), "errors": [""] * n,
        "generated_texts": ["x"] * n,
        "mean_ttft_ms": 1000 * float(np.mean(ttft)), "median_ttft_ms": 0.0, "p99_ttft_ms": 0.0,
    }
    doc.update(extra)
    path.write_text(json.dumps(doc))
    return doc


IP_CONFIG = """\
api:
  type: completion
  streaming: true
data:
  type: shared_prefix
  shared_prefix:
    num_groups: 4
    num_prompts_per_group: 5
    system_prompt_len: 1000
    question_len: 100
    output_len: 50
    enable_multi_turn_chat: {multi}
load:
  type: constant
  stages:
    - rate: 2
      duration: 20
server:
  type: vllm
  model_name: meta-llama/Llama-3.1-8B
  base_url: http://0.0.0.0:8000
"""


def _summary(mean: float) -> dict:
    return {"mean": mean, "min": mean / 2, "max": mean * 2, "p0.1": mean / 2, "p1": mean / 2,
            "p5": mean / 2, "p10": mean / 2, "p25": mean * 0.8, "median": mean * 0.95,
            "p75": mean * 1.1, "p90": mean * 1.3, "p95": mean * 1.4, "p99": mean * 1.8,
            "p99.9": mean * 1.9}


def write_inference_perf(folder: Path, multi: bool = False) -> Path:
    """A report folder of one stage (2 req/s for 20 s: 40 requests)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(IP_CONFIG.format(multi=str(multi).lower()))
    stage = {
        "benchmark_time_seconds": 21.3,
        "load_summary": {"count": 40, "schedule_delay": _summary(0.001), "send_duration": 19.6,
                         "requested_rate": 2.0, "achieved_rate": 2.04},
        "successes": {
            "count": 40,
            "latency": {"request_latency": _summary(1.2),
                        "normalized_time_per_output_token": _summary(0.024),
                        "time_per_output_token": _summary(0.021),
                        "time_to_first_token": _summary(0.08),
                        "inter_token_latency": _summary(0.021)},
            "throughput": {"input_tokens_per_sec": 2200.0, "output_tokens_per_sec": 94.0,
                           "total_tokens_per_sec": 2294.0, "requests_per_sec": 1.88},
        },
        "failures": {"count": 0, "request_latency": None},
    }
    (folder / "stage_0_lifecycle_metrics.json").write_text(json.dumps(stage))
    (folder / "summary_lifecycle_metrics.json").write_text(json.dumps(stage))
    return folder
