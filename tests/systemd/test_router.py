"""One endpoint per model under real systemd: `npuops launch --dp 2` starts two replicas of the tiny model on
loopback and vllm-router in front of them on the instance's port, each in its own hardened unit, with the real
vLLM CPU engine and the real vllm-router.

What an operator relies on: every request through the one endpoint succeeds and both replicas serve; a replica
stopped leaves the router serving, not restarted by its watchdog; a replica whose engine is killed mid-run costs
at most the requests in flight on it, is restarted by systemd and put back by the router; the API key is required
at the endpoint and appears on no command line and in no log; status, logs and stop see the router and every
replica.

The tests of this module share one booted systemd (the session's) and run in order.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from npuops.httpclient import http_request
from npuops.monitor.dashboards import every_query
from tests.support.captures import capture
from tests.support.fake_commands import write_fake_tool
from tests.support.http_server import free_port, free_port_run
from tests.support.npuops_cli import npuops_argv
from tests.support.prometheus import Prometheus, Served, start_node_exporter
from tests.support.systemd import ServingNode
from tests.systemd.test_lifecycle import status, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.systemd]

NAME = "rt"
KEY = "rt-key-5b8e1f0c"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
KEY_FILE = Path("/srv/npuops-test/rt.key")
# `npuops monitor render` writes here in the namespace; Prometheus, on this machine, reads it through the root.
MONITOR_DIR = Path("/srv/npuops-test/monitor")


def _request(port: int, prompt: str, *, key: str | None = KEY, tokens: int = 8) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": "tiny-llama", "prompt": prompt, "max_tokens": tokens, "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, headers=headers)
    try:
        with DIRECT.open(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except OSError as exc:
        return 0, {"error": str(exc)}


def _run_requests(port: int, count: int, parallel: int = 8) -> list[int]:
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return [code for code, _ in pool.map(lambda i: _request(port, f"request {i} says"), range(count))]


def _served(port: int) -> float:
    """Requests a replica finished, from its own /metrics (vLLM's counter)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with DIRECT.open(request, timeout=30) as answer:
        text = answer.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:request_success_total\{[^}]*\} ([\d.e+]+)$", text, re.M))


@pytest.fixture(scope="module")
def port() -> int:
    # The router's port, the replicas' (port+1, port+2) and the router's metrics port (port+3).
    return free_port_run(4)


@pytest.fixture(scope="module")
def node_exporter_port() -> int:
    return free_port()


@pytest.fixture(scope="module", autouse=True)
def _monitoring_ends_with_the_module(serving_node: ServingNode) -> Iterator[None]:
    """The session's systemd serves other modules after this one: their launches follow no monitoring."""
    yield
    (serving_node.systemd.root / "etc/npuops/monitor.json").unlink(missing_ok=True)


@dataclass
class Watching:
    prometheus: Prometheus
    node_exporter: Served


@pytest.fixture(scope="module")
def watching(serving_node: ServingNode, node_exporter_port: int, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Watching]:
    """A real Prometheus on the rendered configuration, and node_exporter serving the doctor's textfile, which the
    doctor writes here with npu-smi replaying a recorded 910B1 node (a fake on PATH: no NPU here)."""
    work = tmp_path_factory.mktemp("watching")
    fake = write_fake_tool(work / "bin", "npu-smi", capture("npu-smi-info_910b1_8dev_busy_elided_1.txt"))
    textfiles = work / "textfiles"
    textfiles.mkdir()
    env = {**os.environ, "NPUOPS_NPU_SMI": str(fake), "NPUOPS_STATE_DIR": str(work / "state")}
    argv = npuops_argv("doctor", "--level", "1", "--prometheus", str(textfiles / "npuops-doctor.prom"))
    doctor = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert doctor.returncode in (0, 1), doctor.stderr  # 1: checks fail on this machine (no driver), which is data
    exporter = start_node_exporter(textfiles, work, node_exporter_port)
    try:
        prometheus = Prometheus(serving_node.systemd.root / MONITOR_DIR.relative_to("/") / "prometheus.yml", work)
    except BaseException:
        exporter.close()
        raise
    try:
        yield Watching(prometheus, exporter)
    finally:
        prometheus.close()
        exporter.close()


def _targets(node: ServingNode, job: str) -> list[str]:
    """The parts a rendered target file lists (engines, routers)."""
    path = node.systemd.root / MONITOR_DIR.relative_to("/") / "targets" / f"{job}.json"
    return [g["labels"]["npuops_part"] for g in json.loads(path.read_text())]


