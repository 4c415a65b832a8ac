"""Fixtures for every test: a fake host tree, the SSH test fleet. The helpers they call live in tests/support/."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.host_tree import make_host_tree
from tests.support.ssh_hosts import FleetSetupError, TestFleet, require_fleets, start_hosts


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
