"""``kvsim models``: the registered model specs and what the cost model derives from them."""

from __future__ import annotations

import click

from costmodel.profile import DERIVED_PREFIX, default_profile_name, shipped_profiles
from costmodel.specs import all_model_names, get_spec
from sim.report.tables import Col, narrow_table

from .common import console, emit_json

COLUMNS = [Col("model", "name"), Col("layers", "layers", "int"),
           Col("q/kv\nheads", "heads", "text"), Col("head\ndim", "head_dim", "int"),
           Col("FFN", "ffn_shape"), Col("W", "W", "int"),
           Col("KV bytes\nper token", "kv_bytes_per_token", "int"),
           Col("sliding\nlayers", "sliding"), Col("max\ncontext", "max_context", "int")]


def ffn_shape(s: dict) -> str:
    """``E x width top-k`` for an MoE, ``+W`` its shared experts, ``(N dense)`` its dense
    layers; the width for a dense model."""
    if not s["experts"]:
        return str(s["ffn"])
    return (f"{s['experts']}x{s['expert_ffn']} top-{s['active_experts']}"
            + (f" +{s['ffn']}" if s["ffn"] else "")
            + (f" ({s['dense_layers']} dense)" if s["dense_layers"] else ""))


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def models_cmd(as_json: bool) -> None:
    """Model specs: shapes, W (Section 2.2), KV bytes per token, attention kinds."""
    rows = []
    profiles = set(shipped_profiles())
    for name in all_model_names():
        s = get_spec(name).summary()
        p = default_profile_name(name)
        s["default_profile"] = p if p in profiles else DERIVED_PREFIX + name  # derived
        rows.append(s)
    if as_json:
        emit_json({"models": rows})
        return
    shown = [{**s, "heads": f"{s['q_heads']}/{s['kv_heads']}", "W": round(s["W"]),
              "ffn_shape": ffn_shape(s),
              "sliding": (f"{s['sliding_attention_layers']} "
                          f"({', '.join(map(str, s['windows']))})"
                          if s["sliding_attention_layers"] else "-")} for s in rows]
    console().print(narrow_table("kvsim models (W = per-token linear+FFN work in query-key-pair "
                                 "units; sliding layers with their window in tokens, the others "
                                 "attend in full)", COLUMNS, shown))
