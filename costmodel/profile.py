"""Time profiles: seconds from units, bytes and batch shapes. Profiles are data files.

A profile is a YAML file (see ``profiles/``) made for one model spec on one device, with its
provenance: fitted to NVIDIA's measured kernel tables (``kernels-*``, the defaults; ``kvsim
calibrate --from-kernels``), ``derived, not measured`` from datasheet peaks (``derived-*``), or
measured on a GPU by ``kvsim calibrate``.
Profiles are untrusted input: loaded with YAML's safe loader (libyaml's parser where PyYAML has
it: the same constructor and values, ~8x faster on the kernel tables every run loads) and
validated field by field.

    prefill batch  = fixed + per_linear_unit * linear + per_attention_unit * attention
                     + per_chunk_token_sq * tokens**2
    decode step    = fixed + weights + per_seq * batch + per_context_token * sum(context)
    transfer       = latency + bytes / bytes_per_s        (h2d: CPU -> GPU, d2h: GPU -> CPU)

An optional ``server`` section (``ServerCoeffs``) adds what a real server pays beyond these
kernels: the scales multiply prefill and decode, a mixed step's interference, the CPU time of
a step summed or overlapped (``step_seconds``); absent, every price is the kernels' alone.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, asdict, astuple, dataclass, field, replace
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .detmath import powi
from .errors import ProfileError
from .hfconfig import is_config_path
from .registry import Registry
from .safeyaml import safe_load
from .specs import SPECS, ModelSpec, get_spec
from .units import Units

FORMAT_VERSION = 1


@dataclass(frozen=True)
class PrefillCoeffs:
    fixed_s: float
    per_linear_unit_s: float
    per_attention_unit_s: float
    per_chunk_token_sq_s: float = 0.0


@dataclass(frozen=True)
class DecodeCoeffs:
    fixed_s: float
    weights_s: float
    per_seq_s: float
    per_context_token_s: float
    # MoE: seconds to read every expert this GPU holds once. A step pays the share its tokens
    # route to (``Profile.expert_share``), which saturates long before the batch is large;
    # ``weights_s`` then holds the weights every step reads whole. 0 for a dense model.
    experts_s: float = 0.0


@dataclass(frozen=True)
class TransferCoeffs:
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class ServerCoeffs:
    """What a real server pays beyond its kernels (issue 53 item 5; docs/accuracy.md "Server
    terms beyond the kernels"), each a named term, all neutral by default (a profile without
    a ``server`` section prices its kernels alone, to the float):

    - ``cpu_step_s`` / ``cpu_per_seq_s`` / ``cpu_per_token_s``: the engine's CPU time per
      step (scheduler, input preparation, output processing), per request and per token it
      schedules. A synchronous server pays it after every GPU step; an overlapped one (vLLM's
      async scheduling, SGLang's overlap schedule) prepares step n+1 while step n runs, so a
      step takes ``max(gpu, cpu)`` (``Profile.for_server``).
    - ``mixed_interference``: a step mixing prefill chunks and decode rows costs
      ``max(P, D) + x min(P, D)`` (x = 0: the roofline's max; 1: the two summed).
    - ``prefill_scale`` / ``decode_scale``: the server's kernels against the profile's (the
      launch gaps, norms and sampler the kernel tables leave out), multiplying every prefill
      and decode term.
    - ``gpu_step_s`` / ``gpu_per_token_s`` / ``gpu_per_seq_s``: GPU seconds every step,
      every token it computes and every decode row pay beyond the profile's kernels, never
      overlapped: the LM head's weight read, the tensor-parallel all-reduces over the
      replica's real link, sampling (``server_terms``: derived, not fitted).
    - ``fixed_on_host``: the share of the profile's fixed step terms that is host time
      (scheduling, launches), not GPU time: taken off every GPU step and paid as CPU time,
      the decode step's a step (so an overlapped server hides it behind its kernels).
    - ``mixed_decode_rows``: the share of a mixed step's decode rows' own reads (KV and per
      row: the decode step less its fixed and weight terms) added to the prefill chunks'
      time before the max above (1: the rows' attention kernels run beside the GEMMs).

    ``kvsim calibrate --from-measurements`` fits them (calibration/measured.py); the
    profile's ``details["server"]`` says from which runs."""

    cpu_step_s: float = 0.0
    cpu_per_seq_s: float = 0.0
    cpu_per_token_s: float = 0.0
    mixed_interference: float = 0.0
    prefill_scale: float = 1.0
    decode_scale: float = 1.0
    gpu_step_s: float = 0.0
    gpu_per_token_s: float = 0.0
    gpu_per_seq_s: float = 0.0
    mixed_decode_rows: float = 0.0
    fixed_on_host: float = 0.0
    overlapped: bool = field(default=False, compare=False)  # the server's, not the file's

    @property
    def neutral(self) -> bool:
        return self == NEUTRAL_SERVER

    @property
    def has_cpu(self) -> bool:
        return bool(self.cpu_step_s or self.cpu_per_seq_s or self.cpu_per_token_s
                    or self.fixed_on_host)

    def cpu_seconds(self, seqs: int, tokens: int) -> float:
        return self.cpu_step_s + self.cpu_per_seq_s * seqs + self.cpu_per_token_s * tokens


NEUTRAL_SERVER = ServerCoeffs()
DERIVED_TERMS = ("gpu_step_s", "gpu_per_token_s", "gpu_per_seq_s", "mixed_decode_rows",
                 "fixed_on_host")
# what a decode row costs a step beyond its weights and KV (sampling, per-row work): the figure
# the datasheet profiles state (costmodel/derive.py DECODE_PER_SEQ_S), which kernel tables lack
SAMPLING_PER_SEQ_S = 2e-5


def server_terms(prof: Profile, link_bytes_per_s: float | None = None,
                 link_latency_s: float = 0.0,
                 table_allreduce: tuple[float, float] | None = None,
                 table_dispatch: tuple[float, float] | None = None,
                 ) -> tuple[dict[str, float], list[str]]:
    """The ``DERIVED_TERMS`` of a vLLM server priced by ``prof`` and what each is: what its
    GPUs pay beyond the kernels a profile composes (calibration/kernels/compose.py leaves out
    the LM head and sampling; its all-reduces are the tables' on their own test link):

    - ``gpu_step_s``: the LM head's weights (vocab x hidden, split over the TP group), read
      once a step, at the rate the profile reads the other weights (``decode.weights_s`` over
      the per-GPU bytes of ``active_params``, the routed experts left out where
      ``decode.experts_s`` holds them), so tables and rooflines each price it as their own
      weights; plus, with a link stated, the latency of each all-reduce;
    - ``gpu_per_token_s``: with ``prof.gpus`` > 1 and a link stated (``link_bytes_per_s`` one
      way, latency per transfer), two all-reduces per layer (after attention and after the
      MLP), ring algorithm: ``2 (tp-1)/tp x hidden x dtype bytes`` a token over the link, in
      place of the all-reduces the profile holds: a roofline's over the catalog's link
      (its details), a kernel-table profile's measured ones (``table_allreduce``: seconds per
      all-reduce and per element, calibration/kernels/compose.py ``allreduce_line``; without
      it they are added, and the note says so); likewise, for one GPU of a DP x EP group
      (``details["expert_parallel"]`` ranks, compose.py), the all-gather and reduce-scatter
      of the group's tokens around the experts, a layer each: a rank receives and sends the
      ``ep - 1`` other ranks' share, ``(ep-1) x hidden x dtype bytes`` per token of its own
      each way, in place of the tables' NCCL ones (``table_dispatch``: seconds per layer and
      per element, compose.py ``dispatch_line``); and with TP, the vocabulary-split logits
      gathered to the sampler each step (``(tp-1)/tp x vocab x dtype bytes`` a decode row,
      in ``gpu_per_seq_s``, and one latency a step);
    - ``gpu_per_seq_s``: sampling and per-row work a decode row pays (``SAMPLING_PER_SEQ_S``),
      for profiles that do not state it (a datasheet profile's ``decode.per_seq_s`` has it);
    - ``mixed_decode_rows`` 1: a vLLM step mixing prefill chunks and decode rows is one forward
      pass whose GEMMs read the weights once for every token, while the decode rows' attention
      reads their KV in kernels of its own: the rows' reads add to the prefill's time
      (``mixed_seconds``);
    - ``fixed_on_host`` 1 for a datasheet profile: its stated fixed step terms are
      scheduling, launches and sampling (costmodel/derive.py ``DECODE_FIXED_S``,
      ``PREFILL_FIXED_S``): host time, which the kernel tables (GPU kernels timed alone)
      hold none of; paid beside the GPU step."""
    spec, tp = prof.spec, prof.gpus
    # what ``decode.weights_s`` reads; an experts_s holds the routed experts apart
    weights = spec.weight_read_bytes(routed=not prof.decode.experts_s) / tp
    lm = spec.vocab * spec.hidden * spec.dtype_bytes / tp
    step = prof.decode.weights_s * lm / weights if weights > 0 and spec.vocab else 0.0
    notes = [f"LM head read: {step * 1e3:.2f} ms a step ({lm / 1e9:.2f} GB per GPU at the "
             "profile's own weight-read rate)"] if step else []
    per_tok = gather = 0.0
    if tp > 1 and link_bytes_per_s:
        ring = 2 * (tp - 1) / tp * spec.hidden * spec.dtype_bytes
        n = 2 * spec.layers
        roof = prof.details.get("tensor_parallel", {}).get("allreduce_s_per_token_per_layer")
        if roof is not None:
            own_tok, own_step, held = spec.layers * float(roof), 0.0, "the roofline's"
        elif table_allreduce is not None:
            own_step = n * table_allreduce[0]
            own_tok = n * table_allreduce[1] * spec.hidden
            held = "the kernel tables'"
        else:
            own_tok, own_step, held = 0.0, 0.0, ""
        per_tok = max(0.0, n * ring / link_bytes_per_s - own_tok)
        step += max(0.0, n * link_latency_s - own_step)
        notes.append(f"TP{tp} all-reduces over the stated link ({link_bytes_per_s / 1e9:g} GB/s,"
                     f" {link_latency_s * 1e6:g} us), {n} a step: "
                     + (f"in place of {held} ({own_tok * 1e6:.1f} us a token, "
                        f"{own_step * 1e3:.2f} ms a step)" if held else
                        "added to the profile's own (not known to subtract)")
                     + f": net {per_tok * 1e6:.1f} us a token")
        # the LM head is split over the vocabulary: each step its logits are gathered to
        # the sampler (vLLM's LogitsProcessor), (tp-1)/tp of a row's vocab x dtype bytes
        gather = (tp - 1) / tp * spec.vocab * spec.dtype_bytes / link_bytes_per_s
        step += link_latency_s
        notes.append(f"TP{tp} logits gathered to the sampler over the stated link: "
                     f"{gather * 1e6:.1f} us a decode row, {link_latency_s * 1e6:g} us a step")
    ep = int(prof.details.get("expert_parallel", 1))
    if ep > 1 and link_bytes_per_s:
        own_tok, own_step = 0.0, 0.0
        if table_dispatch is not None:
            own_step = spec.layers * table_dispatch[0]
            own_tok = spec.layers * table_dispatch[1] * ep * spec.hidden
        tok = max(0.0, 2 * spec.layers * (ep - 1) * spec.hidden * spec.dtype_bytes
                  / link_bytes_per_s - own_tok)
        per_tok += tok
        step += max(0.0, 2 * spec.layers * link_latency_s - own_step)
        notes.append(f"EP{ep} dispatch over the stated link ({link_bytes_per_s / 1e9:g} GB/s, "
                     f"{link_latency_s * 1e6:g} us), {2 * spec.layers} collectives a step: "
                     + (f"in place of the kernel tables' ({own_tok * 1e6:.1f} us a token, "
                        f"{own_step * 1e3:.2f} ms a step)" if table_dispatch is not None else
                        "added to the profile's own (not known to subtract)")
                     + f": net {tok * 1e6:.1f} us a token")
    datasheet = "derived_by" in prof.details
    per_seq = (0.0 if datasheet else SAMPLING_PER_SEQ_S) + gather
    if not datasheet:
        notes.append(f"sampling and per-row work: {SAMPLING_PER_SEQ_S * 1e6:g} us a decode row")
    if datasheet and (prof.decode.fixed_s or prof.prefill.fixed_s):
        notes.append(f"the datasheet profile's fixed step terms ({prof.decode.fixed_s * 1e3:g} ms "
                     f"a decode step, {prof.prefill.fixed_s * 1e3:g} ms a prefill batch) are "
                     "host time (scheduling, launches): paid beside the GPU step, "
                     f"{prof.decode.fixed_s * 1e3:g} ms a step, which async scheduling overlaps")
    notes.append("mixed steps: the decode rows' KV reads add to the prefill chunks' GEMMs")
    return {"gpu_step_s": step, "gpu_per_token_s": per_tok, "gpu_per_seq_s": per_seq,
            "mixed_decode_rows": 1.0, "fixed_on_host": 1.0 if datasheet else 0.0}, notes


def expert_share(spec: ModelSpec, batch: int, group: int = 1) -> float:
    """The expected share of a GPU's experts that a decode step of ``batch`` sequences on
    each of ``group`` expert-parallel ranks reads (compose.py: the fused MoE runs the group's
    tokens): each token routes to ``k`` of the ``E`` experts, uniformly as in the kernel
    tables' balanced distribution, so an expert is missed by all of them with probability
    ``(1 - k/E)^(batch x group)``. 0 for a dense model."""
    if not spec.experts or batch <= 0:
        return 0.0
    return 1.0 - powi(1.0 - spec.active_experts / spec.experts, int(batch) * int(group))


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    device: str
    provenance: str
    prefill: PrefillCoeffs
    decode: DecodeCoeffs
    transfer: TransferCoeffs
    gpus: int = 1
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    path: str = field(default="", compare=False)
    server: ServerCoeffs = NEUTRAL_SERVER
    # seconds per attention unit of a KV cache group kind at its own kernel's rate (mla, dsa,
    # linear, ...; docs/hybrid.md, Profiles); a kind not named: prefill.per_attention_unit_s
    attention_rates: tuple[tuple[str, float], ...] = ()

    @property
    def spec(self) -> ModelSpec:
        return get_spec(self.model)

    @property
    def attention_weights(self) -> dict[str, float]:
        """Each kind's rate over the profile's one rate (``ModelSpec.attention_weights``), so a
        hybrid's prefill is priced group by group; empty without per-kind rates."""
        base = self.prefill.per_attention_unit_s
        return {k: r / base for k, r in self.attention_rates} if base > 0 else {}

    def pricing_spec(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` priced by this profile (``attention_weights``; itself without rates)."""
        return spec.with_attention_weights(w) if (w := self.attention_weights) else spec

    def prefill_seconds(self, units: Units) -> float:
        """Seconds of one prefill batch doing ``units`` of work over ``units.tokens`` tokens."""
        p = self._p
        return (p.fixed_s + p.per_linear_unit_s * units.linear
                + p.per_attention_unit_s * units.attention
                + p.per_chunk_token_sq_s * units.tokens**2
                + self.server.gpu_per_token_s * units.tokens)

    def recompute_seconds(self, units: Units) -> float:
        """Marginal prefill seconds of ``units`` (a batch's fixed cost left out): the price of
        recomputing them, as policies, the shared pool and Continuum's pins weigh it."""
        return self.prefill_seconds(units) - self._empty_batch_s

    @cached_property
    def _empty_batch_s(self) -> float:
        return self.prefill_seconds(Units())

    # --- the server's terms (ServerCoeffs): neutral unless a profile or calibration sets them
    @cached_property
    def _p(self) -> PrefillCoeffs:
        """The prefill coefficients the server pays: the kernels' x ``prefill_scale``, the
        fixed term less its host share (``fixed_on_host``), plus ``gpu_step_s`` a batch
        (``gpu_per_token_s`` is in ``prefill_seconds``)."""
        srv = self.server
        k, extra, host = srv.prefill_scale, srv.gpu_step_s, srv.fixed_on_host
        p = self.prefill
        if k == 1.0 and not extra and not host:
            return p
        q = PrefillCoeffs(*(k * v for v in astuple(p)))
        return replace(q, fixed_s=q.fixed_s * (1 - host) + extra) if extra or host else q

    @cached_property
    def _d(self) -> DecodeCoeffs:
        """The decode coefficients the server pays: the kernels' x ``decode_scale``, the
        fixed term less its host share (``fixed_on_host``), plus ``gpu_step_s`` a step and
        ``gpu_per_token_s`` a sequence (one token each)."""
        srv = self.server
        k = srv.decode_scale
        d = self.decode
        if k == 1.0 and not srv.gpu_step_s and not srv.gpu_per_token_s \
                and not srv.gpu_per_seq_s and not srv.fixed_on_host:
            return d
        q = DecodeCoeffs(*(k * v for v in astuple(d)))
        return replace(q, fixed_s=q.fixed_s * (1 - srv.fixed_on_host) + srv.gpu_step_s,
                       per_seq_s=q.per_seq_s + srv.gpu_per_token_s + srv.gpu_per_seq_s)

    def for_server(self, overlapped: bool) -> Profile:
        """This profile as a server that overlaps its CPU work with the GPU step (vLLM's async
        scheduling, SGLang's overlap schedule) or not prices it; itself when it has no CPU
        terms (the engines bind their profile once, ``sim/engines``)."""
        if not self.server.has_cpu or self.server.overlapped == overlapped:
            return self
        return replace(self, server=replace(self.server, overlapped=overlapped))

    def with_server(self, server: ServerCoeffs, source: str) -> Profile:
        """This profile with the server terms ``server`` (``kvsim calibrate
        --from-measurements``), ``source`` saying where they come from (``details.server``)."""
        return replace(self, server=server, details={**self.details, "server": source})

    def step_seconds(self, gpu_s: float, seqs: int, tokens: int) -> float:
        """Wall seconds of one engine step whose kernels take ``gpu_s`` and which schedules
        ``seqs`` requests and ``tokens`` tokens: the CPU time after it (synchronous) or the
        larger of the two (overlapped)."""
        srv = self.server
        if not srv.has_cpu:
            return gpu_s
        cpu = srv.cpu_seconds(seqs, tokens) + self._host_s
        return max(gpu_s, cpu) if srv.overlapped else gpu_s + cpu

    @cached_property
    def _host_s(self) -> float:
        """Host seconds a step pays out of the profile's fixed terms (``fixed_on_host`` of
        the decode step's)."""
        return self.server.fixed_on_host * self.decode.fixed_s

    def mixed_seconds(self, prefill_s: float, decode_s: float, batch: int) -> float:
        """Kernel seconds of a step mixing prefill chunks (``prefill_s`` alone) and ``batch``
        decode rows (``decode_s``, ``decode_kernel_seconds``): the larger, plus
        ``mixed_interference`` of the smaller."""
        x, rows = self.server.mixed_interference, self.server.mixed_decode_rows
        if rows:  # the decode rows' own reads (KV, per row) beside the prefill's GEMMs
            d = self._d  # (a prefill chunk's tokens already read every expert the rows read)
            experts = d.experts_s * self.expert_share(batch) if d.experts_s else 0.0
            prefill_s += rows * max(0.0, decode_s - d.fixed_s - d.weights_s - experts)
        hi, lo = (prefill_s, decode_s) if prefill_s >= decode_s else (decode_s, prefill_s)
        return hi + x * lo if x else hi

    def expert_share(self, batch: int) -> float:
        """The share of this GPU's experts a decode step of ``batch`` sequences reads
        (:func:`expert_share`; the group is ``details["expert_parallel"]`` ranks)."""
        spec, group = self._expert_group
        return expert_share(spec, batch, group)

    @cached_property
    def _expert_group(self) -> tuple[ModelSpec, int]:
        """The model and its expert-parallel group, looked up once, not per decode step."""
        return self.spec, int(self.details.get("expert_parallel", 1))

    def decode_kernel_seconds(self, batch: int, context_tokens: int) -> float:
        """Kernel seconds of one decode step (no CPU term)."""
        d = self._d
        return (d.fixed_s + d.weights_s + d.per_seq_s * batch
                + d.per_context_token_s * context_tokens
                + (d.experts_s * self.expert_share(batch) if d.experts_s else 0.0))

    def decode_step_seconds(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode step of ``batch`` sequences holding ``context_tokens`` in all."""
        gpu = self.decode_kernel_seconds(batch, context_tokens)
        return self.step_seconds(gpu, batch, batch) if self.server.has_cpu else gpu

    def decode_step_series(self, batch: int, context_tokens: int) -> tuple[float, float]:
        """(first step's seconds, what each next step adds) of a decode run. Overlapped CPU
        time longer than the first steps' kernels is taken as the first step's for all of
        them (the token times; ``decode_run_seconds`` is exact)."""
        return (self.decode_step_seconds(batch, context_tokens),
                self._d.per_context_token_s * batch)

    def decode_run_seconds(self, batch: int, context_tokens: int, steps: int) -> float:
        """Seconds of ``steps`` decode steps of ``batch`` sequences starting from
        ``context_tokens`` in all; each step adds ``batch`` tokens (an arithmetic series; with
        overlapped CPU time, the steps whose kernels are shorter cost the CPU time)."""
        if steps <= 0:
            return 0.0
        d = self._d
        inc = d.per_context_token_s * batch
        srv = self.server
        if not srv.has_cpu or not srv.overlapped:
            first = self.decode_step_seconds(batch, context_tokens)
            return steps * first + inc * steps * (steps - 1) / 2
        g0 = self.decode_kernel_seconds(batch, context_tokens)
        cpu = srv.cpu_seconds(batch, batch) + self._host_s
        # the first n steps wait for the CPU: step k's kernels g0 + k inc < cpu
        n = (min(steps, max(0, math.ceil((cpu - g0) / inc))) if inc > 0
             else steps if g0 < cpu else 0)
        return (n * cpu + (steps - n) * g0
                + inc * (steps * (steps - 1) - n * (n - 1)) / 2)

    def decode_steps_within(self, batch: int, context_tokens: int, elapsed: float,
                            cap: int) -> int:
        """The smallest ``k`` in ``[1, cap]`` with ``decode_run_seconds(batch, context_tokens,
        k) >= elapsed`` (``cap`` when none): the step in flight ``elapsed`` seconds into a
        decode run. The series' closed form (a quadratic in ``k``) proposes it and the run's
        own price confirms it with two evaluations, so the answer is the bisection's, which
        settles any proposal the price does not confirm."""
        first = self.decode_step_seconds(batch, context_tokens)
        inc = self._d.per_context_token_s * batch
        k = 0
        if inc > 0:
            half = first - inc / 2
            k = math.ceil((math.sqrt(half * half + 2 * inc * elapsed) - half) / inc)
        elif first > 0:
            k = math.ceil(elapsed / first)
        if 1 <= k <= cap and self.decode_run_seconds(batch, context_tokens, k) >= elapsed \
                and (k == 1 or self.decode_run_seconds(batch, context_tokens, k - 1) < elapsed):
            return k
        lo, hi = 1, cap
        while lo < hi:
            mid = (lo + hi) // 2
            if self.decode_run_seconds(batch, context_tokens, mid) >= elapsed:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def transfer_seconds(self, nbytes: float, direction: str) -> float:
        """Seconds to copy ``nbytes`` one way: ``h2d`` (load from CPU) or ``d2h`` (offload)."""
        if nbytes <= 0:
            return 0.0
        t = self.transfer
        bw = t.h2d_bytes_per_s if direction == "h2d" else t.d2h_bytes_per_s
        return t.latency_s + nbytes / bw

    def to_dict(self) -> dict[str, Any]:
        return {
            "kvsim_profile": FORMAT_VERSION,
            "name": self.name,
            "model": self.model,
            "device": self.device,
            "gpus": self.gpus,
            "provenance": self.provenance,
            "prefill": asdict(self.prefill),
            "decode": {k: v for k, v in asdict(self.decode).items()
                       if k != "experts_s" or v},
            "transfer": asdict(self.transfer),
            "details": self.details,
        } | ({} if self.server.neutral else {"server": {
            k: v for k, v in asdict(self.server).items() if k != "overlapped"}}) | (
            {"attention_rates": dict(self.attention_rates)} if self.attention_rates else {})

    def dump(self, path: str | Path) -> None:
        """Write atomically (temporary file, then rename), after checking that
        :func:`load_profile` will accept what is written (:func:`check_profile`)."""
        path = Path(path)
        check_profile(self, str(path))
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_yaml())
        tmp.replace(path)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)


def _coeffs(cls: type, raw: Any, path: str, section: str) -> Any:
    if not isinstance(raw, dict):
        raise ProfileError(path, section, "must be a mapping")
    values = {}
    for name, f in cls.__dataclass_fields__.items():
        if name not in raw:
            if f.default is not MISSING:
                continue
            raise ProfileError(path, f"{section}.{name}", "missing")
        v = raw[name]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ProfileError(path, f"{section}.{name}",
                               f"must be a finite number >= 0, got {v!r}")
        values[name] = float(v)
    unknown = set(raw) - set(cls.__dataclass_fields__)
    if unknown:
        raise ProfileError(path, f"{section}.{sorted(unknown)[0]}", "unknown field")
    return cls(**values)


def profile_from_dict(raw: Any, path: str = "<profile>") -> Profile:
    if not isinstance(raw, dict):
        raise ProfileError(path, "<root>", "a profile must be a YAML mapping")
    if raw.get("kvsim_profile") != FORMAT_VERSION:
        raise ProfileError(path, "kvsim_profile", f"must be {FORMAT_VERSION}")
    for key in ("name", "model", "device", "provenance"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ProfileError(path, key, "missing or not a string")
    try:
        get_spec(raw["model"])
    except KeyError as e:
        raise ProfileError(path, "model", str(e.args[0])) from None
    transfer = _coeffs(TransferCoeffs, raw.get("transfer"), path, "transfer")
    if transfer.h2d_bytes_per_s <= 0 or transfer.d2h_bytes_per_s <= 0:
        raise ProfileError(path, "transfer", "bandwidths must be > 0")
    gpus = raw.get("gpus", 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ProfileError(path, "gpus", f"must be a positive integer, got {gpus!r}")
    details = raw.get("details", {})
    if not isinstance(details, dict):
        raise ProfileError(path, "details", "must be a mapping")
    return Profile(
        name=raw["name"], model=raw["model"], device=raw["device"],
        provenance=raw["provenance"], gpus=gpus,
        prefill=_coeffs(PrefillCoeffs, raw.get("prefill"), path, "prefill"),
        decode=_coeffs(DecodeCoeffs, raw.get("decode"), path, "decode"),
        transfer=transfer, details=details, path=path,
        server=server_from_dict(raw.get("server"), path, "server"),
        attention_rates=_rates(raw.get("attention_rates"), path),
    )


def _rates(raw: Any, path: str) -> tuple[tuple[str, float], ...]:
    """An ``attention_rates`` section: a kind of ``costmodel.specs.AttentionKind`` to seconds
    per attention unit (finite, > 0); absent: none."""
    from .specs import AttentionKind

    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ProfileError(path, "attention_rates", "must map attention kinds to seconds")
    out = []
    for k, v in raw.items():
        if k not in set(AttentionKind):
            raise ProfileError(path, f"attention_rates.{k}", "unknown attention kind; one of "
                               + ", ".join(AttentionKind))
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v <= 0:
            raise ProfileError(path, f"attention_rates.{k}",
                               f"must be a finite number > 0, got {v!r}")
        out.append((str(k), float(v)))
    return tuple(out)


def server_from_dict(raw: Any, path: str, section: str) -> ServerCoeffs:
    """A ``server`` section (ServerCoeffs; absent: neutral), validated field by field."""
    if raw is None:
        return NEUTRAL_SERVER
    if isinstance(raw, dict) and "overlapped" in raw:
        raise ProfileError(path, f"{section}.overlapped",
                           "unknown field (the engine's scheduling decides it)")
    srv = _coeffs(ServerCoeffs, raw, path, section)
    for name in ("mixed_interference", "mixed_decode_rows"):
        if getattr(srv, name) > 1:
            raise ProfileError(path, f"{section}.{name}",
                               f"must be in [0, 1], got {getattr(srv, name)!r}")
    for name in ("prefill_scale", "decode_scale"):
        if getattr(srv, name) <= 0:
            raise ProfileError(path, f"{section}.{name}", "must be > 0")
    return srv


def check_profile(profile: Profile, path: str = "<profile>") -> None:
    """Raise :class:`ProfileError` (naming ``path`` and the field) unless the file that
    ``profile`` would write reads back with :func:`load_profile` to the same profile. Writers
    (``Profile.dump``, ``kvsim calibrate``) call this before writing, so no tool leaves a file
    behind that every ``--profile`` option would then refuse (an inf bandwidth, a NaN)."""
    raw = yaml.safe_load(profile.to_yaml())
    back = profile_from_dict(raw, path)
    if back.to_dict() != raw:  # pragma: no cover - a field the loader does not keep
        raise ProfileError(path, "<root>", "does not read back unchanged")


def shipped_profiles() -> list[str]:
    root = resources.files("costmodel") / "profiles"
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


# Shipped profile families on one H100 (what ``kvsim reproduce --profiles`` picks from). The
# default is the profile fitted to measured kernels; the datasheet-derived one was the default
# before and keeps its numbers under its new name.
PROFILE_FAMILIES: Registry[str] = Registry("profile family", ValueError)
PROFILE_FAMILIES.register("derived", "derived-h100-{model}")
PROFILE_FAMILIES.register("kernels", "kernels-h100_sxm-{model}")
DEFAULT_FAMILY = "kernels"
RENAMED = re.compile(r"^h100-(?P<model>.+)$")  # the derived profiles' names until kernels


def default_profile_name(model: str, family: str | None = None) -> str:
    """The shipped profile of ``model`` in ``family`` (default: :data:`DEFAULT_FAMILY`)."""
    return PROFILE_FAMILIES.get(family or DEFAULT_FAMILY).format(model=model)


DERIVED_PREFIX = "derived-h100-"


def _shipped(name: str) -> bool:
    return (resources.files("costmodel") / "profiles" / f"{name}.yaml").is_file()


def derivable(name: str) -> str | None:
    """The model of ``derived-h100-MODEL`` when no such profile is shipped and MODEL is a
    catalog name or a config.json path: ``costmodel/derive.py`` derives its datasheet profile
    when asked (models without measured kernel tables; ``gpus.profile_for`` names it)."""
    if not name.startswith(DERIVED_PREFIX) or _shipped(name) or Path(name).is_file():
        return None
    model = name.removeprefix(DERIVED_PREFIX)
    return model if model in SPECS or is_config_path(model) else None


def roofline_parts(name: str) -> tuple[str, str, int | None] | None:
    """(GPU, model, TP or None) of ``roofline-<gpu>-<model>[-tp<N>]`` for a GPU of the
    catalog and a model kvsim knows (``costmodel/derive.py`` ``roofline`` derives it when
    asked); None for any other name."""
    if not name.startswith("roofline-") or Path(name).is_file():
        return None
    from .gpus import load_gpus

    rest = name.removeprefix("roofline-")
    for gpu in sorted(load_gpus(), key=len, reverse=True):  # H100-PCIE before H100
        if rest.lower().startswith(gpu.lower() + "-"):
            model = rest[len(gpu) + 1:]
            m = re.fullmatch(r"(.+)-tp(\d+)", model)
            tp = None
            if m and (m[1] in SPECS or is_config_path(m[1])):
                model, tp = m[1], int(m[2])
            if model in SPECS or is_config_path(model):
                return gpu, model, tp
            return None
    return None


def load_profile(name_or_path: str | Path | None, model: str | None = None) -> Profile:
    """Load a profile by shipped name (``kernels-h100_sxm-qwen3-8b``, ``derived-h100-qwen3-8b``)
    or file path; ``None`` picks the shipped default for ``model`` (the measured-kernel H100
    profile; for a model without one, its datasheet profile, derived). A profile made for
    another model is refused."""
    if name_or_path is None:
        if model is None:
            raise ValueError("either a profile or a model is needed")
        name_or_path = default_profile_name(model)
        if not _shipped(name_or_path) and derivable(DERIVED_PREFIX + model):
            name_or_path = DERIVED_PREFIX + model
    roof = roofline_parts(name_or_path) if isinstance(name_or_path, str) else None
    if roof is not None:
        from .derive import roofline  # derive imports this module

        prof = roofline(*roof)
        if model is not None and prof.model != model:
            raise ProfileError(name_or_path, "model",
                               f"profile is for {prof.model!r}, not {model!r}")
        return prof
    derived = derivable(name_or_path) if isinstance(name_or_path, str) else None
    if derived is not None:
        from .derive import derive  # derive imports this module

        prof = derive(derived)
        if model is not None and prof.model != model:
            raise ProfileError(name_or_path, "model",
                               f"profile is for {prof.model!r}, not {model!r}")
        return prof
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        path = str(p)
        try:
            text = p.read_text()
        except OSError as e:
            raise ProfileError(path, "<file>", f"cannot read: {e.strerror}") from None
    else:
        res = resources.files("costmodel") / "profiles" / f"{name_or_path}.yaml"
        old = RENAMED.match(str(name_or_path))
        if not res.is_file() and old:
            m = old["model"]
            raise ProfileError(str(name_or_path), "<name>",
                               f"renamed: the datasheet profile is now derived-h100-{m}; the "
                               f"default is the measured-kernel kernels-h100_sxm-{m}")
        if not res.is_file():
            raise ProfileError(str(name_or_path), "<name>",
                               f"no such profile; shipped: {', '.join(shipped_profiles())}")
        path, text = f"costmodel/profiles/{name_or_path}.yaml", res.read_text()
    try:
        raw = safe_load(text)
    except yaml.YAMLError as e:
        raise ProfileError(path, "<yaml>", f"not valid YAML: {e}") from None
    prof = profile_from_dict(raw, path)
    if model is not None and prof.model != model:
        raise ProfileError(path, "model", f"profile is for {prof.model!r}, not {model!r}")
    return prof
