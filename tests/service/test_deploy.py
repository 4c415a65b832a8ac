"""Refusing collisions, the port and user checks, and stopping a real foreground supervisor stand-in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from npuops.errors import BadInputError, EnvironmentMissingError
from npuops.instance.control import pid_alive, port_taken, stop_foreground
from npuops.instance.record import MANAGER_FOREGROUND, InstanceRecord, read_status
from npuops.instance.state import Stage, SupervisorExit, SupervisorState
from npuops.launch.install import check_ports_free, check_service_user, find_conflicts
from tests.support.instance_records import make_record

# --- find_conflicts -----------------------------------------------------------------------------------------------


def test_same_port_same_host_is_refused(tmp_path: Path) -> None:
    existing = make_record(tmp_path, "old", port=8000)
    with pytest.raises(BadInputError) as error:
        find_conflicts([make_record(tmp_path, "new", port=8000)], [existing])
    assert "port 8000" in error.value.problem and "'old'" in error.value.problem
    assert "--port" in error.value.fix


def test_other_port_is_fine(tmp_path: Path) -> None:
    find_conflicts([make_record(tmp_path, "new", port=8001)], [make_record(tmp_path, "old", port=8000)])


def test_same_port_on_different_concrete_hosts_is_fine(tmp_path: Path) -> None:
    find_conflicts([make_record(tmp_path, "new", host="10.0.0.5", port=8000)],
                   [make_record(tmp_path, "old", host="127.0.0.1", port=8000)])


@pytest.mark.parametrize(("new_host", "old_host"), [
    ("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "0.0.0.0"), ("::", "10.0.0.5"), ("10.0.0.5", ""), ("0.0.0.0", "::"),
])
def test_wildcard_overlaps_any_host(tmp_path: Path, new_host: str, old_host: str) -> None:
    with pytest.raises(BadInputError, match="port 8000"):
        find_conflicts([make_record(tmp_path, "new", host=new_host, port=8000)],
                       [make_record(tmp_path, "old", host=old_host, port=8000)])


def test_shared_devices_are_refused(tmp_path: Path) -> None:
    existing = make_record(tmp_path, "old", port=8000, devices=(2, 3, 4, 5), target_kind="npu")
    new = make_record(tmp_path, "new", port=8001, devices=(0, 1, 2, 3), target_kind="npu")
    with pytest.raises(BadInputError) as error:
        find_conflicts([new], [existing])
    assert "NPU device(s) 2,3" in error.value.problem and "'old'" in error.value.problem
    assert "npuops stop old" in error.value.fix


def test_disjoint_devices_and_cpu_instances_are_fine(tmp_path: Path) -> None:
    find_conflicts([make_record(tmp_path, "new", port=8001, devices=(4, 5))],
                   [make_record(tmp_path, "old", port=8000, devices=(0, 1)),
                    make_record(tmp_path, "cpu", port=8002, devices=())])
    find_conflicts([make_record(tmp_path, "new-cpu", port=8003)], [make_record(tmp_path, "cpu", port=8002)])


def test_same_name_is_a_replacement(tmp_path: Path) -> None:
    old = make_record(tmp_path, "demo", port=8000, devices=(0, 1))
    find_conflicts([make_record(tmp_path, "demo", port=8000, devices=(0, 1))], [old])


def test_replacement_still_collides_with_the_others(tmp_path: Path) -> None:
    existing = [make_record(tmp_path, "demo", port=8000), make_record(tmp_path, "other", port=9000)]
    with pytest.raises(BadInputError, match="'other'"):
        find_conflicts([make_record(tmp_path, "demo", port=9000)], existing)


def test_every_new_record_is_checked(tmp_path: Path) -> None:
    new = [make_record(tmp_path, "demo-r0", port=8000, devices=(0,)),
           make_record(tmp_path, "demo-r1", port=8001, devices=(1,))]
    with pytest.raises(BadInputError, match="NPU device"):
        find_conflicts(new, [make_record(tmp_path, "old", port=9000, devices=(1,))])


# --- ports and users ----------------------------------------------------------------------------------------------

def test_port_taken_while_something_listens() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        assert port_taken("127.0.0.1", port) is True
        assert port_taken("0.0.0.0", port) is True
    finally:
        listener.close()
    assert port_taken("127.0.0.1", port) is False


def test_check_ports_free(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with pytest.raises(BadInputError, match=f"port {port} on 127.0.0.1 is taken"):
            check_ports_free([make_record(tmp_path, port=port)])


def test_service_user_root_exists() -> None:
    check_service_user("root")


def test_missing_service_user() -> None:
    name = f"npuops-nobody-{uuid.uuid4().hex[:8]}"
    with pytest.raises(EnvironmentMissingError) as error:
        check_service_user(name)
    assert name in error.value.problem
    assert "useradd" in error.value.fix and name in error.value.fix


# --- stopping a foreground supervisor -----------------------------------------------------------------------------

# Stands in for `npuops run NAME` in a terminal: writes its status file, and on SIGTERM records a stopped exit.
SUPERVISOR_STAND_IN = textwrap.dedent("""\
    import json, os, signal, sys

    status_file = sys.argv[1]

    def write(state):
        with open(status_file + ".tmp", "w") as handle:
            json.dump(state, handle)
        os.replace(status_file + ".tmp", status_file)

    def on_term(signum, frame):
        write({"supervisor_pid": os.getpid(), "stage": "stopping", "exit": {"reason": "stopped", "code": 0}})
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    write({"supervisor_pid": os.getpid(), "stage": "healthy", "exit": None})
    while True:
        signal.pause()
