"""The full, resolved configuration of one run. A run is a pure function of (trace, config, seed).

The run's vocabulary in sections: ``traffic`` (what is replayed and how), ``cache`` (model,
hardware and memory), ``policy`` (eviction and scheduling), ``context`` (the strategy),
``engine`` (the engine's own knobs: ``SGLangKnobs`` or ``VllmKnobs``), ``fleet``, ``pool``,
``pd``; seeds, repeats, SLOs and debug stay on ``RunConfig``. The knob types live here, not
in ``sim.engines``, because that package imports this module (each engine reads its own
section, ``cfg.engine``): a vLLM knob cannot be written for SGLang, by construction.

Users see ONE flat vocabulary (CLI flags, sweep keys, ``config.json``, point ids): ``FLAT``
maps each flat name to its section and field, derived from the sections (a field declared with
``option`` carries its command-line option and help); ``RunConfig.from_flat``, ``from_dict``,
``with_fields``, ``value`` and ``to_dict`` speak it. Sizes are tokens. ``from_dict``
validates untrusted input (sweep YAML) and raises ``ConfigError`` (exit status 2) naming the
file and the field; the engine, context and fleet checks are their rooms' (``sim.run.check``
runs them all). Imports no engine, fleet or context package.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from costmodel.registry import unknown
from policies import GRANULARITIES, PRESETS, STARTS, EvictionPolicy, PolicyError, get_policy
from policies.scheduling import SCHEDULERS


class ConfigError(ValueError):
    exit_code = 2

    def __init__(self, where: str, field: str, message: str) -> None:
        super().__init__(f"{where}: field {field!r}: {message}")
        self.where, self.field = where, field
        self._args = (where, field, message)

    def __reduce__(self):  # rebuilt from its arguments when a sweep worker sends it back
        return type(self), self._args


# the vLLM releases the vllm engine models (VllmKnobs.vllm_version; the newest is the default)
VLLM_VERSIONS = ("0.33", "0.34")
# sim.engines.vllm_patch.VLLM_PATCHES's names (this module may not import the engines;
# tests/test_registry.py holds the two equal)
VLLM_PATCH_NAMES = ("none", "penelope", "continuum", "continuum-fixed", "continuum-pins",
                    "continuum-fcfs")
TIERINGS = ("unified", "hicache")
REPLAYS = ("closed", "open")
PD_LINK_SCOPES = ("nic", "pair")
PD_STREAMING = ("off", "layer")
PD_RETURNS = ("none", "output")
ON_OFF = ("on", "off")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")


def option(default: Any, help: str, kind: str | None = None,
           choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None, *,
           name: str | None = None, words: tuple[str, str] | None = None,
           metavar: str | None = None, short: str | None = None, flat: str | None = None,
           derived: bool = False, loader: bool = False, hash: bool | None = None) -> Any:
    """A field with its command-line option (sim/cli/common.py ``config_options`` makes it):
    ``--NAME`` of the flat name (or of ``name``; ``short``: ``-n``), ``help``; ``kind``
    ``count`` (an integer >= 0), ``positive``, ``fraction`` (in (0, 1]), ``size`` (tokens: 4k,
    1m), ``kv_size`` (tokens or bytes of KV), ``slo``, ``gaps``, ``prefix`` (a shared prefix)
    or ``many`` (repeatable: the command combines the values), else the annotation's int or
    float (a bool: a flag); ``choices`` (or a function listing them, called when the option is
    made: no registry loads with this module);
    ``words``: a bool written as its (true, false) word, e.g. on/off. ``flat``: the flat name
    when it is not the field's; ``derived``: unset on the command line unless given (the run
    derives it); ``loader``: an option of every command that loads a trace. A class as
    ``default`` is the field's factory (the engine's knobs, a dict)."""
    meta = {"option": dict(help=help, kind=kind, choices=choices, name=name, words=words,
                           metavar=metavar, short=short, flat=flat, derived=derived,
                           loader=loader)}
    if isinstance(default, type):
        return field(default_factory=default, metadata=meta, hash=hash)
    return field(default=default, metadata=meta, hash=hash)


def _trace_formats() -> tuple[str, ...]:
    from traces import FORMATS

    return tuple(FORMATS)


def _kv_dtypes() -> tuple[str, ...]:
    from costmodel.specs import KV_DTYPE_BITS

    return tuple(KV_DTYPE_BITS)


@dataclass(frozen=True)
class TrafficConfig:
    """What is replayed, and how the clients send it."""

    trace: str = option("synthetic:claude-code", "Trace path(s) (comma-separated) or "
                        "synthetic:NAME[?k=v&...].", short="-t")
    trace_format: str | None = option(None, "Trace format (default: detected).",
                                      choices=_trace_formats, name="format", loader=True)
    select: str | None = option(None, "Keep the K sessions with most requests after the cut "
                                "(ties: trace order), or the first K.",
                                metavar="top-requests:K|first:K", loader=True)
    shared_prefix: int | str | None = option(
        None, "The first N tokens of every session become one prefix shared across sessions "
        "(auto = system + tool tokens of each session).", "prefix", metavar="auto|TOKENS",
        loader=True)
    max_context: int | None = option(None, "A session ends before its first request with a "
                                     "prompt over this.", "size", loader=True)
    # see traces.Trace.gaps
    gaps: str = option("recorded", "Client wait model: every recorded wait, tool waits only, "
                       "recorded waits capped at S seconds, or multiplied by F.", "gaps",
                       metavar="recorded|tool|cap:S|scale:F", loader=True)
    lenient: bool = option(False, "Skip bad records, and unreadable, truncated or empty files "
                           "of a folder; report how many of each.", loader=True)
    trace_cache_dir: str | None = option(
        None, "Folder of npz copies of loaded traces (fast reloads; a changed file or option "
        "loads afresh). [default: $KVSIM_CACHE_DIR, else ~/.cache/kvsim; off: no cache]",
        name="cache_dir", metavar="DIR|off", loader=True)
    rebuild_sessions: bool = option(False, "Mooncake: chain requests into sessions by prefix "
                                    "continuation.", loader=True)
    sessions: int = option(4, "Sessions active at once (closed loop).", short="-n")
    replay: str = option("closed", "closed: a session sends after its reply + recorded gap; "
                         "open: at the recorded send times. [default: open for timestamped "
                         "traces without sessions (Mooncake) and synthetic:prefix-groups, else "
                         "closed]", choices=REPLAYS, derived=True)
    time_scale: float = option(1.0, "Open loop: multiply recorded send times (0.5 = twice the "
                               "request rate).")
    max_concurrency: int = option(0, "Open loop: at most this many requests in flight; one due "
                                  "at the limit waits for a reply (vllm bench serve "
                                  "--max-concurrency); 0: no limit.", "count")
    # None: clients leave it unset -> SGLang assumes ctx - input
    max_new_tokens: int | None = option(None, "Assumed max_new_tokens (default: unset, SGLang "
                                        "reserves up to 4096).")


@dataclass(frozen=True)
class CacheConfig:
    """The model, the hardware and the KV memory of one replica."""

    model: str = option("qwen3-8b", "Model spec (kvsim models lists them) or a Hugging Face "
                        "config.json path (docs/models.md).", short="-m")
    profile: str | None = option(None, "Profile name or file (default "
                                 "kernels-h100_sxm-MODEL).", short="-p")
    gpu_cache: int = option(262_144, "GPU KV capacity per replica in tokens (default 256k; "
                            "with --gpu: what the GPU holds), or bytes of KV per GPU "
                            "(40GiB).", "kv_size", derived=True)
    # a deployment in GPUs (sim/deploy.py): GPU kind, tensor-parallel GPUs per replica and
    # the memory fraction for weights + KV derive gpu_cache and the profile; or the KV
    # budget per GPU in bytes (``40GiB``) that gpu_cache was derived from
    gpu: str | None = option(None, "GPU kind of each replica (H100, H200, B200, ...: "
                             "costmodel/data/gpus.yaml): derives the KV tokens and the time "
                             "profile.")
    tp: int | None = option(None, "--gpu: tensor-parallel GPUs per replica (default 1).",
                            "positive")
    mem_fraction: float | None = option(
        None, "--gpu: share of each GPU's memory for weights and KV (SGLang "
        "--mem-fraction-static; vLLM --gpu-memory-utilization, less activations and CUDA "
        "graphs). Default: the engine's own (docs/engine.md, GPUs).", "fraction")
    gpu_cache_bytes: int | None = None
    cpu_cache: int = option(0, "CPU KV capacity in tokens (two tiers).", "size")
    tiering: str = option("unified", "Two tiers: unified (Penelope: each block in one tier) or "
                          "hicache (SGLang HiCache: host copies, per-tier LRU).",
                          choices=TIERINGS)
    swap_buffer: int = option(1024, "unified: CPU swap buffer (tokens) used when both tiers are "
                              "full.", "size")
    hicache_write_policy: str = option("write_through", "hicache: when device KV is copied to "
                                       "the host tier.", choices=WRITE_POLICIES)
    hicache_load_threshold: int = 10  # tokens: HiCache skips smaller load-backs
    block_size: int = option(64, "The cache's block size in tokens; other trace block sizes "
                             "are mapped.", loader=True)
    kv_dtype: str = option("bf16", "KV cache element type: the model's KV bytes per token "
                           "(transfers, --gpu and --gpu-cache in bytes sizing, kvsim models "
                           "--kv-dtype; docs/hybrid.md).", choices=_kv_dtypes)

    def replica_tp(self, profile_gpus: int) -> int:
        """The TP ranks of one replica priced by a profile of ``profile_gpus`` GPUs: ``tp``
        when given, else the profile's (sim/deploy.py ``replica_tp``)."""
        return int(self.tp) if self.tp is not None else int(profile_gpus)


