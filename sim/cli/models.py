"""``kvsim models``: the registered model specs and what the cost model derives from them."""

from __future__ import annotations

import click

from costmodel.profile import DERIVED_PREFIX, default_profile_name, shipped_profiles
from costmodel.specs import KV_DTYPE_BITS, all_model_names, get_spec
from sim.report.tables import Col, narrow_table

from .common import console, emit_json

COLUMNS = [Col("model", "name"), Col("q/kv\nheads", "heads", "text"),
           Col("FFN", "ffn_shape"), Col("W", "W", "int"),
           Col("layers by KV\ncache group", "groups_text", "text"),
           Col("KV bytes\nper token", "kv_bytes_per_token", "int"),
           Col("at 128K", "kv_bytes_per_token_at_128k", "int"),
           Col("max\ncontext", "max_context", "int")]


def groups_text(s: dict) -> str:
    """One line per KV cache group: ``layers kind(window)`` (``kind/r``: compressed, one
    entry per ``r`` tokens), the state per request of a linear group, ``+indexer N`` (bytes
    per token) for DSA and compressed groups with an indexer."""
    lines = []
    for g in s["groups"]:
        text = f"{g['layers']} {g['kind']}" + (f"({g['window']})" if "window" in g else "")
        if "compress_ratio" in g:
            text += f"/{g['compress_ratio']}"
        if g["state_bytes_per_request"]:
            text += f" {g['state_bytes_per_request'] / 2**20:.1f}MiB/req"
        if g.get("indexer_bytes_per_token"):
            text += f" +indexer {g['indexer_bytes_per_token']}"
        lines.append(text)
    return "\n".join(lines)


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
@click.option("--kv-dtype", type=click.Choice(list(KV_DTYPE_BITS)), default="bf16",
              show_default=True, help="KV cache element type the bytes are counted in.")
def models_cmd(as_json: bool, kv_dtype: str) -> None:
    """Model specs: architecture, shapes, W (Section 2.2), KV cache groups (docs/hybrid.md)
    and KV bytes per token: what one token writes over every group, and per token of a
    128K-token request (windowed groups hold only their window; linear-attention state left
    out)."""
    rows = []
    profiles = set(shipped_profiles())
    for name in all_model_names():
        spec = get_spec(name).with_kv_dtype(kv_dtype)
        s = spec.summary()
        s["architecture"] = spec.architecture  # config.json architectures[0] ("": not stated)
        p = default_profile_name(name)
        s["default_profile"] = p if p in profiles else DERIVED_PREFIX + name  # derived
        rows.append(s)
    if as_json:
        emit_json({"models": rows})
        return
    shown = [{**s, "heads": f"{s['q_heads']}/{s['kv_heads']}", "W": round(s["W"]),
              "ffn_shape": ffn_shape(s), "groups_text": groups_text(s),
              "kv_bytes_per_token_at_128k": round(s["kv_bytes_per_token_at_128k"])}
             for s in rows]
    console().print(narrow_table(f"kvsim models (W = per-token linear+FFN work in query-key-pair "
                                 f"units; KV cache groups: layers kind(window); KV bytes in "
                                 f"{kv_dtype}, per token written and per token of a 128K "
                                 f"request; docs/hybrid.md)", COLUMNS, shown))
