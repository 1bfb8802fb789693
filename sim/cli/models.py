"""``kvsim models``: the registered model specs and what the cost model derives from them."""

from __future__ import annotations

import click
from rich.table import Table

from costmodel.profile import default_profile_name, shipped_profiles
from costmodel.specs import get_spec, model_names

from .common import console, emit_json


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def models_cmd(as_json: bool) -> None:
    """Model specs: shapes, W (Section 2.2), KV bytes per token, attention kinds."""
    rows = []
    profiles = set(shipped_profiles())
    for name in model_names():
        s = get_spec(name).summary()
        p = default_profile_name(name)
        s["default_profile"] = p if p in profiles else None
        rows.append(s)
    if as_json:
        emit_json({"models": rows})
        return
    t = Table(title="kvsim models (W = per-token linear+FFN work in query-key-pair units)")
    for col in ("model", "layers", "q/kv heads", "head_dim", "FFN", "W", "KV bytes/token",
                "attention", "max context"):
        t.add_column(col, justify="left" if col in ("model", "attention", "FFN") else "right")
    for s in rows:
        ffn = (f"{s['experts']}x{s['expert_ffn']} (top-{s['active_experts']})" if s["experts"]
               else str(s["ffn"]))
        attn = "full" if not s["sliding_attention_layers"] else (
            f"{s['full_attention_layers']} full + {s['sliding_attention_layers']} "
            f"sliding ({', '.join(map(str, s['windows']))})")
        t.add_row(s["name"], str(s["layers"]), f"{s['q_heads']}/{s['kv_heads']}",
                  str(s["head_dim"]), ffn, f"{s['W']:,.0f}", f"{s['kv_bytes_per_token']:,}",
                  attn, f"{s['max_context']:,}")
    console().print(t)
