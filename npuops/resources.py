"""Where the shipped trees (templates/, playbooks/, checks/) are at run time.

In a wheel they sit inside the package (setup copies them there: templates and playbooks as
package data, checks as the npuops.checks package). In a source checkout, including an
editable install, they sit beside the package at the top of the repository.
"""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

from npuops.errors import EnvironmentMissingError

SHIPPED_TREES = ("templates", "playbooks", "checks")


def shipped_dir(name: str) -> Path:
    if name not in SHIPPED_TREES:
        raise ValueError(f"unknown shipped tree {name!r}")
    if name == "checks":
        # The checks are a package of their own (npuops.checks, from checks/): found by name, not imported here.
        spec = importlib.util.find_spec("npuops.checks")
        if spec is not None and spec.submodule_search_locations:
            return Path(next(iter(spec.submodule_search_locations)))
    inside = Path(str(resources.files("npuops"))) / name
    if inside.is_dir():
        return inside
    beside = Path(__file__).resolve().parent.parent / name
    if beside.is_dir():
        return beside
    raise EnvironmentMissingError(
        f"npuops' {name}/ directory is missing from this installation",
        "reinstall npuops (pip install --force-reinstall npuops)",
    )