def _parts(node: ServingNode) -> dict[str, dict[str, Any]]:
    now = status(node, NAME)
    return {p["name"]: p for p in now.get("parts", [])}


def test_launch_puts_a_router_in_front_of_two_replicas(serving_node: ServingNode, port: int,
                                                       node_exporter_port: int) -> None:
    node = serving_node
    # Monitoring set up first, before anything serves: the launch itself puts its parts in Prometheus' targets.
    rendered = node.npuops("monitor", "render", "--output", str(MONITOR_DIR), "--node-exporter",
                           f"127.0.0.1:{node_exporter_port}", "--scrape-interval", "2", "--json")
    assert rendered.returncode == 0, rendered.stderr
    ours = [f"{NAME}-r0", f"{NAME}-r1"]
    # (The session's systemd may hold other modules' instances: only this one's parts are asserted.)
    assert not set(_targets(node, "engines")) & {*ours, NAME} and NAME not in _targets(node, "routers")
    key_file = node.systemd.root / KEY_FILE.relative_to("/")
    key_file.write_text(KEY + "\n")
    os.chmod(key_file, 0o600)
    done = node.launch(NAME, port, "--dp", "2", "--api-key-file", str(KEY_FILE), "--json", timeout=1500)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], (report, done.stderr[-4000:])
    assert f"monitoring: Prometheus' targets and rules in {MONITOR_DIR} follow the change" in done.stderr
    assert set(ours) <= set(_targets(node, "engines")) and NAME in _targets(node, "routers")
    assert [i["name"] for i in report["instances"]] == [f"{NAME}-r0", f"{NAME}-r1", NAME]
    assert report["instances"][-1]["url"] == f"http://127.0.0.1:{port}"

    router_unit = f"npuops-{NAME}-router.service"
    assert node.systemd.unit_property(router_unit, "ActiveState") == "active"
    security = node.systemd.run(["systemd-analyze", "security", "--no-pager", router_unit])
    score = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
    assert score and float(score.group(1)) <= 2.0, security.stdout[-2000:]
    # The replicas listen on loopback behind the router, on the ports after it.
    for index in range(2):
        config = (node.systemd.root / f"etc/npuops/{NAME}-r{index}/vllm.yaml").read_text()
        assert 'host: "127.0.0.1"' in config and f"port: {port + 1 + index}" in config, config

    now = status(node, NAME)
    assert now["state"] == "healthy" and now["role"] == "router" and now["metrics_port"] == port + 3, now
    assert sorted(_parts(node)) == [f"{NAME}-r0", f"{NAME}-r1"]


def test_the_key_is_required_at_the_endpoint_and_on_no_command_line(serving_node: ServingNode, port: int) -> None:
    node = serving_node
    assert _request(port, "no key", key=None)[0] == 401
    assert _request(port, "wrong key", key="not-the-key")[0] == 401
    assert _request(port + 1, "a replica without the key", key=None)[0] == 401
    code, answer = _request(port, "with the key")
    assert code == 200 and answer["usage"]["completion_tokens"] == 8
    router_pid = int(node.systemd.unit_property(f"npuops-{NAME}-router.service", "MainPID"))
    for line in node.systemd.check(["ps", "-eo", "pid,args", "--no-headers"]).splitlines():
        assert KEY not in line, line
    assert router_pid > 0
    journal = node.systemd.check(["journalctl", "--no-pager", "--output", "cat"])
    assert KEY not in journal


def test_requests_through_the_endpoint_reach_both_replicas(serving_node: ServingNode, port: int) -> None:
    before = [_served(port + 1), _served(port + 2)]
    codes = _run_requests(port, 32)
    assert codes == [200] * 32, codes
    after = [_served(port + 1), _served(port + 2)]
    gained = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(gained) == 32 and all(g > 0 for g in gained), gained
    routed = status(serving_node, NAME)["metrics"]["workers"]
    assert all(w["requests"] and w["healthy"] for w in routed.values()), routed


def _every_panel_query() -> list[str]:
    """The dashboards' queries as Grafana sends them with every value of each variable chosen (its allValue)."""
    return [re.sub(r'=~"\$\w+"', '=~".*"', expr) for expr in every_query()]


