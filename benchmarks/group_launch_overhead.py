"""Time to a healthy endpoint on two hosts: `npuops launch -i INV --group` (data parallel) versus the engines by hand.

Two real SSH test hosts (tests/support/ssh_hosts.py: network namespaces with their own sshd, /etc, /var and /run;
needs root) serve the tiny demo model (npuops.demo_model) with vLLM's native data parallel -- a leader (API server,
rank 0) on the first host and a `--headless` follower (rank 1) on the second -- on the real vLLM CPU engine from the
engine venv (scripts/engine-venv.sh; NPUOPS_ENGINE_PYTHON, else ~/.cache/npuops/engine-venv/bin/python):

    A  npuops launch MODEL -i INV --group fleet --multinode dp ...   (node facts over SSH, plan, per-host render,
                                                                      launch-group.yml through ansible-runner: copy
                                                                      the files, daemon-reload, start the units with
                                                                      docker-systemctl-replacement, wait for /health)
       then  npuops stop NAME -i INV --group fleet
    B  inside each host, vllm serve MODEL --config <that host's vllm.yaml>, with that host's env file (parsed with
       npuops.envfile) over the unit's own Environment= line (HOME, VLLM_CACHE_ROOT, TMPDIR, ...), leader first,
       then the follower; the files come from `npuops launch ... --dry-run --output DIR`, run untimed beforehand
       (its own time is reported: node facts + plan + render, no playbook). SIGTERM to both afterwards.

A's clock runs from spawning `npuops launch` until it returns with the endpoint healthy; B's from spawning the leader
until its /health answers 200, polled every 0.1 s from inside the leader host (it binds 127.0.0.1 there). Both hosts
run on this machine, so the wall clocks of the controller, the Ansible artifacts and the hosts' supervisors agree, and
A's time splits into: npuops before the playbook (node facts, plan, render: the start of launch-group.yml in the
artifacts' events), the playbook until the leader's supervisor starts vllm serve (copies, daemon-reload, the units,
the start gate: the supervisor's status file on the leader), the engine until /health (the same file), and the
playbook's own check (`npuops status` on the leader, every 3 s) and wrap-up until `npuops launch` returned.

The runs alternate A B A B ... so drift on a noisy machine hits both; the ratio of the medians is what to read. An
untimed B start comes first (--warmup, default 1): the first start on a host fills vLLM's cache
(/var/cache/npuops-NAME/vllm on each host, which A's units and B share) and the page cache, and A would pay it.
The longest tasks of launch-group.yml (the artifacts' durations, the slowest host) are listed too: `Start the engine
unit` spans the engine's start when the service manager blocks until READY. Both engines start in 45-65 s on 2 idle
cores: the default (1 warm-up, 1 run each) takes ~4 minutes.

    .venv/bin/python benchmarks/group_launch_overhead.py [--runs 1] [--warmup 1] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from npuops.envfile import parse_env_file  # noqa: E402
from tests.support.ssh_hosts import FleetSetupError, TestFleet, ensure_prerequisites, start_hosts  # noqa: E402

NAME = "bench-dp"
GROUP = "fleet"
# The controller's npuops and the stand-in service manager (systemd is not init in the test hosts): this checkout's
# venv, which the hosts see too (/work is shared; tests/support/ssh_hosts.py).
NPUOPS = REPO / ".venv" / "bin" / "npuops"
SYSTEMCTL = REPO / ".venv" / "bin" / "systemctl3.py"
# The recipe that works on the CPU engine (float32, a short context, no graph capture, an explicit KV cache size),
# data parallel over the two hosts: no Ray, no plugin.
PLAN_FLAGS: tuple[str, ...] = (
    "--hardware", "cpu", "--multinode", "dp", "--dtype", "float32", "--max-model-len", "512", "--input-len", "256",
    "--output-len", "64", "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20),
)
# What a unit's processes get besides its Environment= and EnvironmentFile=: the ssh session's PATH, root's HOME.
HOST_BASE_ENV: Mapping[str, str] = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                    "HOME": "/root", "LANG": "C.UTF-8"}
# systemd's specifiers in the unit's Environment= line, for system units.
SPECIFIERS: Mapping[str, str] = {"%S": "/var/lib", "%C": "/var/cache", "%t": "/run"}
# Processes of an instance on a host (the supervisor, vllm serve, its EngineCore): none may outlive a run.
ENGINE_MARKS = ("vllm", "VLLM", "EngineCore", f"{NPUOPS} run")
STOP_TIMEOUT_S = 60.0
QUIET_TIMEOUT_S = 60.0
HOST_PYTHON = "/usr/bin/python3"  # every test host has it (Ansible's interpreter there)

# Runs inside the leader host: GET /health every 0.1 s until 200 (prints the wall time), the leader's exit, or timeout.
HEALTH_POLL = r"""
import os, sys, time, urllib.error, urllib.request
url, pid, deadline = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
while time.time() < deadline:
    try:
        with opener.open(url, timeout=2) as answer:
            if answer.status == 200:
                print("healthy", time.time())
                sys.exit(0)
    except (OSError, ValueError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        print("exited", time.time())
        sys.exit(3)
    time.sleep(0.1)
print("timeout", time.time())
sys.exit(2)
"""

# Runs inside a host: the pids and command lines of the instance's processes left on it.
LIST_ENGINE_PROCESSES = r"""
import json, os, sys
marks = json.loads(sys.argv[1])
found = []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    if cmd and any(m in cmd for m in marks):
        found.append([int(entry), cmd[:200]])
print(json.dumps(found))
"""


class BenchError(RuntimeError):
    """A run that did not reach a healthy endpoint; the message says where to look."""


@dataclass
class GroupRun:
    """A: `npuops launch -i ... --group` and what its artifacts and the leader's supervisor say about it."""

    seconds: float  # spawn until `npuops launch` returned with the endpoint healthy
    stop_s: float  # `npuops stop -i ... --group` until it returned
    facts_s: float | None = None  # node-facts.yml, first event to last
    pre_playbook_s: float | None = None  # spawn until launch-group.yml started: node facts, plan, render
    pre_engine_s: float | None = None  # spawn until the leader's supervisor started vllm serve
    engine_s: float | None = None  # the leader's vllm serve started until its first /health 200 (supervisor)
    detect_s: float | None = None  # that first 200 until `npuops launch` returned
    same_files: bool | None = None  # the installed vllm.yaml and env equal the ones B renders
    task_s: dict[str, float] = field(default_factory=dict)  # launch-group.yml: each task's slowest host


@dataclass
class HandRun:
    """B: the two engines started by hand inside the hosts."""

    seconds: float  # the leader spawned until its /health answered 200
    stop_s: float  # SIGTERM to both until both exited
    render_s: float  # the untimed `npuops launch ... --dry-run -i ...` before it: node facts, plan, render


@dataclass
class HostEngine:
    """What B starts on one host, from the files npuops rendered for it."""

    host: str
    argv: list[str]
    env: dict[str, str]
    directories: list[str]  # the unit's working, state, cache and runtime directories (systemd makes them for A)
    working_directory: str
    record: dict[str, Any]


def engine_venv_bin() -> Path | None:
    python = os.environ.get("NPUOPS_ENGINE_PYTHON") or str(Path.home() / ".cache/npuops/engine-venv/bin/python")
    bin_dir = Path(python).parent
    needed = [Path(python), bin_dir / "vllm"]
    return bin_dir if all(p.is_file() and os.access(p, os.X_OK) for p in needed) else None


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_logged(argv: Sequence[str], env: Mapping[str, str], log_stem: Path, timeout: float) -> tuple[int, str]:
    """Run a controller command in its own session, stdout and stderr to `<stem>.out` / `<stem>.err`; on timeout its
    whole process group (ansible-runner and its ssh sessions) goes. Returns (rc, stdout)."""
    out_path, err_path = log_stem.with_suffix(".out"), log_stem.with_suffix(".err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                   start_new_session=True)
        try:
            rc = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            raise BenchError(f"{argv[0]} {argv[1]} did not finish in {timeout:.0f} s; {err_path}:\n"
                             f"{tail(err_path)}") from None
    return rc, out_path.read_text(encoding="utf-8", errors="replace")


def event_time(event: Mapping[str, Any]) -> float | None:
    created = event.get("created")
    if not isinstance(created, str):
        return None
    try:
        moment = datetime.fromisoformat(created)
    except ValueError:
        return None
    if moment.tzinfo is None:  # ansible-runner writes UTC
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def playbook_marks(artifacts: Path) -> dict[str, float]:
    """Wall times from every ansible-runner run under `artifacts`: "<playbook>:start" / "<playbook>:end" (its
    playbook_on_start and playbook_on_stats events) and "task:<name>" (a task's first start)."""
    marks: dict[str, float] = {}
    for run_dir in sorted(p for p in artifacts.iterdir() if (p / "job_events").is_dir()):
        events = []
        for path in (run_dir / "job_events").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                events.append(json.loads(path.read_text(encoding="utf-8")))
        events.sort(key=lambda e: int(e.get("counter") or 0))
        playbook = "?"
        for event in events:
            at = event_time(event)
            data = event.get("event_data") or {}
            if at is None:
                continue
            kind = event.get("event")
            if kind == "playbook_on_start":
                playbook = Path(str(data.get("playbook", "?"))).name
                marks.setdefault(f"{playbook}:start", at)
            elif kind == "playbook_on_stats":
                marks[f"{playbook}:end"] = at
            elif kind == "playbook_on_task_start":
                marks.setdefault(f"task:{data.get('task')}", at)
    return marks


def task_durations(artifacts: Path, playbook: str) -> dict[str, float]:
    """Each task's duration on its slowest host (the runner_on_* events' `duration`) in the runs of `playbook`."""
    durations: dict[str, float] = {}
    for path in artifacts.glob("*/job_events/*.json"):
        try:
            event = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        data = event.get("event_data") or {}
        if (not str(event.get("event", "")).startswith("runner_on_") or Path(str(data.get("playbook"))).name != playbook
                or not isinstance(data.get("duration"), (int, float))):
            continue
        task = str(data.get("task"))
        durations[task] = max(durations.get(task, 0.0), float(data["duration"]))
    return durations


def unit_environment(unit_text: str) -> tuple[dict[str, str], str]:
    """The Environment= variables (systemd specifiers resolved as for a system unit) and the WorkingDirectory= of a
    rendered unit."""
    env: dict[str, str] = {}
    working_directory = "/"
    for raw in unit_text.splitlines():
        key, sep, value = raw.strip().partition("=")
        if not sep:
            continue
        for specifier, path in SPECIFIERS.items():
            value = value.replace(specifier, path)
        if key == "Environment":
            for item in shlex.split(value):
                name, _, item_value = item.partition("=")
                env[name] = item_value
        elif key == "WorkingDirectory":
            working_directory = value
    return env, working_directory


def host_engine(rendered: Path, host: str) -> HostEngine:
    directory = rendered / host
    record = json.loads((directory / "instance.json").read_text(encoding="utf-8"))
    unit_env, working_directory = unit_environment((directory / f"npuops-{NAME}.service").read_text(encoding="utf-8"))
    env_file = directory / "env"
    overlay = parse_env_file(env_file.read_text(encoding="utf-8"), str(env_file))
    argv = [*record["vllm_command"], record["model_path"], "--config", str(directory / "vllm.yaml")]
    directories = [working_directory, *(unit_env[k] for k in ("HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TMPDIR")
                                        if k in unit_env)]
    return HostEngine(host, argv, {**HOST_BASE_ENV, **unit_env, **overlay}, directories, working_directory, record)


def spawn_in_host(fleet: TestFleet, engine: HostEngine, log: Path) -> int:
    """Start the engine inside its host in a session of its own (no service manager: a bare process, its output to
    `log`); its pid as the host sees it."""
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in engine.env.items())
    # `setsid` in a background job of a non-interactive shell is no group leader: it execs, so $! is the engine.
    command = (f"cd {shlex.quote(engine.working_directory)} && "
               f"{{ setsid env -i {assignments} {shlex.join(engine.argv)} </dev/null >{shlex.quote(str(log))} 2>&1 & "
               f"}} && echo $!")
    done = fleet.run(engine.host, command, timeout=60)
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise BenchError(f"{engine.host}: starting vllm serve failed (rc {done.returncode}): {done.stderr.strip()}")
    return int(done.stdout.strip())


def alive_in_host(fleet: TestFleet, host: str, pid: int) -> bool:
    return fleet.run(host, f"kill -0 {pid} 2>/dev/null", timeout=30).returncode == 0


def stop_in_hosts(fleet: TestFleet, pids: Mapping[str, int]) -> float:
    """SIGTERM to every engine, SIGKILL to its group after STOP_TIMEOUT_S, then whatever is left of each group goes."""
    started = time.perf_counter()
    for host, pid in pids.items():
        fleet.run(host, f"kill -TERM {pid} 2>/dev/null", timeout=30)
    deadline = started + STOP_TIMEOUT_S
    waiting = dict(pids)
    while waiting and time.perf_counter() < deadline:
        waiting = {h: p for h, p in waiting.items() if alive_in_host(fleet, h, p)}
        if waiting:
            time.sleep(0.1)
    elapsed = time.perf_counter() - started
    for host, pid in waiting.items():
        print(f"  ({host}: pid {pid} did not stop within {STOP_TIMEOUT_S:.0f} s: killing its group)", flush=True)
    for host, pid in pids.items():
        fleet.run(host, f"kill -KILL -- -{pid} 2>/dev/null", timeout=30)
    return elapsed


def wait_quiet(fleet: TestFleet) -> list[str]:
    """Wait until no engine process is left on any host (so the next run finds its ports free); kill stragglers by
    pid after QUIET_TIMEOUT_S (they are this fleet's own). Returns what had to be killed."""
    deadline = time.perf_counter() + QUIET_TIMEOUT_S
    while True:
        left: dict[str, list[list[Any]]] = {}
        for host in fleet.names:
            done = fleet.run(host, [HOST_PYTHON, "-c", LIST_ENGINE_PROCESSES, json.dumps(ENGINE_MARKS)], timeout=30)
            with contextlib.suppress(ValueError):
                found = json.loads(done.stdout or "[]")
                if found:
                    left[host] = found
        if not left:
            return []
        if time.perf_counter() > deadline:
            killed = []
            for host, found in left.items():
                for pid, cmd in found:
                    fleet.run(host, f"kill -KILL {int(pid)} 2>/dev/null", timeout=30)
                    killed.append(f"{host}: {pid} {cmd}")
            return killed
        time.sleep(0.5)


def supervisor_state(fleet: TestFleet, host: str, status_file: str) -> dict[str, Any] | None:
    done = fleet.run(host, ["cat", status_file], timeout=30)
    try:
        state = json.loads(done.stdout)
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def stage_at(state: Mapping[str, Any] | None, stage: str) -> float | None:
    for entry in (state or {}).get("stages") or []:
        if isinstance(entry, Mapping) and entry.get("stage") == stage and isinstance(entry.get("at"), (int, float)):
            return float(entry["at"])
    return None


def installed_files(fleet: TestFleet, host: str, manifest: Mapping[str, str]) -> dict[str, str]:
    return {name: fleet.run(host, ["cat", manifest[name]], timeout=30).stdout for name in ("vllm.yaml", "env")}


def cell(value: float | None, width: int) -> str:
    return f"{value:{width}.1f}" if value is not None else f"{'?':>{width}}"


def median_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


class Bench:
    """The two hosts, the model and the runs: A (`run_group`) and B (`run_by_hand`)."""

    def __init__(self, fleet: TestFleet, work: Path, model: Path, vllm: Path, env: Mapping[str, str],
                 timeout: float) -> None:
        self.fleet = fleet
        self.work = work
        self.env = dict(env)
        self.timeout = timeout
        self.leader, self.follower = fleet.names
        # The npuops the hosts run: this checkout's, with the stand-in service manager as its systemctl.
        wrapper = work / "npuops-on-host"
        wrapper.write_text(f"#!/bin/sh\nexec env NPUOPS_SYSTEMCTL='{SYSTEMCTL}' '{NPUOPS}' \"$@\"\n")
        wrapper.chmod(0o755)
        self.inventory = fleet.inventory_path(group_vars={"npuops_command": str(wrapper),
                                                          "npuops_systemctl": [str(SYSTEMCTL)]})
        self.launch_argv = [str(NPUOPS), "launch", str(model), *PLAN_FLAGS, "--name", NAME, "-i", str(self.inventory),
                            "--group", GROUP, "--vllm", str(vllm), "--service-user", "root", "--json"]
        # Where the files go on each host, and where the leader's supervisor writes its status (from a first render).
        rendered, _ = self.render("paths")
        self.manifests: dict[str, dict[str, str]] = {
            h: json.loads((rendered / h / "manifest.json").read_text(encoding="utf-8"))["files"] for h in fleet.names}
        self.leader_status_file = str(host_engine(rendered, self.leader).record["status_file"])

    def render(self, tag: str) -> tuple[Path, float]:
        """`npuops launch ... -i INV --group fleet --dry-run --output DIR`: every host's files; and how long it took."""
        out_dir = self.work / f"rendered-{tag}"
        stem = self.work / f"render-{tag}"
        started = time.perf_counter()
        rc, out = run_logged([*self.launch_argv, "--artifacts", str(self.work / f"art-render-{tag}"), "--dry-run",
                              "--output", str(out_dir)], self.env, stem, 300)
        seconds = time.perf_counter() - started
        if rc != 0:
            raise BenchError(f"npuops launch --dry-run exited {rc}:\n{out}\n{tail(stem.with_suffix('.err'))}")
        return out_dir, seconds

    def report_stragglers(self) -> None:
        for line in wait_quiet(self.fleet):
            print(f"  (killed a straggler: {line})", flush=True)

    def run_by_hand(self, tag: str) -> tuple[HandRun, Path]:
        """B: render (untimed), then both engines by hand, the leader first; timed to the leader's /health 200."""
        rendered, render_s = self.render(tag)
        engines = [host_engine(rendered, host) for host in (self.leader, self.follower)]
        for engine in engines:
            done = self.fleet.run(engine.host, ["mkdir", "-p", *engine.directories], timeout=60)
            if done.returncode != 0:
                raise BenchError(f"{engine.host}: mkdir -p {' '.join(engine.directories)}: {done.stderr.strip()}")
        record = engines[0].record
        url = f"http://{record['host']}:{record['port']}/health"
        logs = {e.host: self.work / f"b{tag}-{e.host}.log" for e in engines}
        pids: dict[str, int] = {}
        try:
            started = time.time()
            for engine in engines:
                pids[engine.host] = spawn_in_host(self.fleet, engine, logs[engine.host])
            poll = self.fleet.run(self.leader, [HOST_PYTHON, "-c", HEALTH_POLL, url, str(pids[self.leader]),
                                                str(self.timeout)], timeout=self.timeout + 60)
            word, _, at = poll.stdout.strip().partition(" ")
            if poll.returncode != 0 or word != "healthy":
                tails = "\n".join(f"{log}:\n{tail(log)}" for log in logs.values())
                raise BenchError(f"B: no /health 200 from {self.leader} ({word or poll.stderr.strip()});\n{tails}")
            seconds = float(at) - started
        finally:
            stop_s = stop_in_hosts(self.fleet, pids) if pids else 0.0
            self.report_stragglers()
        return HandRun(seconds, stop_s, render_s), rendered

    def run_group(self, tag: str) -> tuple[GroupRun, dict[str, dict[str, str]]]:
        """A: `npuops launch -i INV --group fleet` until it returned, its parts, the files it installed; then
        `npuops stop -i INV --group fleet` (timed too)."""
        artifacts = self.work / f"art-a{tag}"
        stem = self.work / f"a{tag}"
        try:
            started = time.time()
            rc, out = run_logged([*self.launch_argv, "--artifacts", str(artifacts)], self.env, stem,
                                 self.timeout + 600)
            returned = time.time()
            try:
                report = json.loads(out)
            except ValueError:
                report = {}
            if rc != 0 or not report.get("ok"):
                raise BenchError(f"A: npuops launch exited {rc} (ok: {report.get('ok')}); hosts: {report.get('hosts')}"
                                 f"; endpoint: {report.get('endpoint')}; {stem}.err:\n{tail(stem.with_suffix('.err'))}")
            run = GroupRun(returned - started, 0.0)
            marks = playbook_marks(artifacts)
            run.task_s = task_durations(artifacts, "launch-group.yml")
            if "node-facts.yml:start" in marks and "node-facts.yml:end" in marks:
                run.facts_s = marks["node-facts.yml:end"] - marks["node-facts.yml:start"]
            if "launch-group.yml:start" in marks:
                run.pre_playbook_s = marks["launch-group.yml:start"] - started
            state = supervisor_state(self.fleet, self.leader, self.leader_status_file)
            engine_at = stage_at(state, "starting")
            healthy_at = (state or {}).get("healthy_at")
            if engine_at is not None:
                run.pre_engine_s = engine_at - started
                if isinstance(healthy_at, (int, float)):
                    run.engine_s = float(healthy_at) - engine_at
                    run.detect_s = returned - float(healthy_at)
            installed = {h: installed_files(self.fleet, h, self.manifests[h]) for h in self.fleet.names}
        finally:
            stop_started = time.perf_counter()
            stop_rc, stop_out = run_logged([str(NPUOPS), "stop", NAME, "-i", str(self.inventory), "--group", GROUP,
                                            "--artifacts", str(self.work / f"art-stop-a{tag}"), "--json"],
                                           self.env, self.work / f"stop-a{tag}", 600)
            stop_s = time.perf_counter() - stop_started
            if stop_rc != 0:
                print(f"  (npuops stop exited {stop_rc}: {stop_out.strip()[-400:]})", flush=True)
            self.report_stragglers()
        run.stop_s = stop_s
        return run, installed


def print_summary(a_runs: Sequence[GroupRun], b_runs: Sequence[HandRun]) -> None:
    a_med = statistics.median(r.seconds for r in a_runs)
    b_med = statistics.median(r.seconds for r in b_runs)
    print(f"median over {len(a_runs)} run(s):")
    print(f"  A  npuops launch -i ... --group, until it returned:  {a_med:6.2f} s")
    print(f"  B  vllm serve by hand on both hosts, until /health:  {b_med:6.2f} s")
    print(f"  ratio A/B: {a_med / b_med:.3f}  (A - B: {a_med - b_med:+.2f} s)")
    parts = [
        ("spawn -> launch-group.yml starts (node facts, plan, render)", median_of([r.pre_playbook_s for r in a_runs])),
        ("  of which node-facts.yml", median_of([r.facts_s for r in a_runs])),
        ("spawn -> the leader's vllm serve starts (+ copies, units, start gate)",
         median_of([r.pre_engine_s for r in a_runs])),
        ("the leader's vllm serve -> its first /health 200 (its supervisor)", median_of([r.engine_s for r in a_runs])),
        ("that 200 -> npuops launch returned (status check, wrap-up)", median_of([r.detect_s for r in a_runs])),
    ]
    print("  A, split by the artifacts' events and the leader's supervisor.json:")
    for label, value in parts:
        share = f"  ({value / a_med:.1%} of A)" if value is not None else ""
        print(f"    {label + ':':<70} {cell(value, 6)} s{share}")
    slow = sorted(((t, statistics.median(r.task_s.get(t, 0.0) for r in a_runs)) for t in {t for r in a_runs
                                                                                         for t in r.task_s}),
                  key=lambda ts: -ts[1])
    print("  launch-group.yml's longest tasks (slowest host):")
    for task, seconds in [ts for ts in slow if ts[1] >= 0.5][:6]:
        print(f"    {task + ':':<70} {seconds:6.1f} s")
    print(f"  npuops launch --dry-run -i ... alone (node facts, plan, render): "
          f"{statistics.median(r.render_s for r in b_runs):.2f} s")
    print(f"  stop: npuops stop -i ... --group {statistics.median(r.stop_s for r in a_runs):.2f} s, "
          f"SIGTERM by hand {statistics.median(r.stop_s for r in b_runs):.2f} s")
    if not all(r.same_files for r in a_runs):
        print("  note: the vllm.yaml or env A installed differed from the ones B rendered")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="A/B pairs (each start of the engines takes 45-65 s)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed B starts first, to fill the caches A and B share on each host (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health per start")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, artifacts, rendered files)")
    args = parser.parse_args()

    bin_dir = engine_venv_bin()
    if bin_dir is None:
        print("no engine venv (NPUOPS_ENGINE_PYTHON, else ~/.cache/npuops/engine-venv/bin/python, with vllm beside "
              "it); build it with:\n    export NPUOPS_ENGINE_PYTHON=$(scripts/engine-venv.sh | tail -n 1)",
              file=sys.stderr)
        return 2
    if not (NPUOPS.is_file() and SYSTEMCTL.is_file()):
        print(f"no {NPUOPS} or {SYSTEMCTL}: install the checkout with `python -m venv .venv && "
              ".venv/bin/pip install -e '.[test]'`", file=sys.stderr)
        return 2
    reason = ensure_prerequisites()
    if reason is not None:
        print(f"cannot start the SSH test hosts: {reason}", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="npuops-bench-group-", dir="/tmp"))  # /tmp: the hosts share it
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env["HF_HUB_OFFLINE"] = "1"
    fleet: TestFleet | None = None
    a_runs: list[GroupRun] = []
    b_runs: list[HandRun] = []
    try:
        model = work / "model"
        made = subprocess.run([str(bin_dir / "python"), "-m", "npuops.demo_model", str(model)], cwd=REPO,
                              env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
        if made.returncode != 0:
            raise BenchError(f"npuops.demo_model failed:\n{made.stdout}{made.stderr}")
        fleet = start_hosts(2, work)
        bench = Bench(fleet, work, model, bin_dir / "vllm", env, args.timeout)

        warmup = f" after {args.warmup} untimed warm-up start(s) of B" if args.warmup else ""
        print(f"npuops launch -i INV --group fleet --multinode dp (A) versus vllm serve by hand in each host (B), "
              f"2 hosts, tiny model; {args.runs} run(s) each, alternating{warmup}", flush=True)
        for k in range(args.warmup):
            print(f"  warm-up (B): {bench.run_by_hand(f'w{k}')[0].seconds:6.1f} s", flush=True)
        print(f"  {'run':>3}  {'A s':>6}  {'B s':>6}  {'A/B':>5}  {'A facts':>7}  {'A pre-play':>10}  "
              f"{'A pre-eng':>9}  {'A engine':>8}  {'A detect':>8}  {'dry-run':>7}  {'stop A':>6}  {'stop B':>6}",
              flush=True)
        for i in range(args.runs):
            a, installed = bench.run_group(str(i))
            b, rendered = bench.run_by_hand(str(i))
            a.same_files = all(installed[h][name] == (rendered / h / name).read_text(encoding="utf-8")
                               for h in installed for name in ("vllm.yaml", "env"))
            a_runs.append(a)
            b_runs.append(b)
            print(f"  {i + 1:>3}  {a.seconds:6.1f}  {b.seconds:6.1f}  {a.seconds / b.seconds:5.2f}  "
                  f"{cell(a.facts_s, 7)}  {cell(a.pre_playbook_s, 10)}  {cell(a.pre_engine_s, 9)}  "
                  f"{cell(a.engine_s, 8)}  {cell(a.detect_s, 8)}  {b.render_s:7.1f}  {a.stop_s:6.1f}  "
                  f"{b.stop_s:6.1f}", flush=True)
    except (BenchError, FleetSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        if fleet is not None:
            try:
                fleet.close()  # every process on the hosts goes with them
            except FleetSetupError as exc:
                print(f"error closing the test hosts: {exc}", file=sys.stderr)
        if args.keep:
            print(f"work directory (logs, artifacts, rendered files): {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    print_summary(a_runs, b_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
