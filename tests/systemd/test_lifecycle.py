"""The whole service lifecycle under real systemd as PID 1 (tests/support/systemd.py), with the real vLLM CPU engine
and the tiny model: npuops launch installs and starts the hardened unit as the unprivileged service user; a crash
is restarted; a hang is killed and restarted by systemd's watchdog; exec failures and the start limit are
diagnosed; the start gate refuses what it must; status, logs and list read systemd and the journal; stop drains
the answers in flight and leaves nothing behind; a reboot brings an enabled instance back.

The tests of a module share one booted systemd and run in order: each leaves the node as the next expects.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.http_server import free_port
from tests.support.streams import DRAIN_STREAMS, DRAIN_TOKENS, StreamedAnswer, drained_as_the_engine_said
from tests.support.systemd import SERVICE_USER, ServingNode

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.systemd]

NAME = "sd"
WATCHDOG_S = 10
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _json(done: Any) -> dict[str, Any]:
    assert done.stdout.strip(), (done.returncode, done.stderr[-4000:])
    return json.loads(done.stdout)


def status(node: ServingNode, name: str = NAME) -> dict[str, Any]:
    data = _json(node.npuops("status", name, "--json", timeout=120))
    return data["instances"][0]


def wait_for(what: str, condition: Callable[[], Any], timeout: float, poll: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll)


def completion(port: int, tokens: int = 4) -> dict[str, Any]:
    body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": tokens, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with DIRECT.open(request, timeout=120) as answer:
        return json.loads(answer.read())


def uid_of(node: ServingNode, pid: int) -> int:
    """The real uid of a process inside the namespace."""
    text = node.systemd.check(["cat", f"/proc/{pid}/status"])
    match = re.search(r"^Uid:\s+(\d+)", text, re.M)
    assert match, text
    return int(match.group(1))


def engine_pid(node: ServingNode, name: str = NAME) -> int:
    """The engine's pid inside the namespace: the supervisor's child, as its status file records it."""
    state = json.loads((node.systemd.root / f"var/lib/npuops-{name}/supervisor.json").read_text())
    return int(state["engine_pid"])


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


def test_launch_installs_a_hardened_unit_that_serves_as_the_service_user(serving_node: ServingNode,
                                                                        port: int) -> None:
    node = serving_node
    done = node.launch(NAME, port, "--watchdog", str(WATCHDOG_S), "--json")
    report = _json(done)
    assert done.returncode == 0 and report["ok"], (report, done.stderr[-4000:])
    entry = report["instances"][0]
    assert entry["first_request"]["ok"] and entry["first_request"]["tokens"] > 0
    # Progress went to stderr as it happened, each stage once.
    assert "starting npuops-sd.service" in done.stderr and "healthy" in done.stderr, done.stderr

    unit = f"npuops-{NAME}.service"
    assert node.systemd.unit_property(unit, "User") == SERVICE_USER
    assert node.systemd.unit_property(unit, "UnitFileState") == "enabled"
    uid = int(node.systemd.check(["id", "-u", SERVICE_USER]).strip())
    supervisor = int(node.systemd.unit_property(unit, "MainPID"))
    assert uid_of(node, supervisor) == uid and uid_of(node, engine_pid(node)) == uid
    answer = completion(port)
    assert answer["usage"]["completion_tokens"] == 4

    # The unit as installed keeps its exposure score low (the rendered file was checked offline; this is systemd's
    # own reading of the loaded unit).
    security = node.systemd.run(["systemd-analyze", "security", "--no-pager", unit])
    score = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
    assert score and float(score.group(1)) <= 2.0, security.stdout[-2000:]

    now = status(node)
    assert now["state"] == "healthy" and now["unit_state"]["restarts"] == 0
    assert now["unit_state"]["main_pid"] == supervisor and now["unit_state"]["since"]


def test_a_killed_engine_is_restarted_by_systemd(serving_node: ServingNode, port: int) -> None:
    node = serving_node
    unit = f"npuops-{NAME}.service"
    before = int(node.systemd.unit_property(unit, "NRestarts"))
    node.systemd.check(["kill", "-KILL", str(engine_pid(node))])
    # The supervisor sees its engine die, diagnoses it, exits 128+9; Restart=on-failure starts it again.
    wait_for("NRestarts grows", lambda: int(node.systemd.unit_property(unit, "NRestarts")) > before, 120)
    wait_for("healthy again", lambda: status(node)["state"] == "healthy", 300, poll=3)
    assert completion(port)["usage"]["completion_tokens"] == 4
    now = status(node)
    assert now["unit_state"]["restarts"] == before + 1
    # Why it was restarted: the supervisor's diagnosis of the last run, kept across the restart.
    assert now["previous_exit"]["reason"] == "engine-exited"
    assert now["previous_exit"]["diagnosis"]["id"] == "signal-sigkill"


def test_a_hung_engine_is_killed_by_the_watchdog_and_restarted(serving_node: ServingNode, port: int) -> None:
    node = serving_node
    unit = f"npuops-{NAME}.service"
    before = int(node.systemd.unit_property(unit, "NRestarts"))
    hung = engine_pid(node)
    stopped_at = time.monotonic()
    node.systemd.check(["kill", "-STOP", str(hung)])
    # /health stops answering, the supervisor withholds WATCHDOG=1, systemd's watchdog fires (WatchdogSec=10):
    # the supervisor, told so (SIGABRT), kills the frozen engine and exits; systemd restarts the unit.
    wait_for("NRestarts grows", lambda: int(node.systemd.unit_property(unit, "NRestarts")) > before, 120)
    restarted_after = time.monotonic() - stopped_at
    assert restarted_after < WATCHDOG_S + 60, restarted_after
    journal = node.systemd.check(["journalctl", "--unit", unit, "--no-pager", "--output", "cat"])
    assert "Watchdog timeout" in journal or "watchdog" in journal.lower(), journal[-3000:]
    wait_for("healthy again", lambda: status(node)["state"] == "healthy", 300, poll=3)
    assert engine_pid(node) != hung
    assert completion(port)["usage"]["completion_tokens"] == 4
    now = status(node)
    assert now["previous_exit"]["reason"] == "hang" and now["previous_exit"]["diagnosis"]["id"] == "hang"
    text = node.npuops("status", NAME).stdout
    assert "restarted after hang" in text, text


def test_status_list_and_logs_read_systemd_and_the_journal(serving_node: ServingNode, port: int) -> None:
    node = serving_node
    listed = _json(node.npuops("list", "--json"))
    assert [(i["name"], i["state"]) for i in listed["instances"]] == [(NAME, "healthy")]
    logs = _json(node.npuops("logs", NAME, "-n", "400", "--json"))
    lines = logs["units"][f"npuops-{NAME}.service"]
    # The journal holds the supervisor's own lines and the engine's log, the diagnoses of the restarts among them.
    assert any(f"npuops[{NAME}]: started the engine" in line for line in lines), lines[-20:]
    assert any("diagnosis [hang]" in line for line in lines), lines[-40:]
    human = node.npuops("logs", NAME, "-n", "5")
    assert human.returncode == 0 and len(human.stdout.splitlines()) == 5, human


def test_logs_follow_streams_the_journal(serving_node: ServingNode, port: int) -> None:
    node = serving_node
    follow = node.systemd.popen([str(node.venv / "bin" / "npuops"), "logs", NAME, "-n", "1", "-f"])
    try:
        # Following once it has printed its first line: the engine logs the request while we follow.
        assert follow.read_until(lambda text: bool(text.strip()), timeout=60).strip()
        completion(port)
        seen = follow.read_until(lambda text: "POST /v1/completions" in text, timeout=60)
    finally:
        follow.stop()
    assert "POST /v1/completions" in seen, seen[-2000:]


def test_an_exec_failure_is_diagnosed_and_the_start_limit_says_how_to_rearm(serving_node: ServingNode,
                                                                           port: int) -> None:
    """The service user deleted under a stopped instance (a node re-imaged, an over-eager cleanup): systemd cannot
    even set up the start gate's process (217/USER), and restarts it until the start limit. The supervisor never
    runs, so the diagnosis is systemd's own, and the start limit says how to re-arm."""
    node = serving_node
    unit = f"npuops-{NAME}.service"
    uid = node.systemd.check(["id", "-u", SERVICE_USER]).strip()
    node.systemd.check(["systemctl", "stop", unit])  # userdel refuses a user whose processes run
    node.systemd.check(["userdel", SERVICE_USER])
    try:
        node.systemd.check(["systemctl", "start", "--no-block", unit])
        waiting = wait_for("a failed start", lambda: (s := status(node))["unit_state"]["start_pre_status"] and s,
                           60, poll=1)
        assert waiting["diagnosis"]["id"] == "systemd-user" and "217/USER" in waiting["diagnosis"]["cause"]
        assert "useradd" in waiting["diagnosis"]["fix"]
        # Restart=on-failure tries again every RestartSec=; the starts of the tests before count towards the
        # limit (StartLimitBurst=5 in 15 minutes), as on a node.
        # Between two tries (a new start attempt under way) the unit has no failure to diagnose yet: None.
        limited = wait_for("the start limit",
                           lambda: (s := status(node))["diagnosis"] and s["diagnosis"]["id"] == "start-limit" and s,
                           180, poll=2)
        assert limited["state"] == "failed" and limited["unit_state"]["active_state"] == "failed"
        diagnosis = limited["diagnosis"]
        assert "217/USER" in diagnosis["cause"] and "useradd" in diagnosis["fix"]
        assert f"systemctl reset-failed {unit} && systemctl start {unit}" in diagnosis["fix"]
        text = node.npuops("status", NAME).stdout
        assert "[start-limit]" in text and "reset-failed" in text, text
    finally:
        node.systemd.check(["useradd", "--system", "--uid", uid, "--no-create-home", "--shell", "/usr/sbin/nologin",
                            SERVICE_USER])
    # Left failed at its start limit: the next test re-arms it as the diagnosis says (and so gets past systemd's
    # setup to the start gate without an engine start of its own).


