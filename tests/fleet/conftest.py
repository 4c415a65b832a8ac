"""Helpers for the fleet tests: recorded events, the venv's own tools, loopback-only inventories."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from npuops.fleet.host_results import EventCollector, PlaybookRun

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
PLAYBOOKS = HERE / "playbooks"
INVENTORIES = HERE / "inventories"
# The npuops and ansible-playbook of the interpreter running the tests (the project venv).
VENV_BIN = Path(sys.executable).parent
NPUOPS = str(VENV_BIN / "npuops")


def recorded(name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))["events"]
    return events


def replay(name: str, *, rc: int = 0, status: str = "successful") -> PlaybookRun:
    """A PlaybookRun folded from a recording, as run_playbook would build it."""
    collector = EventCollector()
    for raw in recorded(name):
        collector.add(raw)
    return collector.finish(playbook=Path(f"{name}.yml"), rc=rc, status=status, artifacts=Path("/artifacts"),
                            duration_s=0.0)


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    return tmp_path / "artifacts"
