"""Reading the data files shipped under npuops/data (chips, error codes, thresholds, compat rows)."""

from __future__ import annotations

import sys
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def load_data_toml(name: str) -> dict[str, Any]:
    """Parse npuops/data/<name>; a broken shipped data file is a bug, so errors propagate."""
    text = (resources.files("npuops") / "data" / name).read_text(encoding="utf-8")
    return tomllib.loads(text)
