"""The pytest-xdist scheduler of this suite: xdist's load-scope scheduling with each test's scope taken from the
groups the workers computed (tests/support/scheduling.py), in the order they collected.

xdist's own `xdist_group` mark works by appending `@group` to a test's private `_nodeid`, which pytest 9.2 no
longer reads (node ids became structured), so the tests of a group would be spread over the workers and each
would boot its own systemd and start its own engine. Instead each worker writes `test id -> group` to a file the
controller named (`pytest_configure_node`), before it reports its collection; the controller's scheduler reads it
when every worker has collected, so no private attribute is involved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_KEY = "npuops_groups_dir"


class GroupScheduling(LoadScopeScheduling):
    """One work unit per group (its tests in collection order), the ungrouped tests one unit each."""

    def __init__(self, config: pytest.Config, log: Any, groups_dir: Path) -> None:
        super().__init__(config, log)
        self.groups_dir = groups_dir
        self.groups: dict[str, str] = {}

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed:
            for path in sorted(self.groups_dir.glob("*.json")):
                self.groups.update(json.loads(path.read_text(encoding="utf-8")))
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        group = self.groups.get(nodeid)
        return f"group:{group}" if group is not None else nodeid


def write_worker_groups(config: pytest.Config, groups: dict[str, str | None]) -> None:
    """In a worker: its `test id -> group` map where the controller will read it (nothing outside xdist)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or GROUPS_KEY not in workerinput:
        return
    target = Path(workerinput[GROUPS_KEY]) / f"{workerinput.get('workerid', os.getpid())}.json"
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps({k: v for k, v in groups.items() if v is not None}), encoding="utf-8")
    temporary.replace(target)