def test_prometheus_scrapes_every_target_and_every_panel_has_data(serving_node: ServingNode, port: int,
                                                                   watching: Watching) -> None:
    """Prometheus on what `npuops monitor render` wrote: the two replicas, the router's metrics port and
    node_exporter (the doctor's textfile) all up, with their labels; every panel of the three dashboards answers
    with data once requests flow (the latency quantiles and rates need some), the prediction among them."""
    prometheus = watching.prometheus
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            _run_requests(port, 8, parallel=2)

    flowing = threading.Thread(target=traffic, daemon=True)
    flowing.start()
    try:
        ours = {"npuops-node", NAME, f"{NAME}-r0", f"{NAME}-r1"}

        def part(target: dict[str, Any]) -> str:
            return str(target["labels"].get("npuops_part", target["labels"]["job"]))

        def ours_up() -> bool:
            up = {part(t) for t in prometheus.targets() if t["health"] == "up"}
            return ours <= up

        wait_for("every target of the instance and the node up", ours_up, 120, poll=1)
        by_part = {part(t): t["labels"] for t in prometheus.targets()}
        assert ours <= set(by_part), by_part
        # The session's systemd may hold other modules' instances: a target of theirs is down exactly when
        # npuops says it does not serve (a model that never loads, a part systemd gave up on).
        for target in prometheus.targets():
            if part(target) not in ours and target["health"] != "up":
                instance = target["labels"]["npuops_instance"]
                assert status(serving_node, instance)["state"] != "healthy", (target, instance)
        assert by_part[f"{NAME}-r1"]["role"] == "replica" and by_part[f"{NAME}-r1"]["npuops_instance"] == NAME
        assert by_part[NAME]["role"] == "router" and by_part[NAME]["model"] == "tiny-llama"
        deadline = time.monotonic() + 180
        missing = _every_panel_query()
        while missing and time.monotonic() < deadline:
            time.sleep(3)
            missing = [expr for expr in missing if not prometheus.query(expr)]
        assert not missing, f"panels without data after 180 s: {missing}"
    finally:
        stop.set()
        flowing.join(timeout=300)
    # The doctor's textfile through node_exporter: the chips of the recorded table (chips 0 and 7 of an 8-chip
    # 910B1 node; the capture elides the others).
    chips = prometheus.query('npu_chip_info_health_status{job="npuops-node"}')
    assert sorted(c["metric"]["id"] for c in chips) == ["0", "7"], chips
    assert {c["metric"]["model_name"] for c in chips} == {"910B1"}, chips
    predicted = prometheus.query(f'npuops:predicted_tpot_seconds{{npuops_instance="{NAME}"}}')
    assert len(predicted) == 1 and float(predicted[0]["value"][1]) > 0, predicted


def _router_health(port: int) -> int:
    """The status vllm-router's own /health answers (0: nothing answered)."""
    answer = http_request(f"http://127.0.0.1:{port}/health", timeout=10)
    return answer[0] if answer is not None else 0


def _workers(port: int) -> list[str]:
    """The replicas vllm-router holds (GET /list_workers)."""
    answer = http_request(f"http://127.0.0.1:{port}/list_workers", timeout=10, api_key=KEY)
    assert answer is not None and answer[0] == 200, answer
    return list(json.loads(answer[1])["urls"])


