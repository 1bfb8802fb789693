"""How costmodel reads its YAML (profiles, catalogs): untrusted input, so only the safe
constructor ever builds the values (plain mappings, lists, strings, numbers), with libyaml's
parser where PyYAML has it (the same values as ``yaml.safe_load``, several times faster:
every run loads a profile of kernel tables)."""

from __future__ import annotations

from typing import Any

import yaml

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, through ``SAFE_LOADER``; raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=SAFE_LOADER)  # a safe loader: never yaml.Loader
