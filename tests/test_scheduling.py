"""How the suite is spread over xdist workers (tests/support/scheduling.py): groups by what tests share, the
longest first, each group's own order kept."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.support.http_server import PORT_BLOCK_SIZE, free_port, free_port_run, port_block, worker_index
from tests.support.scheduling import (
    SERIAL_GROUP,
    UNKNOWN_TEST_S,
    FixtureUse,
    cost_by_group,
    group_of,
    load_durations,
    order,
    split_group,
)

MODULE = "tests/engine/test_bench.py"


def test_a_shared_resource_names_the_group_whatever_else_the_test_uses() -> None:
    uses = [FixtureUse("instance", "module", MODULE), FixtureUse("serving_node", "session", "tests/systemd")]
    assert group_of(MODULE, uses, serial=False) == "systemd-node"
    assert group_of(MODULE, [FixtureUse("running_engine", "session", "tests/engine")], serial=True) == "engine"


def test_a_module_scoped_fixture_keeps_the_module_together() -> None:
    assert group_of(MODULE, [FixtureUse("instance", "module", MODULE)], serial=False) == MODULE
    # A session fixture the module defines for itself is kept for the module alone: the same.
    assert group_of(MODULE, [FixtureUse("correct_run", "session", MODULE)], serial=False) == MODULE


def test_per_worker_session_fixtures_and_function_fixtures_do_not_group() -> None:
    conftest_session = FixtureUse("tiny_model", "session", "tests/engine")
    cheap = FixtureUse("engine_python", "session", MODULE)
    function = FixtureUse("tmp_path", "function", "")
    assert group_of(MODULE, [conftest_session, cheap, function], serial=False) is None
    assert group_of(MODULE, [function], serial=True) == SERIAL_GROUP


def test_order_puts_the_longest_group_first_and_keeps_each_groups_order() -> None:
    items = [("a::1", None), ("g::1", "g"), ("h::1", "h"), ("g::2", "g"), ("b::1", None), ("h::2", "h")]
    durations = {"a::1": 30.0, "g::1": 10.0, "g::2": 25.0, "h::1": 40.0, "h::2": 1.0, "b::1": 0.1}
    ranked = [items[i][0] for i in order(items, durations)]
    # g: 35 s, h: 41 s, a: 30 s, b: 0.1 s.
    assert ranked == ["h::1", "h::2", "g::1", "g::2", "a::1", "b::1"]


def test_order_counts_an_unrecorded_test_as_a_fast_one_and_is_stable() -> None:
    items = [("new::1", None), ("old::1", None), ("new::2", None)]
    ranked = order(items, {"old::1": UNKNOWN_TEST_S / 2})
    assert [items[i][0] for i in ranked] == ["new::1", "new::2", "old::1"]


def test_split_group_follows_xdists_rule() -> None:
    assert split_group("tests/x.py::t@engine") == ("tests/x.py::t", "engine")
    assert split_group("tests/x.py::t[a@b]") == ("tests/x.py::t[a@b]", None)
    assert split_group("tests/x.py::t[a@b]@tests/x.py") == ("tests/x.py::t[a@b]", "tests/x.py")


def test_cost_by_group_adds_up_each_group() -> None:
    rows = cost_by_group({"a": 1.0, "b": 2.0, "c": 4.0}, {"a": "g", "b": "g", "c": None})
    assert rows == [("(scheduled alone)", 1, 4.0), ("g", 2, 3.0)]


def test_load_durations_reads_the_record_and_tolerates_none(tmp_path: Path) -> None:
    assert load_durations(tmp_path / "missing.json") == {}
    record = tmp_path / "durations.json"
    record.write_text(json.dumps({"tests/x.py::t": 1.5}), encoding="utf-8")
    assert load_durations(record) == {"tests/x.py::t": 1.5}


def test_worker_port_blocks_are_disjoint_and_below_the_ephemeral_range() -> None:
    blocks = [port_block(i) for i in range(4)]
    for first, second in itertools.pairwise(blocks):
        assert first.stop <= second.start
    assert all(len(b) == PORT_BLOCK_SIZE for b in blocks)
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert blocks[3].stop <= low


def test_under_xdist_free_ports_come_from_the_workers_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    block = port_block(1)
    ports = [free_port() for _ in range(5)]
    assert all(p in block for p in ports) and len(set(ports)) == 5
    first = free_port_run(4)
    assert all(first + i in block for i in range(4))
    assert free_port() not in range(first, first + 4)  # the run is the caller's
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert worker_index() is None