def test_a_replica_down_leaves_the_router_serving_and_its_watchdog_quiet(serving_node: ServingNode,
                                                                         port: int) -> None:
    """A stopped replica first leaves the router (its supervisor, through the router's worker API), so the router
    sends it nothing while it drains, and joins it again once healthy. One that goes away without leaving (killed
    whole here, its restart cancelled) makes vllm-router's own /health answer 503 once its checks take it out: the
    router's supervisor must not take that for a dead router (it would withhold the watchdog pings and systemd
    would kill the endpoint)."""
    node = serving_node
    replica, router = f"npuops-{NAME}-r1.service", f"npuops-{NAME}-router.service"
    r0_url, r1_url = f"http://127.0.0.1:{port + 1}", f"http://127.0.0.1:{port + 2}"
    assert sorted(_workers(port)) == [r0_url, r1_url]
    router_restarts = int(node.systemd.unit_property(router, "NRestarts"))
    node.systemd.check(["systemctl", "stop", replica], timeout=120)
    try:
        assert _workers(port) == [r0_url]  # out before its drain began
        assert _run_requests(port, 8) == [200] * 8
        journal = node.systemd.check(["journalctl", "-u", replica, "-n", "200", "--no-pager"])
        assert f"npuops[{NAME}-r1]: out of router {NAME} (Successfully removed worker: {r1_url})" in journal, journal
    finally:
        node.systemd.check(["systemctl", "start", replica], timeout=300)
    wait_for("r1 back in the router", lambda: sorted(_workers(port)) == [r0_url, r1_url], 400, poll=3)
    wait_for("all healthy again", lambda: status(node, NAME)["state"] == "healthy", 400, poll=3)

    # Gone without leaving: every process of the unit killed, the restart cancelled before RestartSec=.
    node.systemd.check(["systemctl", "kill", "--signal=SIGKILL", replica])
    node.systemd.check(["systemctl", "stop", replica], timeout=120)
    try:
        assert sorted(_workers(port)) == [r0_url, r1_url]  # nobody told the router
        wait_for("the router takes r1 out (its /health answers 503)", lambda: _router_health(port) == 503, 60)
        out_since = time.time()
        state_file = node.systemd.root / f"var/lib/npuops-{NAME}/supervisor.json"

        # The supervisor probes every 5 s once ready and writes a stage change at once: two probe intervals with
        # the replica out and no "unhealthy" entry is the proof (before /liveness, the first probe wrote one).
        time.sleep(12)
        state = json.loads(state_file.read_text())
        assert state["stage"] == "healthy", state["stages"][-3:]
        assert not [s for s in state["stages"] if s["at"] > out_since], state["stages"][-3:]
        assert _run_requests(port, 8) == [200] * 8
        now = status(node, NAME)
        assert now["state"].startswith("degraded") and not now["healthy"], now
        assert now["unit_state"]["active_state"] == "active", now
        assert int(node.systemd.unit_property(router, "NRestarts")) == router_restarts
    finally:
        node.systemd.check(["systemctl", "start", replica], timeout=300)
    wait_for("all healthy again", lambda: status(node, NAME)["state"] == "healthy", 400, poll=3)
    # Healthy again, it joined the router: already there (the router only took it out), which counts as done.
    journal = node.systemd.check(["journalctl", "-u", replica, "-n", "200", "--no-pager"])
    assert f"npuops[{NAME}-r1]: in router {NAME} (Worker {r1_url} already exists)" in journal, journal[-3000:]
    assert sorted(_workers(port)) == [r0_url, r1_url]


# How long systemd waits before it restarts the killed replica here: with the engine's own start after it, longer
# than NpuopsEngineDown's `for: 1m`, so the alert fires before the restart (the unit's own RestartSec=10 usually
# brings the engine back within a minute).
SLOW_RESTART = "[Service]\nRestartSec=50\n"


def _engine_down(prometheus: Prometheus, state: str) -> bool:
    return any(a["labels"].get("npuops_part") == f"{NAME}-r1" and a["state"] == state
               for a in prometheus.alerts("NpuopsEngineDown"))


def test_a_killed_replica_costs_at_most_its_requests_in_flight(serving_node: ServingNode, port: int,
                                                               watching: Watching) -> None:
    """... and Prometheus sees it: NpuopsEngineDown fires for the killed replica while systemd waits to restart it,
    and resolves once the restarted engine answers its scrapes again."""
    node = serving_node
    unit = f"npuops-{NAME}-r1.service"
    drop_in = node.systemd.root / f"etc/systemd/system/{unit}.d/slow-restart.conf"
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    drop_in.write_text(SLOW_RESTART)
    node.systemd.check(["systemctl", "daemon-reload"])
    restarts = int(node.systemd.unit_property(unit, "NRestarts"))
    engine = json.loads((node.systemd.root / f"var/lib/npuops-{NAME}-r1/supervisor.json").read_text())["engine_pid"]
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.extend(_run_requests(port, 60, parallel=4)))
    runner.start()
    time.sleep(1.0)
    node.systemd.check(["kill", "-KILL", str(engine)])
    runner.join(timeout=600)
    ok = codes.count(200)
    print(f"replica killed mid-run: {ok} of {len(codes)} requests through the endpoint succeeded")  # for -rA
    assert len(codes) == 60 and ok >= 54, codes
    try:
        prometheus = watching.prometheus
        wait_for("NpuopsEngineDown fires for r1", lambda: _engine_down(prometheus, "firing"), 150, poll=2)
        firing = next(a for a in prometheus.alerts("NpuopsEngineDown")
                      if a["state"] == "firing" and a["labels"].get("npuops_part") == f"{NAME}-r1")
        assert firing["labels"]["severity"] == "critical" and firing["labels"]["npuops_instance"] == NAME, firing
        assert f"`npuops status {NAME}`" in firing["annotations"]["description"], firing
        # systemd restarts the replica; the router puts it back once its /health answers.
        wait_for("r1 restarted", lambda: int(node.systemd.unit_property(unit, "NRestarts")) > restarts, 240)
    finally:
        drop_in.unlink()
        node.systemd.check(["systemctl", "daemon-reload"])
    wait_for("all healthy again", lambda: status(node, NAME)["state"] == "healthy", 400, poll=3)
    wait_for("NpuopsEngineDown resolved for r1",
             lambda: not _engine_down(prometheus, "firing") and not _engine_down(prometheus, "pending"), 120, poll=2)
    before = _served(port + 2)
    wait_for("r1 serves again", lambda: _run_requests(port, 8) and _served(port + 2) > before, 120, poll=2)