OTHER = "sd2"


def test_the_start_gate_refuses_a_taken_port_in_the_journal_and_status(serving_node: ServingNode,
                                                                        port: int) -> None:
    """The instance the previous test left at its start limit, re-armed as that diagnosis says while someone else
    holds its port: past systemd's setup, the start gate refuses. Freed, it starts and serves again. A second
    instance is launched beside it (the next tests need both).

    (The refusal is provoked on this stopped instance, not on a second one launched and stopped for it: that cost
    an engine start which proved nothing the gate's refusal does not.)"""
    node = serving_node
    unit = f"npuops-{NAME}.service"
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the stopped engine's socket may linger
    blocker.bind(("127.0.0.1", port))
    blocker.listen()
    try:
        node.systemd.check(["systemctl", "reset-failed", unit])
        node.systemd.check(["systemctl", "start", "--no-block", unit])
        # The status still carries the start-limit diagnosis of before until the gate has run: wait for the gate's.
        refused = wait_for("the gate's refusal", lambda: (s := status(node))["diagnosis"]
                           and s["diagnosis"]["id"] == "gate:port-free" and s, 120, poll=2)
        assert "--port" in refused["diagnosis"]["fix"], refused["diagnosis"]
        journal = node.systemd.check(["journalctl", "--unit", unit, "--no-pager", "--output", "cat"])
        # The refusal names the check, and the line after it says how to fix it.
        assert "refused [port-free]" in journal, journal[-2000:]
        after = journal.rsplit("refused [port-free]", 1)[1].splitlines()
        assert len(after) > 1 and after[1].strip().startswith("fix:"), journal[-2000:]
        assert node.npuops("status", NAME).stdout.count("port-free") >= 1
        # Stopped before the port is freed: Restart= would otherwise retry the gate every RestartSec= and use up
        # the start limit (StartLimitBurst=5) that reset-failed has just re-armed.
        node.systemd.check(["systemctl", "stop", unit])
    finally:
        blocker.close()
    node.systemd.check(["systemctl", "start", "--no-block", unit])
    # The second instance is launched while the first starts: both engines load at once, as at the reboot below.
    other_port = free_port()
    while other_port == port:  # the first engine may not have bound its port yet
        other_port = free_port()
    done = node.launch(OTHER, other_port, "--json")
    assert done.returncode == 0 and _json(done)["ok"], done.stderr[-3000:]
    wait_for("healthy again", lambda: status(node)["state"] == "healthy", 300, poll=3)
    assert completion(port)["usage"]["completion_tokens"] == 4
    assert completion(other_port)["usage"]["completion_tokens"] == 4


