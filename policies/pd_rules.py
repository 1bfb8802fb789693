"""PD rules: how a disaggregated fleet pairs a request with a decode worker and whether it is
prefilled there (locally) or on the prefill worker the prefill router chose. Decisions only;
the fleet (``sim/fleet/pd.py``) builds the view and executes the choice.

A rule sees, per decode worker (``DecodeWorker``), the requests and prompt tokens routed to it
and not finished, its GPU-resident prefix of this prompt (the decode worker's own cache, as
exactly as the worker itself knows it) and the seconds its next decode step would take with
this request added; and the request (``PDRequest``): its prompt, the threshold of
conditional disaggregation (``--pd-local-threshold``; 0: never local) and whether decode
workers keep a prefix cache. It returns a ``PDChoice``. The prefill worker is chosen by the
run's router (``--router``) over the prefill pool, whatever the rule.

The field's rules, each naming what it follows (docs/pd.md):
  disagg     kvsim's baseline: decode by cache when decode workers keep one (longest cached
             prefix, ties least in flight), else least in flight; local below the threshold
  dynamo     NVIDIA Dynamo's disaggregated serving: the decode router's cost is the decode
             pool's active blocks (overlap credit 0); conditional disaggregation as its
             DisaggregatedRouter: remote iff prompt - prefix hit on the decode worker >
             max_local_prefill_length (the threshold)
  sglang-pd  SGLang Model Gateway PD mode: prefill and decode policies picked independently;
             decode power-of-two over in-flight requests; always disaggregated
  llm-d      llm-d inference scheduler's P/D profile: the decode pod scored first (prefix
             cache share + free load), then the prefill profile runs only when the uncached
             tokens on that pod reach the threshold
  mooncake   Mooncake Conductor (FAST'25 Algorithm 1): the decode instance by load whose
             predicted TBT meets the SLO; when none does, the request is marked overloaded
             (Conductor rejects it with 429; kvsim serves it and counts it); the TTFT half
             of the test is the prefill router's (``--router mooncake``)

Write a rule as a subclass of ``PDRule`` with a ``name`` and ``decide``; parameters are
annotated class attributes with defaults (typed like routers' parameters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from costmodel.registry import Registry


class PDRuleError(ValueError):
    exit_code = 2


@dataclass(frozen=True)
class DecodeWorker:
    index: int
    in_flight: int  # requests routed here and not finished
    in_flight_tokens: int  # their prompt tokens
    cached_tokens: int  # GPU-resident prefix of this prompt on this worker (tokens)
    step_s: float  # its next decode step's seconds with this request added


@dataclass(frozen=True)
class PDRequest:
    rid: int
    session: int
    now: float
    prompt_tokens: int
    threshold: int  # conditional disaggregation: local below this many uncached tokens; 0 off
    decode_cache: bool


@dataclass(frozen=True)
class PDChoice:
    decode: int
    local: bool = False  # prefill on the decode worker
    overloaded: bool = False  # the rule found no pair meeting its SLOs (served anyway)


class PDRule:
    """A rule; ``follows`` names the version of the system it models."""

    name: ClassVar[str] = ""
    follows: ClassVar[str] = ""
    uses_threshold: ClassVar[bool] = True  # False: --pd-local-threshold does nothing

    def __init__(self, rng) -> None:
        self.rng = rng

    def decide(self, request: PDRequest, workers: Sequence[DecodeWorker]) -> PDChoice:
        raise NotImplementedError

    @staticmethod
    def least_loaded(workers: Sequence[DecodeWorker]) -> DecodeWorker:
        """Fewest requests in flight, then fewest tokens, then the lowest index."""
        return min(workers, key=lambda w: (w.in_flight, w.in_flight_tokens, w.index))

    @staticmethod
    def below_threshold(request: PDRequest, worker: DecodeWorker) -> bool:
        return bool(request.threshold) and \
            request.prompt_tokens - worker.cached_tokens < request.threshold


PD_RULES: Registry[type[PDRule]] = Registry("PD rule", PDRuleError, base=PDRule)


@PD_RULES.register("disagg")
class Disagg(PDRule):
    name = "disagg"
    follows = "kvsim baseline"

    def decide(self, request, workers):
        if request.decode_cache:
            w = min(workers, key=lambda w: (-w.cached_tokens, w.in_flight,
                                            w.in_flight_tokens, w.index))
        else:
            w = self.least_loaded(workers)
        return PDChoice(w.index, self.below_threshold(request, w))


@PD_RULES.register("dynamo")
class DynamoDisagg(PDRule):
    name = "dynamo"
    follows = ("Dynamo KV router on the decode pool (overlap credit 0: cost = active blocks) "
               "+ DisaggregatedRouter.prefill_remote (prefill_length - prefix_hit_length > "
               "max_local_prefill_length), Dynamo 0.3 examples/llm")

    def decide(self, request, workers):
        w = min(workers, key=lambda w: (w.in_flight_tokens, w.index))
        local = bool(request.threshold) and \
            request.prompt_tokens - w.cached_tokens <= request.threshold
        return PDChoice(w.index, local)


@PD_RULES.register("sglang-pd")
class SGLangPD(PDRule):
    name = "sglang-pd"
    follows = ("SGLang Model Gateway (sgl-router) --pd-disaggregation with --decode-policy "
               "power_of_two: two decode workers drawn, the one with fewer in flight")
    uses_threshold = False

    def decide(self, request, workers):
        if len(workers) == 1:
            return PDChoice(workers[0].index)
        a, b = self.rng.choice(len(workers), size=2, replace=False).tolist()
        w = min(workers[a], workers[b], key=lambda w: (w.in_flight, w.index))
        return PDChoice(w.index)


@PD_RULES.register("llm-d")
class LlmdPD(PDRule):
    name = "llm-d"
    follows = ("llm-d inference scheduler P/D profile handler: decode pod by prefix-cache "
               "scorer + load scorer (equal weights), prefill only when uncached tokens >= "
               "the P/D threshold")

    def decide(self, request, workers):
        most = max(w.in_flight for w in workers) or 1
        p = max(1, request.prompt_tokens)

        def score(w: DecodeWorker) -> float:
            return w.cached_tokens / p + (1.0 - w.in_flight / most)

        w = min(workers, key=lambda w: (-score(w), w.index))
        return PDChoice(w.index, self.below_threshold(request, w))


@PD_RULES.register("mooncake")
class MooncakeConductor(PDRule):
    name = "mooncake"
    follows = ("Mooncake FAST'25 Conductor, Algorithm 1: SelectDecodingInstance by load; "
               "early rejection when TBT > TBT_SLO")
    uses_threshold = False
    tbt_slo_s: float = 0.1

    def decide(self, request, workers):
        meeting = [w for w in workers if w.step_s <= self.tbt_slo_s]
        w = self.least_loaded(meeting or workers)
        return PDChoice(w.index, overloaded=not meeting)


def make_rule(name: str, rng) -> PDRule:
    return PD_RULES.get(name)(rng)
