"""Recorded ansible-runner events (tests/fleet/fixtures/*.json) and the PlaybookRun they fold into."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from npuops.fleet.host_results import EventCollector, PlaybookRun
from tests.support.paths import FLEET_RECORDINGS


def recorded(name: str) -> list[dict[str, Any]]:
    """The events of the recording `name`."""
    events: list[dict[str, Any]] = json.loads((FLEET_RECORDINGS / f"{name}.json").read_text(encoding="utf-8"))["events"]
    return events


def replay(name: str, *, rc: int = 0, status: str = "successful") -> PlaybookRun:
    """A PlaybookRun folded from a recording, as run_playbook would build it."""
    collector = EventCollector()
    for raw in recorded(name):
        collector.add(raw)
    return collector.finish(playbook=Path(f"{name}.yml"), rc=rc, status=status, artifacts=Path("/artifacts"),
                            duration_s=0.0)
