"""``kvsim run``'s options of a disaggregated fleet (sim/fleet/pd.py, docs/pd.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from costmodel.links import link_names
from policies.pd_rules import PD_RULES

from .common import SIZE

PD_OPTIONS = ("prefill_replicas", "decode_replicas", "pd_link", "pd_link_scope", "pd_streaming",
              "pd_local_threshold", "decode_cache", "pd_return", "pd_rule", "pd_prealloc")


def pd_options(f: Callable) -> Callable:
    """The PD options, passed on as keyword arguments named like ``RunConfig``'s fields."""
    opts = [
        click.option("--prefill-replicas", type=click.IntRange(min=0), default=0,
                     show_default=True, help="Prefill workers of a disaggregated fleet "
                     "(with --decode-replicas; the prefill worker is chosen by --router)."),
        click.option("--decode-replicas", type=click.IntRange(min=0), default=0,
                     show_default=True, help="Decode workers of a disaggregated fleet."),
        click.option("--pd-link", type=click.Choice(list(link_names())), default="rdma-400",
                     show_default=True, help="The link KV travels over, prefill -> decode "
                     "(costmodel/data/links.yaml; ideal: no time)."),
        click.option("--pd-link-scope", type=click.Choice(["nic", "pair"]), default="nic",
                     show_default=True, help="One FIFO per prefill worker's NIC, or per "
                     "(prefill, decode) pair."),
        click.option("--pd-streaming", type=click.Choice(["off", "layer"]), default="off",
                     show_default=True, help="layer: the transfer starts with the prefill, "
                     "layer by layer."),
        click.option("--pd-local-threshold", type=SIZE, default="0", show_default=True,
                     help="Conditional disaggregation: prefill on the decode worker when "
                     "fewer uncached tokens than this (0: never)."),
        click.option("--decode-cache", type=click.Choice(["on", "off"]), default="on",
                     show_default=True, help="Decode workers keep finished requests' KV "
                     "as a prefix cache."),
        click.option("--pd-return", type=click.Choice(["none", "output"]), default="none",
                     show_default=True, help="output: a finished request's output KV goes "
                     "back to its prefill worker over the link."),
        click.option("--pd-rule", type=click.Choice(list(PD_RULES.names())), default="disagg",
                     show_default=True, help="How a request picks its decode worker and "
                     "whether it is prefilled there (policies/pd_rules.py)."),
        click.option("--pd-prealloc", type=click.Choice(["on", "off"]), default="on",
                     show_default=True, help="on: the decode worker pre-allocates the KV "
                     "before the transfer, as the engines do (SGLang's prealloc queue, "
                     "vLLM's WAITING_FOR_REMOTE_KVS); off: the KV lands unreserved "
                     "(sglang only)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def pd_fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The PD options out of a command's keyword arguments (removed from them)."""
    return {k: kwargs.pop(k) for k in PD_OPTIONS if k in kwargs}