@dataclass(frozen=True)
class PolicyConfig:
    """ONE of preset | order/evict/granularity | policy (default: penelope), and the
    scheduler."""

    preset: str | None = option(None, "Comma-separated presets (sglang, vllm, penelope); the "
                                "first is the baseline. Default: sglang,vllm,penelope (--engine "
                                "vllm: vllm,penelope) unless another policy option is given.")
    order: str | None = option(None, "Victim order of a composed policy (lru, lfu, mru, fifo, "
                               "or registered).")
    evict: str | None = option(None, "Start position of a composed policy (with "
                               "--granularity, --order).", choices=STARTS.names)
    granularity: str | None = option(None, "Granularity of a composed policy: whole nodes or "
                                     "exact blocks.", choices=GRANULARITIES.names)
    # any of the above, a registered name, or FILE.py:CLASS
    policy: str | None = option(None, "A policy by name (preset, order+start+granularity, "
                                "registered) or FILE.py:CLASS (your own EvictionPolicy "
                                "subclass); repeat to compare. Runs after any --preset.", "many")
    policy_params: dict[str, Any] = option(  # noqa: RUF009 (a dataclass field)
        dict, "Parameter of a --policy class, e.g. --policy-param tau_s=5 (the one --policy "
        "that takes it) or ttl.tau_s=5 / FILE.py:CLASS.k=v (that policy); repeatable; typed "
        "like the class's default.", "many", name="policy_param", metavar="[POLICY.]K=V",
        hash=False)
    scheduler: str = option("fcfs", "Queue order: fcfs (the default of SGLang 0.5.23 and vLLM "
                            "0.33, the only one vLLM has), lpm (longest cached prefix first: "
                            "the paper's runs and kvsim reproduce), lpm-cpu (counts the "
                            "CPU-resident prefix too), program-fcfs (by the session's first "
                            "arrival: Continuum).", choices=SCHEDULERS.names)

    @property
    def spec(self) -> str:
        """What ``policies.get_policy`` is given: the one way this config chose a policy."""
        if self.policy is not None:
            return self.policy
        if self.preset is not None:
            return self.preset
        if (self.order, self.evict, self.granularity) != (None, None, None):
            return f"{self.order or 'lru'}+{self.evict or 'tail'}+{self.granularity or 'node'}"
        return "penelope"

    def make(self) -> EvictionPolicy:
        """A fresh policy instance for one run."""
        return get_policy(self.spec, self.policy_params)

    @property
    def label(self) -> str:
        """The policy's name in tables and output folders (from the fields, never a default
        label): a preset's name, ``order+start+granularity``, or a class name with the
        parameters that differ from their defaults."""
        return self.make().label

    @property
    def chosen_by(self) -> str:
        """The field that chose the policy (for error messages)."""
        return next((k for k in ("preset", "policy", "order", "evict", "granularity")
                     if getattr(self, k)), "policy")