""")


def _foreground_record(tmp_path: Path) -> InstanceRecord:
    record = make_record(tmp_path, manager=MANAGER_FOREGROUND)
    Path(record.status_file).parent.mkdir(parents=True, exist_ok=True)
    return record


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)


def _wait_for_status(record: InstanceRecord, child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while read_status(record) is None:
        assert child.poll() is None, "the stand-in died before writing its status"
        assert time.monotonic() < deadline, "the stand-in never wrote its status"
        time.sleep(0.01)


def test_stop_foreground_stops_a_live_supervisor(tmp_path: Path,
                                                 children: list[subprocess.Popen[bytes]]) -> None:
    record = _foreground_record(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", SUPERVISOR_STAND_IN, record.status_file])
    children.append(child)
    _wait_for_status(record, child)
    assert read_status(record) == SupervisorState("", child.pid, stage=Stage.HEALTHY)

    assert stop_foreground(record, timeout_s=15) is True
    assert child.wait(timeout=10) == 0  # it exited through its SIGTERM handler
    assert not pid_alive(child.pid)
    status = read_status(record)
    assert status is not None and status.exit == SupervisorExit(0, "stopped")


def test_stop_foreground_leaves_a_supervisor_that_already_exited(
        tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    # The status says it exited: the pid may already belong to something else, so it is not signalled.
    record = _foreground_record(tmp_path)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    children.append(bystander)
    Path(record.status_file).write_text(json.dumps(
        {"supervisor_pid": bystander.pid, "exit": {"reason": "engine-exited", "code": 1}}), encoding="utf-8")
    assert stop_foreground(record, timeout_s=0) is True
    assert bystander.poll() is None


def test_stop_foreground_without_a_live_pid(tmp_path: Path) -> None:
    record = _foreground_record(tmp_path)
    # timeout 0: a live pid would make it return False, so True proves it did not wait for anything.
    assert stop_foreground(record, timeout_s=0) is True  # no status file at all
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    for status in ({"supervisor_pid": dead.pid, "exit": None}, {"supervisor_pid": None}, {"supervisor_pid": "1"},
                   {"stage": "healthy"}):
        Path(record.status_file).write_text(json.dumps(status), encoding="utf-8")
        assert stop_foreground(record, timeout_s=0) is True, status


def test_stop_foreground_gives_up_on_a_supervisor_that_ignores_sigterm(
        tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    record = _foreground_record(tmp_path)
    stubborn = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import json, os, signal, sys
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(sys.argv[1], "w") as handle:
            json.dump({"supervisor_pid": os.getpid(), "exit": None}, handle)
        while True:
            signal.pause()
    """), record.status_file])
    children.append(stubborn)
    _wait_for_status(record, stubborn)
    assert stop_foreground(record, timeout_s=0.3) is False
    assert stubborn.poll() is None


def test_pid_alive() -> None:
    assert pid_alive(os.getpid()) is True
    assert pid_alive(None) is False
    assert pid_alive(0) is False
