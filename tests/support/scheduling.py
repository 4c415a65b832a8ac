"""How the suite is spread over pytest-xdist workers (`-n 2 --dist loadgroup --no-loadscope-reorder`).

Each expensive thing is started once per purpose, so the tests that share one must run in one worker: the suite's
scheduler (tests/support/xdist_groups.py) sends the tests of one group to one worker, in collection order.
`group_of` names an item's group:

- a test that uses a shared resource of the session (one booted systemd serving node, one running engine) joins
  that resource's group: one boot, one engine, whichever worker takes it;
- a test whose module (or class) keeps something between its tests (a module-scoped fixture: a launched instance,
  a built package set, a fleet) joins its module's group, so the module's fixtures are set up once;
- a test marked `serial(reason)` (it shares something of this machine with the other tests so marked, a fixed
  port or path: the reason says what) joins the one group `serial`, so no two of them run at once (no test
  needs it today: ports come from a block per worker, state from pytest's per-worker temp dirs);
- every other test is scheduled on its own.

`order` then puts the groups with the most recorded time first (tests/durations.json, written by a run with
NPUOPS_TEST_DURATIONS=FILE, see docs/testing.md), which is the longest-processing-time rule: the long groups start at
once on both workers and the short tests fill the gaps at the end. Within a group the collection order is kept
(the systemd modules run in order, each leaving the node as the next expects).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Session fixtures that start something costly and that tests of several modules share (fixture -> group).
SHARED_RESOURCES: Mapping[str, str] = {
    "serving_node": "systemd-node",  # real systemd booted as PID 1, npuops installed in it (tests/systemd)
    "running_engine": "engine",  # one `vllm serve` of the tiny model (tests/engine)
}
# Fixtures of a wider scope that hold nothing costly: sharing them is no reason to group.
CHEAP_FIXTURES = frozenset({"engine_python", "tmp_path_factory", "worker_id", "testrun_uid", "monkeypatch"})
KEPT_SCOPES = frozenset({"session", "package", "module", "class"})
SERIAL_GROUP = "serial"
# The time of a test that tests/durations.json does not know yet (a new test): a fast one's.
UNKNOWN_TEST_S = 0.5


@dataclass(frozen=True)
class FixtureUse:
    """One fixture an item uses: its name, its scope and where it is defined (a conftest or the test module)."""

    name: str
    scope: str
    defined_in: str


def group_of(module: str, fixtures: Iterable[FixtureUse], serial: bool) -> str | None:
    """The xdist group of a test in `module` (its path) that uses `fixtures`, or None to schedule it alone. Pure."""
    uses = list(fixtures)
    for use in uses:
        if use.name in SHARED_RESOURCES:
            return SHARED_RESOURCES[use.name]
    if serial:
        return SERIAL_GROUP
    for use in uses:
        if use.name in CHEAP_FIXTURES or use.scope not in KEPT_SCOPES:
            continue
        # A fixture kept for a module's tests, or a session fixture the module defines for itself. A session
        # fixture of a conftest (the tiny model) is made once per worker anyway: no reason to group.
        if use.scope != "session" or use.defined_in == module:
            return module
    return None


def load_durations(path: Path) -> dict[str, float]:
    """Recorded seconds per test id (setup + call + teardown), or {} where there is no such file yet."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


def order(items: Sequence[tuple[str, str | None]], durations: Mapping[str, float]) -> list[int]:
    """The run order of items given as (test id, group): their indexes, longest recorded time first, where a group
    counts as one block (its tests' times added up) that keeps its collection order. Pure."""
    group_time: dict[str, float] = {}
    first_index: dict[str, int] = {}
    for index, (test_id, group) in enumerate(items):
        key = group if group is not None else f"\0{test_id}"
        group_time[key] = group_time.get(key, 0.0) + durations.get(test_id, UNKNOWN_TEST_S)
        first_index.setdefault(key, index)

    def rank(index: int) -> tuple[float, int, int]:
        test_id, group = items[index]
        key = group if group is not None else f"\0{test_id}"
        return (-group_time[key], first_index[key], index)

    return sorted(range(len(items)), key=rank)


def cost_by_group(durations: Mapping[str, float], groups: Mapping[str, str | None]) -> list[tuple[str, int, float]]:
    """(group, tests, seconds) for each group, the ungrouped tests as one row `(scheduled alone)`, longest first."""
    rows: dict[str, list[float]] = {}
    for test_id, seconds in durations.items():
        rows.setdefault(groups.get(test_id) or "(scheduled alone)", []).append(seconds)
    return sorted(((name, len(times), sum(times)) for name, times in rows.items()), key=lambda row: -row[2])
