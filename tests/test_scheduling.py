"""How the suite is spread over xdist workers (tests/support/scheduling.py): groups by what tests share, the
longest first, each group's own order kept."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.http_server import PORT_BLOCK_SIZE, free_port, free_port_run, port_block, worker_index
from tests.support.paths import REPO
from tests.support.scheduling import (
    SERIAL_GROUP,
    UNKNOWN_TEST_S,
    FixtureUse,
    cost_by_group,
    group_of,
    load_durations,
    order,
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


def test_a_module_group_runs_in_one_xdist_worker(tmp_path: Path) -> None:
    """The suite's own scheduler (tests/support/xdist_groups.py) under a real `pytest -n 2 --dist loadgroup`."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from tests.conftest import (pytest_collection_modifyitems, pytest_configure, pytest_configure_node,\n"
        "                            pytest_xdist_make_scheduler)\n")
    seen = tmp_path / "seen"
    (tmp_path / "test_kept.py").write_text(
        "import os, time, pytest\n"
        f"def note(kind):\n    open({str(seen)!r}, 'a').write(kind + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        "@pytest.fixture(scope='module')\ndef kept():\n    return 1\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_kept(kept, i):\n    note('kept')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_alone(i):\n    time.sleep(0.3)\n    note('alone')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "--no-loadscope-reorder", str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    lines = [line.split() for line in seen.read_text().splitlines()]
    kept_workers = {worker for kind, worker in lines if kind == "kept"}
    assert len([1 for kind, _ in lines if kind == "kept"]) == 6 and len(kept_workers) == 1, lines
    assert {worker for _, worker in lines} == {"gw0", "gw1"}, lines  # the others were spread
