"""The supervisor: `npuops run NAME`, the ExecStart of every npuops unit (and `npuops launch --foreground`).

It runs `vllm serve MODEL --config vllm.yaml` as its child and stands between it and systemd:
- progress: the engine's log is read line by line for the start-up stages (engine_log.py); each stage goes to
  systemd as STATUS=, to the status file `npuops status` reads, and to the terminal in the foreground;
- readiness: READY=1 only once GET /health answers 200 (Type=notify), never when the process merely exists;
- liveness: WATCHDOG=1 only while /health keeps answering, so systemd (WatchdogSec=) restarts an engine that
  hangs. Without a systemd watchdog (the foreground) the supervisor applies the same timeout itself;
- stopping: SIGTERM/SIGINT are forwarded to the engine, which shuts down gracefully; its process group is killed
  after the stop timeout, so no EngineCore or worker outlives it;
- dying: when the engine exits on its own, its log is matched against the known failure signatures
  (diagnosis.py); the diagnosis goes to the journal and the status file, and the supervisor exits with the
  engine's status (128+N for a signal) so Restart=on-failure restarts a crash, or with 78 (EX_CONFIG, listed in
  RestartPreventExitStatus=) when a restart cannot help.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO

from npuops.httpclient import base_url, http_request
from npuops.instance.endpoint import health_ok, scrape_metrics
from npuops.instance.membership import ClusterMembership
from npuops.instance.ray import RayState, find_stopped_workers, probe_ray_cluster
from npuops.instance.record import InstanceRecord, read_status, write_status
from npuops.instance.revisions import held_out_of_router
from npuops.instance.router_admin import RouterChange, join_router, leave_router
from npuops.instance.state import Diagnosis, Stage, StageEntry, SupervisorExit, SupervisorState
from npuops.service.diagnosis import diagnose, signal_diagnosis
from npuops.service.engine_log import drain_count, kv_cache_tokens, stage_of
from npuops.service.notify import Notifier, watchdog_interval_s
from npuops.service.stall import EngineProgress, StallWatch, engine_progress, stopped_in_group

EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: do not restart (RestartPreventExitStatus=78)
LOG_TAIL_LINES = 40
_KEEP_LINES = 2000
# The variables only the supervisor may use: the engine must not talk to systemd's notify socket itself.
_SUPERVISOR_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


# Between leaving the router and signalling the engine (see run()).
LEAVE_GRACE_S = 2.0
# A multi-node engine's probe completion (Supervisor._send_probe): at most this far apart, and how long one may wait
# for its answer (far past any stall verdict: a killed engine ends it sooner).
MAX_PROBE_INTERVAL_S = 30.0
PROBE_TIMEOUT_S = 3600.0


@dataclass
class SupervisorOptions:
    # /health is polled every poll_interval_s while starting, then every ready_poll_interval_s (or more often when
    # the systemd watchdog wants pings more often): each probe is an access-log line of the engine's.
    poll_interval_s: float = 1.0
    ready_poll_interval_s: float = 5.0
    health_timeout_s: float = 5.0
    # Echo the engine's log to stdout (the journal under systemd); the foreground shows progress instead.
    echo_engine_log: bool = True
    # Also write the engine's log to the instance's engine.log (the foreground: `npuops logs` reads it).
    write_engine_log: bool = False
    # Variables to lay over the inherited environment (the foreground reads the env file itself).
    env_overlay: Mapping[str, str] = field(default_factory=dict)
    on_stage: Callable[[Stage, str, float], None] | None = None
    # Called once when the engine first answers /health (launch --foreground sends its first request there).
    on_ready: Callable[[], None] | None = None
    # A Ray head's engine also asks the cluster, at most this often, whether every host's node is alive.
    cluster_interval_s: float = 30.0
    cluster_probe: Callable[[ClusterMembership], RayState] | None = None
    # A headless engine (data-parallel follower) answers no HTTP: it counts as up once it has run this long.
    headless_settle_s: float = 5.0
    # An NPU engine's chips are asked, at most this often once it serves, whether they still serve (the start gate's
    # chip-health check on its devices: npuops.service.gate.chip_watch): the answer names a chip in Alarm or
    # Critical, or is None.
    chip_interval_s: float = 30.0
    chip_probe: Callable[[], str | None] | None = None
    # A serving engine's progress (requests held, tokens processed: npuops.service.stall), asked with each /health
    # probe once it serves; None scrapes its /metrics. Held requests and no token for the record's watchdog_s is a
    # hang that /health does not see (a rank stopped on another host).
    progress_probe: Callable[[], EngineProgress | None] | None = None
    # Where a stalled Ray engine's stopped worker is (npuops.instance.ray.find_stopped_workers when None).
    stopped_worker_finder: Callable[[ClusterMembership], list[str]] | None = None


@dataclass
class Outcome:
    exit_code: int
    reason: str  # "stopped", "engine-exited", "start-timeout", "hang", "not-started"
    engine_returncode: int | None = None
    diagnosis: Diagnosis | None = None
    log_tail: list[str] = field(default_factory=list)


def _user_name() -> str:
    """Who the engine runs as (the unit's User=), for the fixes that name it."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


class Supervisor:
    def __init__(self, record: InstanceRecord, environ: Mapping[str, str], options: SupervisorOptions | None = None,
                 notifier: Notifier | None = None) -> None:
        self.record = record
        self.environ = dict(environ)
        self.options = options or SupervisorOptions()
        self.notifier = notifier if notifier is not None else Notifier.from_environ(environ)
        self.url = base_url(record.host, record.port)
        self._stop = threading.Event()
        self._hang_signal = threading.Event()
        self._lines: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
        self._stage_events: collections.deque[tuple[Stage, str]] = collections.deque()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._log_file: IO[str] | None = None
        self._started = time.monotonic()
        self._cluster_checked = -1e9
        self._cluster_problem = ""
        self._chips_checked = -1e9
        self._chip_problem: str | None = None
        self._stall = StallWatch(float(record.watchdog_s)) if record.watchdog_s and record.runs_engine and \
            record.serves_api else None
        self._stopped_since: float | None = None
        # A multi-node engine's probe completion: when the unanswered one was sent, and when the last one was.
        self._probe_sent_at: float | None = None
        self._probe_last = -1e9
        self._state = SupervisorState.started(record.name, self.url, read_status(record))

    # --- signals ----------------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        def on_stop(signum: int, frame: object) -> None:
            self._stop.set()

        def on_watchdog(signum: int, frame: object) -> None:
            # systemd's WatchdogSignal (SIGABRT): the engine stopped answering and systemd gave up on it.
            self._hang_signal.set()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGABRT, on_watchdog)

    # --- state ------------------------------------------------------------------------------------------------
    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _set_stage(self, stage: Stage, detail: str = "") -> None:
        if self._state.stage == stage:
            return
        elapsed = self._elapsed()
        self._state.stage = stage
        self._state.stages.append(StageEntry(stage, time.time(), round(elapsed, 1), detail))
        text = f"{stage.value}" + (f": {detail}" if detail else "")
        self.notifier.status(f"{self.record.name}: {text}")
        self._write_status()
        if self.options.on_stage is not None:
            self.options.on_stage(stage, detail, elapsed)

    def _write_status(self) -> None:
        self._state.updated_at = time.time()
        try:
            write_status(self.record, self._state)
        except OSError as exc:
            # The status file is for `npuops status`; failing to write it must not take the engine down.
            self._say(f"cannot write {self.record.status_file}: {exc.strerror}")

    def _say(self, text: str) -> None:
        """A line of the supervisor's own: stderr, which is the journal under systemd."""
        print(f"npuops[{self.record.name}]: {text}", file=sys.stderr, flush=True)

    # --- the engine -------------------------------------------------------------------------------------------
    def child_environment(self) -> dict[str, str]:
        env = dict(self.environ)
        env.update(self.options.env_overlay)
        for key in _SUPERVISOR_ONLY:
            env.pop(key, None)
        return env

    def _read_engine_output(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self._lines.append(line)
            if self.options.echo_engine_log:
                print(line, flush=True)
            if self._log_file is not None:
                self._log_file.write(line + "\n")
                self._log_file.flush()
            held = drain_count(line)
            if held is not None:
                self._count_in_flight(held)
            stage = stage_of(line)
            if stage is not None:
                tokens = kv_cache_tokens(line)
                detail = f"{tokens:,} tokens" if tokens is not None else ""
                if tokens is not None:
                    self._state.kv_cache_tokens = tokens
                with self._lock:
                    self._stage_events.append((stage, detail))
        stream.close()

    def _start_engine(self) -> str | None:
        """Start the engine; an error message when it cannot even be started."""
        argv = self.record.engine_argv
        if self.options.write_engine_log:
            log_path = self.record.engine_log
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # Appended: a foreground launch begins the file with its start gate's report.
            self._log_file = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in _finish
            os.chmod(log_path, 0o640)
        try:
            # A session of its own: the whole engine (API server, EngineCore, workers) is one process group
            # the supervisor can stop, and a Ctrl-C in the terminal reaches only the supervisor.
            self._process = subprocess.Popen(argv, env=self.child_environment(), stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        except OSError as exc:
            return f"cannot start {argv[0]}: {exc.strerror}"
        assert self._process.stdout is not None
        self._reader = threading.Thread(target=self._read_engine_output, args=(self._process.stdout,),
                                        name="engine-log", daemon=True)
        self._reader.start()
        self._state.engine_pid = self._process.pid
        self._say(f"started the engine (pid {self._process.pid}): {' '.join(argv)}")
        return None

    def _kill_group(self, sig: int) -> None:
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)

    def _stop_engine(self) -> int | None:
        """SIGTERM to the API server (it stops its EngineCore), then SIGKILL to the group after the timeout."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                # The record's stop timeout holds the drain (vLLM's --shutdown-timeout), then the engine's exit.
                process.wait(timeout=self.record.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._say(f"the engine did not stop within {self.record.stop_timeout_s} s; killing it")
                self._kill_group(signal.SIGKILL)
                process.wait()
        # Whatever is left of the group (an EngineCore whose API server was killed) goes too.
        self._kill_group(signal.SIGKILL)
        return process.returncode

    def _router_change(self, change: Callable[[InstanceRecord, str | None], RouterChange | None]) -> bool:
        """A replica behind a router on this host leaves it before its drain and joins it once healthy; True when
        the router answered."""
        if not self.record.behind:
            return False
        holder = held_out_of_router(self.record) if change is join_router else None
        if holder is not None:
            # A rollout verifies the new revision first (a first request, the golden file) and joins it itself.
            self._say(f"held out of router {self.record.behind} by rollout (pid {holder}) until verified")
            return False
        done = change(self.record, self.child_environment().get("VLLM_API_KEY"))
        if done is not None:
            self._say(done.message)
        return done is not None and done.done

    def _count_in_flight(self, held: int) -> None:
        """What a stopping engine still holds (its own shutdown lines say: vLLM's --shutdown-timeout drains them),
        in the status file (`npuops status`: "draining (N requests in flight)"), to systemd and the journal."""
        if held == self._state.in_flight or (held == 0 and self._state.in_flight is None):
            return  # unchanged, or an engine that had nothing to drain (vLLM logs "complete" when it aborts too)
        self._state.in_flight = held
        self._write_status()
        self.notifier.stopping(f"{self.record.name}: draining ({held} requests in flight)")
        self._say(f"draining ({held} requests in flight)")

    def _lines_snapshot(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    # --- the loop ---------------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        self._set_stage(Stage.STARTING, f"{self.record.served_model_name} on {self.url}")
        error = self._start_engine()
        if error is not None:
            diagnosis = Diagnosis("engine-missing", error,
                                  f"install vLLM where the instance expects it ({self.record.vllm_command[0]}), "
                                  "e.g. `npuops provision --tags python`, or re-launch with --vllm PATH",
                                  error, "npuops", permanent=True)
            return self._finish(Outcome(EXIT_CONFIG, "not-started", None, diagnosis))
        assert self._process is not None
        watchdog = watchdog_interval_s(self.environ, os.getpid())
        # systemd's watchdog handles hangs when it is on; otherwise the supervisor does, with the same timeout.
        own_hang_timeout = None if watchdog is not None else float(self.record.watchdog_s or 0) or None
        ready = False
        last_healthy = 0.0
        last_probe = -1e9
        while True:
            self._drain_stage_events(ready)
            returncode = self._process.poll()
            if returncode is not None:
                return self._finish(self._engine_exited(returncode))
            if self._stop.is_set():
                self.notifier.stopping(f"{self.record.name}: stopping")
                self._set_stage(Stage.STOPPING)
                # No new request from the router, then the drain finishes what the replica holds. A request the
                # router dispatched just before it let the replica go may still be on its way: vLLM's API server
                # accepts it during the drain and the stopping engine aborts it with no token (run L), so the
                # engine is signalled only once such a request has had time to arrive and be counted.
                if self._router_change(leave_router):
                    time.sleep(LEAVE_GRACE_S)
                code = self._stop_engine()
                return self._finish(Outcome(0, "stopped", code))
            if self._hang_signal.is_set():
                return self._finish(self._hung("systemd's watchdog fired"))
            now = time.monotonic()
            # The process is looked at every tick; /health only when due (every tick while starting, every
            # ready_poll_interval_s, or the watchdog's interval if shorter, once ready).
            health_interval = self.options.poll_interval_s
            if ready:
                health_interval = self.options.ready_poll_interval_s
                if watchdog is not None:
                    health_interval = min(health_interval, watchdog)
            if now - last_probe < health_interval:
                self._stop.wait(self.options.poll_interval_s)
                continue
            last_probe = now
            healthy, problem = self._probe(ready)
            now = time.monotonic()
            if healthy:
                last_healthy = now
                self._state.last_health_at = time.time()
                if not ready:
                    ready = True
                    self._became_ready()
                elif self._state.stage == Stage.UNHEALTHY:
                    # Back, but still on a chip in Alarm (the last chip probe's answer): degraded, not healthy.
                    again = (f"answers {self.record.health_path} again" if self.record.serves_api
                             else "the cluster is whole again")
                    self._set_stage(Stage.DEGRADED if self._chip_problem else Stage.HEALTHY,
                                    self._chip_problem or again)
                self._watch_chips()
                hang = self._hang_seen(now)
                if hang is not None:
                    return self._finish(hang)
                if watchdog is not None:
                    # Probes come at most every half WatchdogSec: each answer is a ping.
                    self.notifier.watchdog()
            elif ready:
                if self._state.stage != Stage.UNHEALTHY:
                    self._set_stage(Stage.UNHEALTHY, f"{problem}; watchdog pings withheld")
                if own_hang_timeout is not None and now - last_healthy > own_hang_timeout:
                    return self._finish(self._hung(f"/health did not answer for {own_hang_timeout:.0f} s"))
            elif self._elapsed() > self.record.timeout_start_s:
                return self._finish(self._start_timed_out())
            self._stop.wait(self.options.poll_interval_s)

    def _became_ready(self) -> None:
        self._drain_stage_events(True)
        self._state.healthy_at = time.time()
        self._set_stage(Stage.HEALTHY, f"{self.url} answers {self.record.health_path} after {self._elapsed():.0f} s")
        self.notifier.ready(f"{self.record.name}: healthy on {self.url}")
        self._router_change(join_router)
        if self.options.on_ready is not None:
            self.options.on_ready()

    def _hang_seen(self, now: float) -> Outcome | None:
        """The hang /health does not show, ended (the engine killed), or None: an engine process stopped on this
        host, or a serving engine stalled (a rank anywhere in its group)."""
        stopped = self._watch_stopped(now)
        if stopped is not None:
            return self._hung(stopped, self._group_where(local=True))
        stalled = self._watch_progress(now)
        if stalled is not None:
            return self._hung(stalled, self._group_where(local=False))
        return None

    def _probe(self, ready: bool) -> tuple[bool, str]:
        """Is the instance's part up: /health for one that serves the API, the process for a headless engine;
        plus, for a Ray head once serving, every host's Ray node alive (a lost worker is a broken instance)."""
        if not self.record.serves_api:
            up = self._elapsed() >= self.options.headless_settle_s
            return up, "the headless engine is starting"
        if not health_ok(self.url, timeout=self.options.health_timeout_s, path=self.record.health_path):
            return False, f"{self.record.health_path} stopped answering"
        cluster = self.record.ray_cluster
        if ready and cluster is not None:
            now = time.monotonic()
            if now - self._cluster_checked >= self.options.cluster_interval_s or self._cluster_problem:
                self._cluster_checked = now
                probe = self.options.cluster_probe or probe_ray_cluster
                state = probe(cluster)
                self._state.cluster = state
                if state.complete:
                    self._cluster_problem = ""
                elif state.error:
                    self._cluster_problem = f"the Ray cluster cannot be asked ({state.error})"
                elif state.missing:
                    self._cluster_problem = f"Ray node(s) lost on {', '.join(state.missing)}"
                else:
                    self._cluster_problem = f"the Ray nodes of {', '.join(state.short)} offer too little"
            if self._cluster_problem:
                return False, self._cluster_problem
        return True, ""

    def _watch_progress(self, now: float) -> str | None:
        """Why a serving engine that answers /health hangs (held requests, no token for the watchdog's time), or
        None. It is killed then as systemd's watchdog would kill it, and restarted: under Ray the restarted engine
        places its workers again on every host, and a data-parallel group's other ranks see their peer go."""
        if self._stall is None:
            return None
        if self.record.cluster is not None:
            self._send_probe(now)
        probe = self.options.progress_probe
        if probe is not None:
            progress = probe()
        else:
            samples = scrape_metrics(self.url, timeout=self.options.health_timeout_s)
            progress = engine_progress(samples) if samples is not None else None
        with self._lock:
            probe_sent_at = self._probe_sent_at
        return self._stall.observe(progress, now, probe_sent_at)

    def _send_probe(self, now: float) -> None:
        """A 1-token completion in the background, one at a time, every watchdog time (at most every 30 s): the way
        through every rank of a multi-node engine, which a blocked step never reports (npuops.service.stall)."""
        interval = min(float(self.record.watchdog_s), MAX_PROBE_INTERVAL_S)
        with self._lock:
            if self._probe_sent_at is not None or now - self._probe_last < interval:
                return
            self._probe_sent_at = self._probe_last = now
        key = self.child_environment().get("VLLM_API_KEY")
        body = {"model": self.record.served_model_name, "prompt": "ping", "max_tokens": 1, "temperature": 0}

        def ask() -> None:
            try:
                http_request(self.url + "/v1/completions", data=body, api_key=key, timeout=PROBE_TIMEOUT_S)
            finally:
                with self._lock:
                    self._probe_sent_at = None

        threading.Thread(target=ask, name="npuops-probe", daemon=True).start()

    def _watch_stopped(self, now: float) -> str | None:
        """Why the engine hangs when a process of its group has been stopped (state T) for the watchdog's time, or
        None: the one hang a headless rank's own host sees (it answers no /health and exports no /metrics)."""
        if not self.record.watchdog_s or self._process is None:
            return None
        stopped = stopped_in_group(self._process.pid)
        if not stopped:
            self._stopped_since = None
            return None
        if self._stopped_since is None:
            self._stopped_since = now
        held = now - self._stopped_since
        if held < self.record.watchdog_s:
            return None
        return (f"process {', '.join(map(str, stopped))} of the engine stopped (SIGSTOP or a debugger) for "
                f"{held:.0f} s")

    def _watch_chips(self) -> None:
        """A serving engine whose chip goes into Alarm or Critical is degraded until the chip reports OK again: the
        status names the chip, and a replica leaves its router, so requests go to the healthy replicas. The engine
        is not stopped (it may still answer, and a restart cannot cure a chip: the start gate would refuse it)."""
        probe = self.options.chip_probe
        now = time.monotonic()
        if probe is None or now - self._chips_checked < self.options.chip_interval_s:
            return
        self._chips_checked = now
        problem = probe()
        if problem and self._state.stage == Stage.HEALTHY:
            self._set_stage(Stage.DEGRADED, problem)
            self._say(f"degraded: {problem}")
            self._router_change(leave_router)
        elif not problem and self._state.stage == Stage.DEGRADED:
            self._set_stage(Stage.HEALTHY, "its chips report health OK again")
            self._say("its chips report health OK again")
            self._router_change(join_router)
        self._chip_problem = problem

    def _drain_stage_events(self, ready: bool) -> None:
        while True:
            with self._lock:
                if not self._stage_events:
                    return
                stage, detail = self._stage_events.popleft()
            current = self._state.stage or Stage.STARTING
            # Log stages only move forward, and never past "healthy" (which only /health may announce).
            if not ready and stage.order > current.order:
                self._set_stage(stage, detail)

    def _engine_exited(self, returncode: int) -> Outcome:
        if self._reader is not None:
            self._reader.join(timeout=5)
        self._kill_group(signal.SIGKILL)
        lines = self._lines_snapshot()
        diagnosis = diagnose(lines, self._facts()) or signal_diagnosis(returncode)
        if returncode < 0:
            code = 128 - returncode
        elif returncode == 0:
            code = 1  # a server that exits on its own, unasked, has failed
        else:
            code = returncode
        if diagnosis is not None and diagnosis.permanent:
            code = EXIT_CONFIG
        return Outcome(code, "engine-exited", returncode, diagnosis)

    def _group_where(self, local: bool) -> str:
        """Where a hang is, for its diagnosis: this host (its own process) or, for a stall the head or leader sees,
        any rank of the group; nothing for a single-node engine."""
        cluster = self.record.cluster
        if cluster is None:
            return ""
        if local:
            return f" on {self._host_name()}"
        if cluster.is_ray:
            # A worker process stopped on a node shows only in that node's /proc: Ray runs the look there.
            finder = self.options.stopped_worker_finder or find_stopped_workers
            stopped = finder(cluster)
            if stopped:
                return f" on {', '.join(stopped)} (a Ray worker process stopped there: SIGSTOP or a debugger)"
        return f" (a rank on one of {', '.join(n.name for n in cluster.nodes)})"

    def _hung(self, why: str, where: str = "") -> Outcome:
        self._say(f"the engine hangs{where}: {why}; killing it")
        self._kill_group(signal.SIGKILL)
        assert self._process is not None
        self._process.wait()
        logs = ("every host's log (`npuops logs NAME -i INVENTORY --group GROUP`) for the rank that stopped first"
                if self.record.cluster is not None else "the engine's last log lines (`npuops logs NAME`)")
        diagnosis = diagnose(self._lines_snapshot(), self._facts()) or Diagnosis(
            "hang", f"the engine hangs{where}: {why}",
            f"read {logs}; on an NPU node check the chips with "
            "`npuops doctor --only chip-health,chip-health-detail` (a stuck chip hangs the engine)", why, "npuops")
        return Outcome(1, "hang", self._process.returncode, diagnosis)

    def _start_timed_out(self) -> Outcome:
        self._say(f"the engine was not healthy within {self.record.timeout_start_s} s; stopping it")
        code = self._stop_engine()
        diagnosis = diagnose(self._lines_snapshot(), self._facts()) or Diagnosis(
            "start-timeout", f"the engine did not answer /health within {self.record.timeout_start_s} s "
            f"(last stage: {self._state.stage.value if self._state.stage else None})",
            "read the engine's log (`npuops logs NAME`) for the stage it stopped at; for a large model raise "
            "the start timeout with `npuops launch --start-timeout SECONDS`", "", "npuops")
        return Outcome(1, "start-timeout", code, diagnosis)

    def _host_name(self) -> str:
        """This host's name in its group (the inventory's), or "this host"."""
        cluster = self.record.cluster
        names = [n.name for n in cluster.nodes] if cluster is not None else []
        return names[cluster.rank] if cluster is not None and 0 <= cluster.rank < len(names) else "this host"

    def _facts(self) -> dict[str, str]:
        hosts = {f"host:{n.address}": n.name for n in self.record.cluster.nodes} if self.record.cluster else {}
        return {"name": self.record.name, "env_file": str(self.record.env_file), "port": str(self.record.port),
                "model": self.record.model_path, "user": _user_name(), **hosts}

    def _finish(self, outcome: Outcome) -> Outcome:
        if self._reader is not None:
            self._reader.join(timeout=5)
        lines = self._lines_snapshot()
        outcome.log_tail = lines[-LOG_TAIL_LINES:]
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._state.exit = SupervisorExit(outcome.exit_code, outcome.reason, outcome.engine_returncode, time.time(),
                                          outcome.diagnosis, tuple(outcome.log_tail))
        self._set_stage(Stage.EXITED, outcome.reason)
        self._write_status()
        if outcome.reason != "stopped":
            self._say(f"the engine exited ({outcome.reason}, engine status {outcome.engine_returncode}); "
                      f"supervisor exits {outcome.exit_code}")
            if outcome.diagnosis is not None:
                self._say(f"diagnosis [{outcome.diagnosis.id}]: {outcome.diagnosis.cause}")
                if outcome.diagnosis.line:
                    self._say(f"  seen: {outcome.diagnosis.line}")
                self._say(f"  fix: {outcome.diagnosis.fix}")
        else:
            self._say("stopped")
        self.notifier.close()
        return outcome