def test_stop_ends_the_engine_cleanly_while_another_instance_serves(serving_node: ServingNode, port: int) -> None:
    node = serving_node
    other_port = int(status(node, OTHER)["url"].rsplit(":", 1)[1])
    unit = f"npuops-{NAME}.service"
    cgroup = node.systemd.unit_property(unit, "ControlGroup")
    # The unit's cgroup as this machine mounts the hierarchy systemd uses (unified, or the hybrid's named one).
    candidates = (f"/sys/fs/cgroup{cgroup}/cgroup.procs", f"/sys/fs/cgroup/unified{cgroup}/cgroup.procs",
                  f"/sys/fs/cgroup/systemd{cgroup}/cgroup.procs")
    procs = next(p for p in candidates if node.systemd.run(["cat", p]).stdout.strip())  # cgroupfs sizes are 0
    engine = engine_pid(node)
    assert str(engine) in node.systemd.check(["cat", procs]).split()
    # The stop drains: answers streaming when it begins all finish whole before it returns (the plan's
    # shutdown-timeout, 30 s here, with TimeoutStopSec= above the supervisor's wait).
    assert node.systemd.unit_property(unit, "TimeoutStopUSec") == "1min 45s"
    streams = [StreamedAnswer(port, None, f"stream {i} says", DRAIN_TOKENS) for i in range(DRAIN_STREAMS)]
    for stream in streams:
        stream.start()
    wait_for("answers streaming", lambda: all(s.chunks >= 8 for s in streams), 120, poll=0.2)
    stopped = _json(node.npuops("stop", NAME, "--json"))
    stop_returned = time.monotonic()
    for stream in streams:
        stream.join(60)
    assert stopped["ok"] and stopped["was_running"] == [unit], stopped
    assert all(s.whole() and s.ended_at is not None and s.ended_at <= stop_returned for s in streams), [
        (s.error, s.finish_reason, s.completion_tokens) for s in streams if not s.whole()]
    journal = node.npuops("logs", NAME, "-n", "800").stdout  # the engine's lines and the supervisor's
    assert drained_as_the_engine_said(journal, journal, NAME), journal[-3000:]
    assert node.systemd.unit_property(unit, "ActiveState") == "inactive"
    # SIGTERM reached the engine: it shut down on its own (exit 0), not killed at the stop timeout.
    state = json.loads((node.systemd.root / f"var/lib/npuops-{NAME}/supervisor.json").read_text())
    assert state["exit"]["reason"] == "stopped" and state["exit"]["engine_returncode"] == 0, state["exit"]
    # Nothing of the unit's cgroup is left: no process of it runs.
    leftovers = node.systemd.run(["cat", procs])
    assert leftovers.returncode != 0 or not leftovers.stdout.strip(), leftovers.stdout
    assert node.systemd.run(["kill", "-0", str(engine)]).returncode != 0
    # The other instance kept serving throughout.
    assert completion(other_port)["usage"]["completion_tokens"] == 4
    assert status(node, OTHER)["state"] == "healthy"


def test_a_reboot_brings_enabled_instances_back(serving_node: ServingNode, port: int) -> None:
    """The node's systemd restarted (the namespace powered off and booted again over the same disk): both
    instances are enabled (`npuops stop` leaves them so), so both start at boot and serve without anyone asking."""
    node = serving_node
    other = OTHER
    other_port = int(status(node, other)["url"].rsplit(":", 1)[1])
    boots = node.systemd.boots
    node.systemd.reboot()
    assert node.systemd.boots == boots + 1
    for name in (other, NAME):
        wait_for(f"{name} healthy after the reboot", lambda n=name: status(node, n)["state"] == "healthy", 600,
                 poll=3)
    assert completion(other_port)["usage"]["completion_tokens"] == 4
    assert completion(port)["usage"]["completion_tokens"] == 4
    for name in (other, NAME):
        assert _json(node.npuops("stop", name, "--json"))["ok"]