@dataclass(frozen=True)
class ContextConfig:
    """How each session manages its history on purpose (sim.context): full | trim:K |
    summarize:T:S | drop:K[+repos] | splice:K | budget:B."""

    strategy: str = option("full", "How each session manages its history: full, trim:K, "
                           "summarize:T:S, drop:K, drop:K+repos, splice:K, budget:B "
                           "(docs/cache-engineering.md; sglang engine). kvsim prices serving "
                           "only, not task accuracy.", metavar="STRATEGY", flat="context")


@dataclass(frozen=True)
class EngineKnobs:
    """The knobs every engine has; each engine's section adds its own (``name`` is the
    engine's, a class attribute: the knobs type is the engine choice)."""

    name: ClassVar[str]
    chunk_size: int = option(8192, "Prefill tokens per pass: SGLang chunked_prefill_size; "
                             "vllm: max_num_batched_tokens, one step's budget shared by decode "
                             "and prefill chunks (8192: both servers' H100 defaults).", "size")
    # None: the engine's default (SGLang's is never reached at small N)
    max_running: int | None = option(None, "Most requests running at once (default: the "
                                     "engine's: SGLang's max_running_requests, large; vLLM's "
                                     "max_num_seqs, 1024).")

    @property
    def label(self) -> str:
        """The engine as tables and reports name it."""
        return self.name

    def validate(self, bad: Callable[[str, str], ConfigError]) -> None:
        """The knobs' own values (the sizes are checked with the run's block size)."""


@dataclass(frozen=True)
class SGLangKnobs(EngineKnobs):
    """SGLang 0.5.23's server arguments and scheduler constants."""

    name: ClassVar[str] = "sglang"
    # SGLang inserts each finished chunk into the tree (cache_unfinished_req). False: one node
    # per prompt, which makes whole-node eviction far coarser.
    checkpoint_chunks: bool = option(True, "chunked: each prefill chunk enters the tree as it "
                                     "finishes (SGLang), so nodes hold <= chunk-size tokens; "
                                     "whole: a prompt enters once done.",
                                     name="prompt_nodes", words=("chunked", "whole"))
    hybrid_swa_memory: bool = option(True, "A model of full and sliding-window layers (gpt-oss-"
                                     "120b): on keeps it in SGLang's hybrid radix tree (full and "
                                     "SWA pools); off in one pool of every layer (SGLang's "
                                     "--disable-hybrid-swa-memory, what it always does for "
                                     "Gemma 3). See docs/hybrid.md.", words=ON_OFF)
    clip_max_new_tokens: int = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    new_token_ratio: float = 0.7
    new_token_ratio_min: float = 0.098
    new_token_ratio_decay_steps: int = 600


@dataclass(frozen=True)
class VllmKnobs(EngineKnobs):
    """vLLM 0.33's server arguments (chunk_size: max_num_batched_tokens; max_running:
    max_num_seqs) and the named patch of its code."""

    name: ClassVar[str] = "vllm"
    vllm_async: bool = option(True, "--engine vllm: async scheduling, vLLM 0.33's default for "
                              "an online server (the next step is scheduled before the step "
                              "in flight is processed); off: the synchronous Scheduler. See "
                              "docs/engine.md.", words=ON_OFF)
    vllm_patch: str = option("none", "--engine vllm: a named patch of vLLM's code. penelope: "
                             "the lookup goes on past missing blocks and refills them in the "
                             "request's step (Penelope's holes; docs/engine.md). continuum: "
                             "Continuum's TTL pins (learned TTL) and program-level FCFS; "
                             "continuum-fixed: the same with its public code's 2 s threshold; "
                             "continuum-pins / continuum-fcfs: either change alone "
                             "(docs/policies.md).", choices=VLLM_PATCH_NAMES)
    vllm_version: str = option("0.34", "--engine vllm: the release modelled. Its scheduler and "
                               "block pool are the same in both; the deployed defaults differ "
                               "(0.34: 64-token blocks, KV sized with gpu_memory_utilization "
                               "1.0 by its extensible cache; 0.33: 16 and 0.92; --block-size "
                               "stays as given). See docs/engine.md.", choices=VLLM_VERSIONS)
    vllm_cache_aware_window: int = option(
        0, "--engine vllm (0.34): cache-aware admission (--cache-aware-admission-window): once "
        "KV usage reaches --vllm-cache-aware-threshold, the first N waiting requests are "
        "admitted deepest cached prefix first; 0: off, vLLM's default.", "count", metavar="N")
    vllm_cache_aware_threshold: float = option(
        0.5, "--engine vllm: the KV usage (1 - free/total blocks) from which "
        "--vllm-cache-aware-window reorders (vLLM's --cache-aware-admission-threshold).")

    def __post_init__(self) -> None:
        # a sweep file's unquoted `vllm_version: 0.34` is a YAML number: the release it names
        v = self.vllm_version
        if isinstance(v, float) and f"{v:g}" in VLLM_VERSIONS:
            object.__setattr__(self, "vllm_version", f"{v:g}")

    @property
    def label(self) -> str:
        """``vllm+penelope-patch`` when patched."""
        return self.name if self.vllm_patch == "none" else f"{self.name}+{self.vllm_patch}-patch"

    def validate(self, bad: Callable[[str, str], ConfigError]) -> None:
        if not isinstance(self.vllm_patch, str) or self.vllm_patch not in VLLM_PATCH_NAMES:
            raise bad("vllm_patch", unknown("vLLM patch", self.vllm_patch, VLLM_PATCH_NAMES))
        if not isinstance(self.vllm_async, bool):
            raise bad("vllm_async", f"must be on or off (true or false), got "
                      f"{self.vllm_async!r}")
        if self.vllm_version not in VLLM_VERSIONS:
            raise bad("vllm_version", unknown("vLLM version", self.vllm_version, VLLM_VERSIONS))
        w, t = self.vllm_cache_aware_window, self.vllm_cache_aware_threshold
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise bad("vllm_cache_aware_window", f"must be an integer >= 0 (0: off), got {w!r}")
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= 1:
            raise bad("vllm_cache_aware_threshold", f"must be in [0, 1], got {t!r}")
        if w and self.vllm_version != "0.34":
            raise bad("vllm_cache_aware_window", "cache-aware admission is new in vLLM 0.34 "
                      f"(vllm_version is {self.vllm_version!r}): use --vllm-version 0.34")