def test_status_logs_and_stop_see_every_part(serving_node: ServingNode, port: int) -> None:
    node = serving_node
    text = node.npuops("status", NAME).stdout
    assert "router" in text and f"{NAME}-r0" in text and f"{NAME}-r1" in text, text
    assert "1 restart(s)" in text, text
    listed = json.loads(node.npuops("status", "--json").stdout)["instances"]
    assert NAME in [i["name"] for i in listed] and f"{NAME}-r0" not in [i["name"] for i in listed]

    router_log = json.loads(node.npuops("logs", NAME, "--part", "router", "--json", "-n", "400").stdout)
    assert any("Starting router" in line or "Router ready" in line for line in router_log["lines"]), router_log
    replica_log = json.loads(node.npuops("logs", NAME, "--part", "r1", "--json").stdout)
    assert replica_log["units"] and f"npuops-{NAME}-r1.service" in replica_log["units"]
    bad = node.npuops("logs", NAME, "--part", "r7")
    assert bad.returncode != 0 and "r7" in bad.stderr and "Traceback" not in bad.stderr

    running = node.npuops("remove", NAME)  # refused while it serves: nothing is uninstalled under a client
    assert running.returncode == 3 and f"{NAME} is running (npuops-{NAME}-router.service" in running.stderr
    assert f"`npuops remove {NAME} --force`" in running.stderr
    done = node.npuops("stop", NAME, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout + done.stderr
    for unit in (f"npuops-{NAME}-router.service", f"npuops-{NAME}-r0.service", f"npuops-{NAME}-r1.service"):
        assert node.systemd.unit_property(unit, "ActiveState") in ("inactive", "failed"), unit
    # Stopped by its operator: out of Prometheus' targets, so nothing alerts on it.
    assert "monitoring: Prometheus' targets" in done.stderr, done.stderr
    assert not {f"{NAME}-r0", f"{NAME}-r1"} & set(_targets(node, "engines"))
    assert NAME not in _targets(node, "routers")

    # `remove` uninstalls the router and both replicas: systemd no longer knows their units (nothing comes back at
    # boot), the env files holding the key are gone, and `list` no longer shows the instance.
    refused = node.npuops("remove", "nosuch")
    assert refused.returncode == 3 and "no instance named 'nosuch'" in refused.stderr, refused.stderr
    removed = node.npuops("remove", NAME, "--json")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    answer = json.loads(removed.stdout)
    units = [f"npuops-{NAME}-router.service", f"npuops-{NAME}-r0.service", f"npuops-{NAME}-r1.service"]
    assert answer["ok"] and answer["units"] == units and answer["instances"] == [NAME, f"{NAME}-r0", f"{NAME}-r1"]
    for unit in units:
        assert node.systemd.unit_property(unit, "LoadState") == "not-found", unit
    listed = json.loads(node.npuops("list", "--json").stdout)["instances"]
    assert not [i for i in listed if i["name"] in (NAME, f"{NAME}-r0", f"{NAME}-r1")], listed
    holding_key = node.systemd.run(["grep", "-rl", KEY, "/etc/npuops", "/etc/systemd/system"], timeout=60)
    assert holding_key.stdout == "", holding_key.stdout
    again = node.npuops("remove", NAME)
    assert again.returncode != 0 and f"no instance named '{NAME}'" in again.stderr and "Traceback" not in again.stderr
