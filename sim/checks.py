"""Checks of a run's inputs that can fail before any simulation: the model and the profile.

``kvsim run`` and ``kvsim sweep`` call these first, so a user mistake costs no simulated work
and always reads as one line naming the file or field (exit status 2).
"""

from __future__ import annotations

from pathlib import Path

from sim.config import ConfigError, RunConfig
from sim.io import InputError, read_yaml


def _profile_file(name: str) -> Path | None:
    from costmodel.profile import derivable

    if derivable(name):  # derived-h100-path/config.json: derived, not a file
        return None
    p = Path(name)
    return p if p.suffix in (".yaml", ".yml", ".json") or p.exists() else None


def check_profile(profile: str | None, model: str) -> None:
    """The profile (a shipped name or a file) loads for ``model``.

    A profile file is first read here as UTF-8 YAML, so binary content or a YAML syntax error
    is one ``InputError`` line naming the file, line and column."""
    from costmodel.profile import load_profile

    if profile is not None:
        path = _profile_file(profile)
        if path is not None:
            read_yaml(path, "profile")
    try:
        load_profile(profile, model)
    except (UnicodeDecodeError, OSError) as e:  # belt and braces: load_profile reads again
        raise InputError(f"{profile}: cannot read the profile: {e}") from None


def check_model_and_profile(cfg: RunConfig, where: str = "config") -> None:
    """The model exists, its KV dtype is known and the profile loads for it (see
    ``check_profile``)."""
    from costmodel.specs import KV_DTYPE_BITS, get_spec

    try:
        get_spec(cfg.cache.model)
    except KeyError as e:
        raise ConfigError(where, "model", str(e.args[0])) from None
    if cfg.cache.kv_dtype not in KV_DTYPE_BITS:
        raise ConfigError(where, "kv_dtype", f"must be one of {', '.join(KV_DTYPE_BITS)}, got "
                                             f"{cfg.cache.kv_dtype!r}")
    check_profile(cfg.cache.profile, cfg.cache.model)
