"""Fixtures for every test: a fake host tree, the SSH test fleet; and how tests are spread over pytest-xdist's
workers (tests/support/scheduling.py). The helpers they call live in tests/support/."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.host_tree import make_host_tree
from tests.support.paths import REPO
from tests.support.scheduling import FixtureUse, cost_by_group, group_of, load_durations, order
from tests.support.ssh_hosts import FleetSetupError, TestFleet, require_fleets, start_hosts
from tests.support.xdist_groups import GROUPS_KEY, GroupScheduling, write_worker_groups

DURATIONS = REPO / "tests" / "durations.json"
# NPUOPS_TEST_DURATIONS=FILE: write this run's seconds per test there (copied to tests/durations.json, it orders
# the next runs).
RECORD_ENV = "NPUOPS_TEST_DURATIONS"
_seconds: dict[str, float] = {}
_groups: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial(reason): shares something of this machine with the other tests so "
                            "marked (the reason says what); they run in one xdist worker, one after another")


def _fixture_uses(item: pytest.Item) -> list[FixtureUse]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    uses = []
    for name in info.names_closure:
        definitions = info.name2fixturedefs.get(name) or ()
        if definitions:
            last = definitions[-1]
            uses.append(FixtureUse(name, last.scope, last.baseid))
    return uses


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests that share an expensive thing into one xdist worker and put the longest groups first
    (tests/support/scheduling.py)."""
    keyed = []
    for item in items:
        group = group_of(item.nodeid.split("::")[0], _fixture_uses(item),
                         serial=item.get_closest_marker("serial") is not None)
        keyed.append((item.nodeid, group))
        _groups[item.nodeid] = group
    ranked = order(keyed, load_durations(DURATIONS))
    items[:] = [items[i] for i in ranked]
    write_worker_groups(config, {item.nodeid: _groups[item.nodeid] for item in items})


def pytest_configure_node(node: Any) -> None:
    """xdist's controller, for each worker: where the worker writes the groups it computed."""
    groups_dir = Path(node.config._tmp_path_factory.getbasetemp()) / "xdist-groups"
    groups_dir.mkdir(exist_ok=True)
    node.workerinput[GROUPS_KEY] = str(groups_dir)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling | None:
    """`--dist loadgroup`: the suite's own grouping (tests/support/xdist_groups.py); any other mode as xdist has it."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return GroupScheduling(config, log, Path(config._tmp_path_factory.getbasetemp()) / "xdist-groups")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Setup, call and teardown seconds of each test (in xdist's controller: of every worker's tests)."""
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Where the run's time went, by the shared thing each group starts; and the record, if asked for."""
    if hasattr(config, "workerinput") or not _seconds:
        return
    groups = dict(_groups)
    for path in (Path(config._tmp_path_factory.getbasetemp()) / "xdist-groups").glob("*.json"):
        groups.update(json.loads(path.read_text(encoding="utf-8")))  # the workers' (xdist's controller collects none)
    rows = cost_by_group(_seconds, groups)
    terminalreporter.write_sep("=", "time by group (tests sharing what they start; tests/support/scheduling.py)")
    for name, count, seconds in rows[:15]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {count:5d} tests  {name}")
    target = os.environ.get(RECORD_ENV)
    if target:
        Path(target).write_text(json.dumps({k: round(v, 2) for k, v in sorted(_seconds.items())}, indent=0) + "\n",
                                encoding="utf-8")
        terminalreporter.write_line(f"seconds per test written to {target}")


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """An empty host tree (root for Settings) with the directories npuops reads."""
    return make_host_tree(tmp_path / "root")


@pytest.fixture
def ssh_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., TestFleet]]:
    """A factory: `fleet = ssh_fleet(3)` (or `ssh_fleet(2, overlay=False)`). Every fleet it started is closed
    after the test (and close() checks that nothing is left). Skips or fails as `require_fleets` says."""
    require_fleets()
    fleets: list[TestFleet] = []

    def start(n: int = 3, *, overlay: bool = True) -> TestFleet:
        fleet = start_hosts(n, tmp_path_factory.mktemp("ssh-fleet"), overlay=overlay)
        fleets.append(fleet)
        return fleet

    yield start
    errors = []
    for fleet in reversed(fleets):
        try:
            fleet.close()
        except FleetSetupError as exc:
            errors.append(str(exc))
    if errors:
        raise FleetSetupError("; ".join(errors))