# the engines by name (sim.engines.ENGINES holds their classes under the same names): a new
# engine is its knobs class here and its server class there
KNOBS: dict[str, type[EngineKnobs]] = {k.name: k for k in (SGLangKnobs, VllmKnobs)}


@dataclass(frozen=True)
class FleetConfig:
    """N replicas of the engine behind a router (sim.fleet)."""

    # 1 without a router: one server (no fleet layer at all)
    replicas: int = option(1, "Replicas of the engine behind a router, on one clock "
                           "(docs/fleet.md).", "positive")
    router: str | None = option(None, "Router of a fleet: round-robin (default with --replicas "
                                "> 1), random, least-load, power-of-two, session-affinity, the "
                                "field's routers, or FILE.py:CLASS (your own Router subclass).")
    router_params: dict[str, Any] = option(  # noqa: RUF009 (a dataclass field)
        dict, "Parameter of the --router class (repeatable; typed like its default).", "many",
        name="router_param", metavar="K=V", hash=False)


@dataclass(frozen=True)
class PoolConfig:
    """A KV pool shared by the replicas (sim/fleet/pooltier.py; size 0: none): tokens, GB/s
    and microseconds per fetch on each replica's link, entry policy, Mooncake Store's
    eviction."""

    size: int = option(0, "A KV pool of SIZE tokens shared by the replicas (sglang engine; "
                       "docs/fleet.md 'Shared KV pool'); 0: none.", "size", metavar="SIZE",
                       flat="pool")
    pool_bandwidth: float = option(25.0, "Each replica's link to the pool, GB/s.",
                                   metavar="GB/S")
    pool_latency_us: float = option(50.0, "Latency of one pool fetch, microseconds.")
    pool_write: str = option("write-through", "write-through: blocks enter the pool when a "
                             "replica computes them; write-back: when a replica drops them "
                             "(from its CPU tier if it has one).",
                             choices=("write-through", "write-back"))
    pool_watermark: float = option(0.90, "Pool occupancy that starts an eviction pass.")
    pool_evict_fraction: float = option(0.05, "Share of the pool's blocks one eviction pass "
                                        "drops (LRU, leased skipped).")


def _link_names() -> tuple[str, ...]:
    from costmodel.links import link_names

    return tuple(link_names())


def _pd_rule_names() -> tuple[str, ...]:
    from policies.pd_rules import PD_RULES

    return tuple(PD_RULES.names())


@dataclass(frozen=True)
class PDConfig:
    """Disaggregation (sim/fleet/pd.py, docs/pd.md): P prefill workers and D decode workers
    of the engine instead of replicas; both 0: aggregated."""

    prefill_replicas: int = option(0, "Prefill workers of a disaggregated fleet (with "
                                   "--decode-replicas; the prefill worker is chosen by "
                                   "--router).", "count")
    decode_replicas: int = option(0, "Decode workers of a disaggregated fleet.", "count")
    pd_link: str = option("rdma-400", "The link KV travels over, prefill -> decode "
                          "(costmodel/data/links.yaml; ideal: no time).", choices=_link_names)
    pd_link_scope: str = option("nic", "One FIFO per prefill worker's NIC, or per (prefill, "
                                "decode) pair.", choices=PD_LINK_SCOPES)
    pd_streaming: str = option("off", "layer: the transfer starts with the prefill, layer by "
                               "layer.", choices=PD_STREAMING)
    pd_local_threshold: int = option(0, "Conditional disaggregation: prefill on the decode "
                                     "worker when fewer uncached tokens than this (0: "
                                     "never).", "size")
    decode_cache: str = option("on", "Decode workers keep finished requests' KV as a prefix "
                               "cache.", choices=ON_OFF)
    pd_return: str = option("none", "output: a finished request's output KV goes back to its "
                            "prefill worker over the link.", choices=PD_RETURNS)
    pd_rule: str = option("disagg", "How a request picks its decode worker and whether it is "
                          "prefilled there (policies/pd_rules.py).", choices=_pd_rule_names)
    pd_prealloc: str = option("on", "on: the decode worker pre-allocates the KV before the "
                              "transfer, as the engines do (SGLang's prealloc queue, vLLM's "
                              "WAITING_FOR_REMOTE_KVS); off: the KV lands unreserved (sglang "
                              "only).", choices=ON_OFF)


RUN = "run"  # FLAT's section of the fields kept on RunConfig itself


def _default(f: Any) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


