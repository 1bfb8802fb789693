"""Checks and notices of ``kvsim run`` (issue 21: no silent wrong answer): which --policy a
--policy-param belongs to, options that would do nothing in the combination given, the replay a
trace defaults to, a shared prefix capped by short first prompts, a saturated open loop, an open
loop throttled by its concurrency cap."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .common import stderr

if TYPE_CHECKING:
    from sim.config import RunConfig
    from sim.run import RunResult


def parse_params(items: tuple[str, ...]) -> list[tuple[str | None, str, str]]:
    """``[POLICY.]K=V`` items as (policy or None, K, V); values stay text (the policy class
    types them). POLICY is what follows ``--policy`` (``file.py:Class``, a registered name)
    or the class's name; K is the text after its last dot."""
    out: list[tuple[str | None, str, str]] = []
    for item in items:
        k, sep, v = item.partition("=")
        scope, dot, name = k.strip().rpartition(".")
        if not sep or not name or (dot and not scope):
            raise click.BadParameter(f"{item!r} is not K=V or POLICY.K=V",
                                     param_hint="--policy-param")
        out.append((scope or None, name, v.strip()))
    return out


def _policy_names(spec: str) -> set[str]:
    """Every way a --policy-param may name the policy ``spec``: as typed (with or without
    its ``?k=v`` part), its registered name, its class name."""
    from policies import get_policy

    policy = get_policy(spec)
    return {spec, spec.partition("?")[0], policy.name, type(policy).__name__} - {""}


def params_per_policy(policies: tuple[str, ...], items: tuple[str, ...]
                      ) -> dict[str, dict[str, str]]:
    """Each --policy's parameters. ``POLICY.K=V`` goes to the policy so named; ``K=V`` to the
    one policy that takes K (with a single --policy: to it). A K that several take, or a
    POLICY that names none, is refused (exit 2)."""
    from policies import get_policy

    out: dict[str, dict[str, str]] = {p: {} for p in policies}
    for scope, k, v in parse_params(items):
        if scope is not None:
            targets = [p for p in policies if scope in _policy_names(p)]
            if not targets:
                raise click.BadParameter(f"{scope}.{k}={v}: no --policy is named {scope!r} "
                                         f"(given: {', '.join(policies)})",
                                         param_hint="--policy-param")
        elif len(policies) == 1:
            targets = list(policies)
        else:
            targets = [p for p in policies if k in type(get_policy(p)).parameters()]
            if len(targets) != 1:
                why = ("several policies take it" if targets else "no --policy takes it")
                raise click.BadParameter(f"{k}={v}: {why}; name the policy, e.g. "
                                         f"{(targets or policies)[0]}.{k}={v}",
                                         param_hint="--policy-param")
        for p in targets:
            out[p][k] = v
    return out


def warn_capped_shared_prefix(trace: Any, shared_prefix: int | str | None,
                              block_size: int) -> None:
    """Sessions whose first prompt is shorter than --shared-prefix share all of it: say how
    many (a prefix longer than every first prompt is refused by the loader)."""
    if not isinstance(shared_prefix, int):
        return
    tops = [s for s in trace.sessions if s.parent < 0]
    capped = sum(s.shared_prefix_blocks < shared_prefix // block_size for s in tops)
    if capped:
        stderr.print(f"[yellow]warning:[/yellow] --shared-prefix {shared_prefix:,}: {capped:,} "
                     f"of {len(tops):,} sessions have a shorter first prompt; all of it is "
                     "shared")


def default_replay(trace: str, trace_format: str | None) -> str:
    """``sim.config.default_replay``, said on stderr when it is the open loop."""
    from sim.config import default_replay as default

    replay = default(trace, trace_format)
    if replay == "open":
        what = ("synthetic:prefix-groups replays at its arrival times (--replay closed to "
                "run its users as sessions, without qps)" if trace.startswith("synthetic:")
                else "a Mooncake trace replays at its recorded timestamps (--replay closed "
                "to ignore them)")
        stderr.print(f"[dim]--replay open: {what}[/dim]")
    return replay


def warn_idle_replicas(res: RunResult) -> None:
    """A fleet run in which the router left replicas without a request: say how many."""
    s = res.summary
    idle = s.get("idle_replicas")
    if idle:
        n = s["pd_prefill_replicas"] + s["pd_decode_replicas"] if "pd_gpus" in s \
            else s["replicas"]
        by = f"router {s['router']}" + (f", PD rule {s['pd_rule']}" if "pd_rule" in s else "")
        stderr.print(f"[yellow]warning:[/yellow] {res.config.policy_label}: {idle:,} of "
                     f"{n:,} replicas served no request ({by}): the fleet is smaller than "
                     f"it looks")


def warn_saturation(res: RunResult) -> None:
    """An open-loop run whose queue grew for as long as the trace lasted: say so."""
    from sim.studies.saturation import open_loop_saturation

    if res.config.traffic.replay != "open":
        return
    sat = open_loop_saturation(res.request_columns())
    if sat is not None:
        stderr.print(f"[yellow]warning:[/yellow] {res.config.policy_label}: {sat.message()}")


def note_throttled(res: RunResult) -> None:
    """An open loop whose --max-concurrency held sends back: the offered rate was cut, so
    say by how much (sim/replay.py ``throttle_fields``)."""
    n = res.summary.get("concurrency_delayed_requests")
    if n:
        s = res.summary
        stderr.print(f"note: {res.config.policy_label}: --max-concurrency "
                     f"{res.config.traffic.max_concurrency} held back {n:,} of "
                     f"{s['trace_requests']:,} requests (mean wait "
                     f"{s['concurrency_delay_mean_s']:.3g} s): the trace offers "
                     f"{s['offered_send_rate_per_s']:,.2f} requests/s, sent at "
                     f"{s['achieved_send_rate_per_s']:,.2f} requests/s")


def option_spelling(ctx: click.Context) -> Callable[[str], str]:
    """A flat field as the command line spells it: its option (each option's parameter is
    named as its field, sim/config.py ``FLAT``; ``--prompt-nodes`` for checkpoint_chunks)."""
    options = {p.name: max(p.opts, key=len) for p in ctx.command.params
               if isinstance(p, click.Option) and p.name}
    return lambda f: options.get(f, "--" + f.replace("_", "-"))


def refuse_idle_options(ctx: click.Context, cfg: RunConfig) -> None:
    """Options given on the command line that would do nothing in this combination
    (``sim.config.IDLE_RULES``): a user who typed them expects an effect, so say why there is
    none (exit 2) instead of running."""
    from sim.config import idle_fields, spell_fields

    given = [name for name in ctx.params
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    idle = idle_fields(cfg, given)
    if idle:
        field, why = idle[0]
        spell = option_spelling(ctx)
        raise click.UsageError(f"{spell(field)} does nothing here: {spell_fields(why, spell)}")