@dataclass(frozen=True)
class RunConfig:
    """One run's configuration in sections (module docstring); ``from_flat`` builds it
    from the flat vocabulary users write."""

    traffic: TrafficConfig = field(default_factory=TrafficConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    # the server's request protocol, scheduler and memory semantics: its knobs' type is the
    # engine (sglang: SGLang 0.5.23, vllm: vLLM 0.33; docs/engine.md); option() makes the field
    engine: EngineKnobs = option(SGLangKnobs,  # noqa: RUF009 (a dataclass field) "The server: sglang (SGLang 0.5.23: radix tree, "
                                 "chunk nodes, admission with decode reservations) or vllm "
                                 "(vLLM 0.33: prefix-caching block pool, V1 token-budget "
                                 "steps, preemption by recompute; GPU only, policies vllm and "
                                 "penelope). See docs/engine.md.", choices=lambda: tuple(KNOBS))
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    pd: PDConfig = field(default_factory=PDConfig)
    seed: int = option(0, "Seed of synthetic generators (kvsim run: also of the run's "
                       "decisions, router ties and random victims; --trace-seed keeps the "
                       "trace).", "count", loader=True)
    # the trace's own seed (a synthetic generator's draws); None: ``seed``, as before the
    # two were apart. ``seed`` then drives only the run's decisions (router, policy ties).
    trace_seed: int | None = option(None, "Seed of a synthetic trace's draws (default: "
                                    "--seed).", "count")
    # the summary is their mean with a 95% interval per metric (sim/run/repeats.py)
    repeats: int = option(1, "Independent repeats (decision seeds seed..seed+N-1, the trace "
                          "fixed): mean and 95% interval per metric.", "positive")
    # service-level objectives (sim/slo.py); None: none
    slo: str | None = option(None, "SLOs for goodput: per request ttft=2s,tpot=50ms,itl=,e2e=; "
                             "per run ttft_p90=1s (p50, p90, p99, mean); attain=0.9; a bare "
                             "number is ms, as in vllm bench serve --goodput (docs/engine.md).",
                             "slo", metavar="KEY=VALUE,...")
    debug_cache: bool = option(False, "Recount cache invariants after every op; check the "
                               "engine never idles with a request waiting.")
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    # --- the flat vocabulary ---------------------------------------------------------------
    @classmethod
    def from_flat(cls, where: str = "config", /, **flat: Any) -> RunConfig:
        """The config of flat fields (``FLAT``'s names; the rest default). A knob of another
        engine than ``engine`` is refused unless it is that knob's default (ConfigError)."""
        for k in flat:
            if k not in FLAT:
                raise TypeError(f"RunConfig has no field {k!r}")
        name = flat.get("engine", "sglang")
        knobs = KNOBS.get(name) if isinstance(name, str) else None
        if knobs is None:
            raise ConfigError(where, "engine", unknown("engine", name, tuple(KNOBS)))
        own = {f.name for f in fields(knobs)}
        parts: dict[str, dict[str, Any]] = {}
        for k, v in flat.items():
            section, f = FLAT[k]
            if k == "engine":
                continue
            if section == "engine" and f not in own:
                if v == DEFAULTS[k] and type(v) is type(DEFAULTS[k]):
                    continue  # the other engine's default: what the flat config always held
                owner = next(n for n, c in KNOBS.items() if f in {g.name for g in fields(c)})
                raise ConfigError(where, k, f"is a knob of the {owner} engine, not of "
                                  f"{name!r}: use --engine {owner} (or drop {k})")
            parts.setdefault(section, {})[f] = v
        run = parts.pop(RUN, {})
        built = {s: SECTIONS[s](**kw) for s, kw in parts.items() if s != "engine"}
        return cls(engine=knobs(**parts.get("engine", {})), **built, **run)

    @classmethod
    def from_dict(cls, raw: Any, where: str = "config") -> RunConfig:
        """A validated config of flat fields (a sweep point, a config.json)."""
        if not isinstance(raw, dict):
            raise ConfigError(where, "<root>", "must be a mapping")
        raw = dict(raw)
        raw.pop("policy_label", None)  # written by to_dict, derived
        raw.pop("policy_source_sha1", None)
        raw.pop("router_source_sha1", None)
        for k in raw:
            if k not in FLAT:
                raise ConfigError(where, k, "unknown field")
        return cls.from_flat(where, **raw).validate(where)

    def value(self, name: str) -> Any:
        """The flat field ``name`` (another engine's knob reads as its default)."""
        section, f = FLAT[name]
        if section == RUN:
            return getattr(self, f)
        return getattr(getattr(self, section), f, DEFAULTS[name])

    def flat(self) -> dict[str, Any]:
        """Every flat field, in ``FLAT``'s order (the mappings are this config's own)."""
        return {name: self.value(name) for name in FLAT}

    def with_fields(self, **flat: Any) -> RunConfig:
        """The same config with the flat fields ``flat`` changed. Switching ``engine``
        keeps the knobs both engines have and leaves the old engine's own ones behind."""
        name = flat.get("engine", self.engine.name)
        own = {f.name for f in fields(KNOBS[name])} if name in KNOBS else set()
        d = {k: v for k, v in self.flat().items()
             if k in flat or FLAT[k][0] != "engine" or k == "engine" or FLAT[k][1] in own}
        d.update(flat)
        return type(self).from_flat(**d)

    # --- policy ---------------------------------------------------------------------------
    @property
    def policy_spec(self) -> str:
        """What ``policies.get_policy`` is given: the one way this config chose a policy."""
        return self.policy.spec

    def make_policy(self) -> EvictionPolicy:
        """A fresh policy instance for one run."""
        return self.policy.make()

    @property
    def policy_label(self) -> str:
        """The policy's name in tables and output folders (``PolicyConfig.label``)."""
        return self.make_policy().label

    @property
    def policy_field(self) -> str:
        """The field that chose the policy (for error messages)."""
        return self.policy.chosen_by

    def with_preset(self, preset: str) -> RunConfig:
        """The same config under a preset (``sglang``, ``vllm``, ``penelope``)."""
        if preset not in PRESETS:
            raise ConfigError("--preset", "preset", PRESETS.message(preset))
        return self.with_fields(preset=preset, order=None, evict=None, granularity=None,
                                policy=None, policy_params={})

    def with_policy(self, policy: str, params: dict[str, Any] | None = None) -> RunConfig:
        """The same config under any policy ``get_policy`` accepts."""
        return self.with_fields(preset=None, order=None, evict=None, granularity=None,
                                policy=policy, policy_params=dict(params or {}))

    # --- checks ---------------------------------------------------------------------------
    def validate(self, where: str = "config") -> RunConfig:
        """This config's own fields (names, sizes, seeds, answers); what its engine, context
        strategy and fleet can run is theirs to say (sim/run/check.py asks them)."""

        def bad(f: str, msg: str) -> ConfigError:
            return ConfigError(where, f, msg)

        t, c, k = self.traffic, self.cache, self.engine
        if self.policy.scheduler not in SCHEDULERS:
            raise bad("scheduler", SCHEDULERS.message(self.policy.scheduler))
        if c.tiering not in TIERINGS:
            raise bad("tiering", f"must be one of {TIERINGS}, got {c.tiering!r}")
        if t.replay not in REPLAYS:
            raise bad("replay", f"must be one of {REPLAYS}, got {t.replay!r}")
        mc = t.max_concurrency
        if isinstance(mc, bool) or not isinstance(mc, int) or mc < 0:
            raise bad("max_concurrency", f"must be an integer >= 0 (0: no limit), got {mc!r}")
        if mc and t.replay != "open":
            raise bad("max_concurrency", "caps the open loop's requests in flight: use "
                      "replay: open (a closed loop is capped by sessions)")
        if t.replay == "closed" and isinstance(t.trace, str) and _sets_rates(t.trace):
            raise bad("replay", f"{t.trace}: the closed loop would ignore its qps (arrival "
                      "rates): add --replay open (replay: open; this trace's default) or drop "
                      "qps")
        self._validate_policy(bad)
        if type(k).validate is not EngineKnobs.validate:
            k.validate(bad)
        for name, v in (("sessions", t.sessions), ("gpu_cache", c.gpu_cache),
                        ("chunk_size", k.chunk_size), ("block_size", c.block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise bad(name, f"must be a positive integer, got {v!r}")
        if c.gpu_cache < 4 * c.block_size:
            raise bad("gpu_cache", "must hold at least 4 blocks")
        if c.cpu_cache < 0:
            raise bad("cpu_cache", "must be >= 0")
        if c.cpu_cache and c.cpu_cache < c.block_size:
            raise bad("cpu_cache", "must hold at least one block (or be 0: GPU only)")
        if c.hicache_write_policy not in WRITE_POLICIES:
            raise bad("hicache_write_policy", f"must be one of {WRITE_POLICIES}")
        if c.swap_buffer < c.block_size:
            raise bad("swap_buffer", "must hold at least one block")
        if k.chunk_size < c.block_size:
            raise bad("chunk_size", "must be at least one block")
        if not (isinstance(t.time_scale, int | float) and t.time_scale > 0):
            raise bad("time_scale", f"must be a number > 0, got {t.time_scale!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise bad("seed", f"must be an integer >= 0, got {self.seed!r}")
        if k.max_running is not None and k.max_running < 1:
            raise bad("max_running", "must be >= 1")
        if t.max_new_tokens is not None and t.max_new_tokens < 1:
            raise bad("max_new_tokens", "must be >= 1")
        self._validate_answers(bad)
        return self

    def _validate_answers(self, bad) -> None:
        ts = self.trace_seed
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int) or ts < 0):
            raise bad("trace_seed", f"must be an integer >= 0, got {ts!r}")
        r = self.repeats
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise bad("repeats", f"must be an integer >= 1, got {r!r}")
        tp = self.cache.tp
        if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or tp < 1):
            raise bad("tp", f"must be a positive integer, got {tp!r}")
        mf = self.cache.mem_fraction
        if mf is not None and (isinstance(mf, bool) or not isinstance(mf, int | float)
                               or not 0 < mf <= 1):
            raise bad("mem_fraction", f"must be in (0, 1], got {mf!r}")
        if self.cache.gpu is not None:
            from costmodel.gpus import get_gpu

            try:
                get_gpu(str(self.cache.gpu))
            except KeyError as e:
                raise bad("gpu", str(e.args[0])) from None
        if self.slo is not None:
            from sim.slo import SLOError, parse_slo

            try:
                parse_slo(self.slo)
            except SLOError as e:
                raise bad("slo", str(e)) from None

    def _validate_policy(self, bad) -> None:
        p = self.policy
        components = [k for k in ("order", "evict", "granularity") if getattr(p, k)]
        chosen = [k for k, v in (("preset", p.preset), ("policy", p.policy)) if v]
        if components:
            chosen.append("/".join(components))
        if len(chosen) > 1:
            raise bad(chosen[1].split("/")[0], f"conflicts with {chosen[0]!r}: choose a policy "
                      "one way (preset, order/evict/granularity, or policy)")
        if p.preset is not None and p.preset not in PRESETS:
            raise bad("preset", PRESETS.message(p.preset))
        if p.evict is not None and p.evict not in STARTS:
            raise bad("evict", STARTS.message(p.evict))
        if p.granularity is not None and p.granularity not in GRANULARITIES:
            raise bad("granularity", GRANULARITIES.message(p.granularity))
        if not isinstance(p.policy_params, dict):
            raise bad("policy_params", "must be a mapping of parameter names to values")
        if p.policy_params and p.policy is None:
            raise bad("policy_params", "only a 'policy' takes parameters")
        try:
            self.make_policy()
        except PolicyError as e:
            raise bad(chosen[0].split("/")[0] if chosen else "policy", str(e)) from None

    # --- derived --------------------------------------------------------------------------
    @property
    def trace_draw_seed(self) -> int:
        """The seed the trace is loaded (a synthetic one drawn) with."""
        return self.seed if self.trace_seed is None else self.trace_seed

    @property
    def is_fleet(self) -> bool:
        """Replicas behind a router (``sim.fleet``); False: today's single server."""
        return self.fleet.replicas != 1 or self.fleet.router is not None or bool(self.pool.size)

    @property
    def is_pd(self) -> bool:
        """Prefill and decode pools (``sim.fleet.pd``) instead of replicas."""
        return bool(self.pd.prefill_replicas or self.pd.decode_replicas)

    def make_router(self):
        """A fresh router for one fleet run (``policies.routing.get_router``)."""
        from policies.routing import get_router

        return get_router(self.fleet.router or "round-robin", self.fleet.router_params)

    @property
    def engine_label(self) -> str:
        """The engine as tables and reports name it: ``vllm+penelope-patch`` when patched."""
        return self.engine.label

    def to_dict(self) -> dict[str, Any]:
        """Every flat field plus the resolved policy label (the run's identity in sweeps)
        and, for a policy file, a digest of its source (an edited file is a different
        policy)."""
        flat = self.flat()
        d = copy.deepcopy({k: flat[k] for k in sorted(flat, key=lambda k: _JSON_ORDER.get(
            k, len(_JSON_ORDER)))})
        if not self.is_pd:  # aggregated runs: their config.json stays as it was
            for k in PD_FIELDS:
                del d[k]
        d["policy_label"] = self.policy_label
        path, _, rest = self.policy_spec.partition("?")[0].rpartition(":")
        if rest and path.endswith(".py"):
            d["policy_source_sha1"] = hashlib.sha1(Path(path).read_bytes()).hexdigest()
        rpath, _, rrest = (self.fleet.router or "").partition("?")[0].rpartition(":")
        if rrest and rpath.endswith(".py"):
            d["router_source_sha1"] = hashlib.sha1(Path(rpath).read_bytes()).hexdigest()
        return d


SECTIONS: dict[str, type] = {"traffic": TrafficConfig, "cache": CacheConfig,
                             "policy": PolicyConfig, "context": ContextConfig,
                             "fleet": FleetConfig, "pool": PoolConfig, "pd": PDConfig}


def _vocabulary() -> dict[str, tuple[str, Any]]:
    """Each flat name's section and dataclass field, in RunConfig's field order: a section's
    fields (named as ``option(flat=...)`` says, else as the field), the engine's name and then
    every engine's knobs (``KNOBS``; a knob engines share once), RunConfig's own fields."""
    out: dict[str, tuple[str, Any]] = {}
    for f in fields(RunConfig):
        section = f.name if f.name in SECTIONS or f.name == "engine" else RUN
        members = ([f, *(g for k in KNOBS.values() for g in fields(k))] if section == "engine"
                   else fields(SECTIONS[section]) if section != RUN else [f])
        for g in members:
            out.setdefault((g.metadata.get("option") or {}).get("flat") or g.name, (section, g))
    return out


# flat name -> (section, dataclass field): the one vocabulary (CLI options, sweep keys,
# config.json); FLAT names the field (the engine's ``name`` picks the knobs' class)
FIELDS: dict[str, tuple[str, Any]] = _vocabulary()
FLAT: dict[str, tuple[str, str]] = {n: (s, "name" if n == "engine" else f.name)
                                    for n, (s, f) in FIELDS.items()}
# config.json's key order, frozen as files have always been written (so that a new one diffs
# line by line with an old one and reruns compare byte for byte); a name added since comes
# after these, in FLAT's order. Never extended: a new field needs no edit here.
_JSON_ORDER = {n: i for i, n in enumerate((
    "trace", "trace_format", "select", "shared_prefix", "max_context", "block_size", "gaps",
    "lenient", "trace_cache_dir", "rebuild_sessions", "sessions", "replay", "time_scale",
    "max_concurrency", "model", "profile", "gpu_cache", "gpu", "tp", "mem_fraction",
    "gpu_cache_bytes", "kv_dtype", "cpu_cache", "tiering", "swap_buffer", "hicache_write_policy",
    "hicache_load_threshold", "engine", "vllm_patch", "vllm_version",
    "vllm_cache_aware_window", "vllm_cache_aware_threshold", "preset", "order", "evict",
    "granularity", "policy", "policy_params", "scheduler", "context", "chunk_size",
    "checkpoint_chunks", "max_running", "vllm_async", "max_new_tokens", "clip_max_new_tokens",
    "new_token_ratio", "new_token_ratio_min", "new_token_ratio_decay_steps", "replicas",
    "router", "router_params", "pool", "pool_bandwidth", "pool_latency_us", "pool_write",
    "pool_watermark", "pool_evict_fraction", "prefill_replicas", "decode_replicas", "pd_link",
    "pd_link_scope", "pd_streaming", "pd_local_threshold", "decode_cache", "pd_return",
    "pd_rule", "pd_prealloc", "seed", "trace_seed", "repeats", "slo", "debug_cache", "extra"))}
# each flat field's default (a knob's is its engine's; engines agree on shared knobs)
DEFAULTS: dict[str, Any] = {n: _default(f) for n, (_, f) in FIELDS.items()}
DEFAULTS["engine"] = DEFAULTS["engine"].name


@dataclass(frozen=True)
class IdleRule:
    """Fields that do nothing in a run where ``idle(cfg)`` holds. ``why`` says so, naming
    other fields as ``{field}`` (spelt as the caller names options: ``--cpu-cache`` on the
    command line, ``cpu_cache`` in a sweep file)."""

    fields: tuple[str, ...]
    idle: Callable[[RunConfig], bool]
    why: str | Callable[[RunConfig], str]  # a callable: the text names a value of the run


PD_FIELDS = tuple(f.name for f in fields(PDConfig))
_CPU_TIER = ("tiering", "hicache_write_policy", "swap_buffer")
_POOL = ("pool_bandwidth", "pool_latency_us", "pool_write", "pool_watermark",
         "pool_evict_fraction")
# One rule per way an option can do nothing; the first rule that names a field decides.
IDLE_RULES: tuple[IdleRule, ...] = (
    IdleRule(_CPU_TIER, lambda c: isinstance(c.engine, VllmKnobs), "{engine} vllm has no CPU tier"),
    IdleRule(_CPU_TIER, lambda c: not c.cache.cpu_cache,
             "it configures the CPU tier: add {cpu_cache}"),
    IdleRule(("hicache_write_policy",), lambda c: c.cache.tiering != "hicache",
             "it is for {tiering} hicache"),
    IdleRule(("swap_buffer",), lambda c: c.cache.tiering != "unified",
             "it is for {tiering} unified"),
    IdleRule(("time_scale",), lambda c: c.traffic.replay != "open",
             "it scales recorded send times: add {replay} open"),
    IdleRule(("max_concurrency",), lambda c: c.traffic.replay != "open",
             "it caps the open loop's requests in flight (a closed loop is capped by "
             "{sessions}): add {replay} open"),
    IdleRule(("sessions", "gaps"), lambda c: c.traffic.replay == "open",
             "the open loop sends every request at its recorded time (no sessions at once, "
             "no gaps): add {replay} closed"),
    IdleRule(_POOL, lambda c: not c.pool.size, "it configures the shared KV pool: add {pool}"),
    IdleRule(("router",), lambda c: not c.is_pd and c.fleet.replicas == 1,
             "one replica has nothing to route between: add {replicas} N"),
    # A disaggregated fleet's router picks the prefill worker (the PD rule the decode one).
    IdleRule(("router",), lambda c: c.is_pd and c.pd.prefill_replicas == 1,
             "it picks the prefill worker and one has nothing to choose from (the PD "
             "rule, {pd_rule}, picks the decode worker): add {prefill_replicas} N"),
    IdleRule(PD_FIELDS[2:], lambda c: not c.is_pd,
             "it configures a disaggregated fleet: add {prefill_replicas} P "
             "{decode_replicas} D"),
    IdleRule(("pd_local_threshold",), lambda c: not _pd_rule_uses_threshold(c.pd.pd_rule),
             lambda c: f"the PD rule {c.pd.pd_rule.replace('{', '{{').replace('}', '}}')} "
             "always disaggregates: use {pd_rule} disagg, dynamo or llm-d"),
    IdleRule(("pd_streaming", "pd_link_scope"), lambda c: c.pd.pd_link == "ideal",
             "the ideal link takes no time (nothing streams, nothing queues): give {pd_link}"),
    IdleRule(("pd_link_scope",), lambda c: c.pd.decode_replicas == 1,
             "with one decode worker each NIC carries one pair: add {decode_replicas} D"),
    IdleRule(("vllm_async", "vllm_version", "vllm_cache_aware_window",
              "vllm_cache_aware_threshold"), lambda c: not isinstance(c.engine, VllmKnobs),
             "it is a mode of vLLM's scheduler: add {engine} vllm"),
    IdleRule(("vllm_cache_aware_threshold",),
             lambda c: not c.value("vllm_cache_aware_window"),
             "it is the KV usage from which cache-aware admission reorders the waiting "
             "queue: add {vllm_cache_aware_window} N"),
    IdleRule(("tp",), lambda c: c.cache.gpu is None and c.cache.gpu_cache_bytes is None,
             "it sizes a deployment in GPUs: add {gpu} (or {gpu_cache} in bytes, e.g. 40GiB)"),
    IdleRule(("mem_fraction",), lambda c: c.cache.gpu is None,
             "it is the share of a GPU's memory for weights and KV: add {gpu}"),
    IdleRule(("mem_fraction",), lambda c: c.cache.gpu_cache_bytes is not None,
             "{gpu_cache} in bytes already gives the KV budget per GPU: drop one"),
)


def _pd_rule_uses_threshold(name: str) -> bool:
    from policies.pd_rules import PD_RULES, PDRuleError

    try:
        return PD_RULES.get(name).uses_threshold
    except PDRuleError:
        return True


def idle_fields(cfg: RunConfig, given: Iterable[str]) -> list[tuple[str, str]]:
    """``(field, why)`` for every field in ``given`` (the ones a user set) that does nothing
    in ``cfg``, in ``IDLE_RULES`` order; ``why`` keeps its ``{field}`` placeholders."""
    given = set(given)
    out: list[tuple[str, str]] = []
    named: set[str] = set()
    for rule in IDLE_RULES:
        hits = [f for f in rule.fields if f in given and f not in named]
        if hits and rule.idle(cfg):
            why = rule.why(cfg) if callable(rule.why) else rule.why
            out += [(f, why) for f in hits]
            named.update(hits)
    return out


def spell_fields(why: str, spell: Callable[[str], str]) -> str:
    """``why`` with each ``{field}`` written as ``spell(field)``."""
    return why.format_map({name: spell(name) for name in FLAT})


def _sets_rates(trace: str) -> bool:
    """``traces.prefix_groups.sets_rates``; a bad spec is the loader's to report."""
    from traces import OptionError
    from traces.prefix_groups import sets_rates

    try:
        return sets_rates(trace)
    except OptionError:
        return False


def default_replay(trace: str, trace_format: str | None = None) -> str:
    """The replay a trace gets when none is given: ``open`` for Mooncake (each request is
    stamped with its arrival and carries no session, so the closed loop would ignore the
    timestamps) and ``synthetic:prefix-groups`` (a benchmark client's arrival process),
    ``closed`` for every other trace. A trace that cannot be detected here gets ``closed``;
    loading it reports the problem."""
    if trace.startswith("synthetic:"):
        from traces.prefix_groups import is_spec

        return "open" if is_spec(trace) else "closed"
    from traces import TraceFormatError, detect_format

    try:
        fmt = trace_format or detect_format(trace.split(","))
    except (TraceFormatError, OSError):
        return "closed"
    return "open" if fmt == "mooncake" else "closed"
