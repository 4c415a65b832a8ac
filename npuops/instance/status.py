"""What `npuops status` and `npuops list` report about an instance: the unit's state, the supervisor's stage and
last diagnosis, /health, uptime, and the live figures from /metrics. One `InstanceStatus`, which is also what
`npuops status NAME --json` prints; the group commands read every host's answer back with `InstanceStatus.from_json`
(an older npuops there may leave keys out)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError
from npuops.httpclient import base_url
from npuops.instance.bench_results import bench_headline, last_bench, render_bench_headline
from npuops.instance.control import parts_of, pid_alive
from npuops.instance.endpoint import health_ok, scrape_metrics
from npuops.instance.exit_statuses import unit_diagnosis
from npuops.instance.manager import NO_ANSWER, SystemdManager, UnitState
from npuops.instance.membership import ClusterNode
from npuops.instance.metrics import engine_figures, router_figures
from npuops.instance.ray import RayState, probe_ray_cluster
from npuops.instance.record import (
    MANAGER_SYSTEMD,
    ROLE_REPLICAS,
    ROLE_ROUTER,
    UNREADABLE,
    InstanceRecord,
    UnreadableRecord,
    load_record,
    read_status,
    scan_records,
)
from npuops.instance.revisions import rollout_in_progress
from npuops.instance.state import Diagnosis, Stage, SupervisorExit, SupervisorState
from npuops.safefiles import printable
from npuops.textout import wrapped
from npuops.wire import WireObject

INSTANCE_STATUS = "instance status"
# The unit's journal lines read for a failed unit: enough to hold systemd's last start attempt and its verdict.
JOURNAL_LINES = 30


def unit_state_from_json(data: object) -> UnitState:
    """A unit's state as UnitState.to_json writes it (inside another host's `npuops status --json`)."""
    unit = WireObject.wrap(data, INSTANCE_STATUS)
    return UnitState(active_state=unit.text("active_state", "unknown"), sub_state=unit.text("sub_state"),
                     main_pid=unit.opt_integer("main_pid"), since=unit.text("since"),
                     restarts=unit.opt_integer("restarts"), result=unit.text("result"), enabled=unit.text("enabled"),
                     loaded=unit.text("loaded"), exit_status=unit.opt_integer("exit_status"))


@dataclass(frozen=True)
class ClusterStatus:
    """This host's part of a multi-node instance and, under Ray, which hosts' nodes are alive."""

    group: str
    strategy: str
    rank: int
    role: str
    endpoint_host: str
    nodes: tuple[ClusterNode, ...] = ()
    ray: RayState | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"group": self.group, "strategy": self.strategy, "rank": self.rank, "role": self.role,
                                "endpoint_host": self.endpoint_host, "nodes": [n.to_json() for n in self.nodes]}
        if self.ray is not None:
            data["ray"] = self.ray.to_json()
        return data

    @classmethod
    def from_json(cls, data: object) -> ClusterStatus:
        cluster = WireObject.wrap(data, INSTANCE_STATUS)
        ray = cluster.opt_obj("ray")
        return cls(cluster.text("group"), cluster.text("strategy"), cluster.integer("rank"), cluster.text("role"),
                   cluster.text("endpoint_host"), tuple(ClusterNode.from_json(n) for n in cluster.objects("nodes")),
                   RayState.from_json(ray) if ray is not None else None)


@dataclass(frozen=True)
class InstanceStatus:
    """One instance's status on this host (`npuops status NAME --json` prints `instances: [to_json()]`)."""

    name: str
    state: str  # healthy, starting (STAGE), unhealthy, stopping, stopped, failed
    healthy: bool
    manager: str = ""
    unit: str | None = None
    url: str = ""
    model: str = ""
    devices: tuple[int, ...] = ()
    unit_state: UnitState | None = None
    stage: str | None = None  # the supervisor's (a newer npuops elsewhere may know more stages than this one)
    uptime_s: float | None = None
    metrics: Mapping[str, Any] | None = None  # the live figures from /metrics (npuops.instance.endpoint)
    diagnosis: Diagnosis | None = None
    exit: SupervisorExit | None = None  # its summary: code, reason, engine status, time (the diagnosis is apart)
    cluster: ClusterStatus | None = None
    role: str | None = None  # with a cluster: engine, headless, ray-worker; "router" for a router
    # A router: the replicas behind it (each one's own status) and the router's Prometheus port.
    parts: tuple[InstanceStatus, ...] = ()
    metrics_port: int | None = None
    # How the run before the current one ended: why the unit was restarted (a crash, a hang, ...).
    previous_exit: SupervisorExit | None = None
    # The headline of the last `npuops bench` of this instance (npuops/instance/bench_results.py).
    last_bench: Mapping[str, Any] | None = None
    # An engine of a disaggregated instance: its pool (prefill or decode).
    pd_role: str | None = None
    # What the operator should know every time they look (a unit that runs as root).
    warnings: tuple[str, ...] = ()
    # The revision this part serves (npuops.instance.revisions; 0: launched before npuops kept them) and, on the
    # instance itself, the rollout under way.
    revision: int = 0
    rollout: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name, "manager": self.manager, "unit": self.unit, "url": self.url, "model": self.model,
            "devices": list(self.devices), "healthy": self.healthy,
            "unit_state": self.unit_state.to_json() if self.unit_state is not None else None,
            "stage": self.stage, "uptime_s": self.uptime_s,
            "metrics": dict(self.metrics) if self.metrics is not None else None,
            "diagnosis": self.diagnosis.to_json() if self.diagnosis is not None else None,
            "exit": self.exit.summary_json() if self.exit is not None else None,
        }
        if self.previous_exit is not None:
            previous = self.previous_exit
            data["previous_exit"] = {**previous.summary_json(),
                                     "diagnosis": previous.diagnosis.to_json() if previous.diagnosis else None}
        if self.cluster is not None:
            data["cluster"] = self.cluster.to_json()
            data["role"] = self.role
        if self.role in (ROLE_ROUTER, ROLE_REPLICAS):
            data["role"] = self.role
            data["metrics_port"] = self.metrics_port
            data["parts"] = [p.to_json() for p in self.parts]
        if self.last_bench is not None:
            data["last_bench"] = dict(self.last_bench)
        if self.pd_role is not None:
            data["pd_role"] = self.pd_role
        if self.warnings:
            data["warnings"] = list(self.warnings)
        data["revision"] = self.revision
        data["rollout"] = self.rollout
        data["state"] = self.state
        return data

    @classmethod
    def from_json(cls, data: object) -> InstanceStatus:
        """One entry of `npuops status --json`'s instances, from this npuops or an older one; name and state are
        required (they tell a status from other JSON), every other key takes its default when missing."""
        status = WireObject.wrap(data, INSTANCE_STATUS)
        unit, metrics, cluster = status.opt_obj("unit_state"), status.opt_obj("metrics"), status.opt_obj("cluster")
        diagnosis, done, previous = status.opt_obj("diagnosis"), status.opt_obj("exit"), status.opt_obj("previous_exit")
        return cls(
            name=status.req_text("name"), state=status.req_text("state"), healthy=status.flag("healthy"),
            manager=status.text("manager"), unit=status.opt_text("unit"), url=status.text("url"),
            model=status.text("model"), devices=status.integers("devices"),
            unit_state=unit_state_from_json(unit) if unit is not None else None,
            stage=status.opt_text("stage"), uptime_s=status.opt_number("uptime_s"),
            metrics=dict(metrics.data) if metrics is not None else None,
            diagnosis=Diagnosis.from_json(diagnosis) if diagnosis is not None else None,
            exit=SupervisorExit.from_json(done) if done is not None else None,
            cluster=ClusterStatus.from_json(cluster) if cluster is not None else None,
            role=status.opt_text("role"),
            previous_exit=SupervisorExit.from_json(previous) if previous is not None else None,
            parts=tuple(cls.from_json(p.data) for p in status.objects("parts")),
            metrics_port=status.opt_integer("metrics_port"),
            last_bench=dict(bench.data) if (bench := status.opt_obj("last_bench")) is not None else None,
            pd_role=status.opt_text("pd_role"),
            warnings=status.texts("warnings"),
            revision=status.integer("revision"), rollout=status.opt_text("rollout"),
        )


def summarize(record: InstanceRecord, unit: UnitState | None, supervisor: SupervisorState | None,
              healthy: bool) -> str:
    """One word (and a reason) for the instance: healthy, starting, unhealthy, failed, stopped. Pure."""
    exit_info = supervisor.exit if supervisor is not None else None
    stage = supervisor.stage.value if supervisor is not None and supervisor.stage is not None else None
    if unit is not None:
        active = unit.active_state
        if unit.sub_state == NO_ANSWER:
            return f"unknown ({NO_ANSWER} within the command timeout)"
        if active == "active" and healthy:
            return _serving(supervisor)
        if active == "activating" and unit.sub_state == "auto-restart":
            # Between a failed run and systemd's next try (RestartSec=): say why it failed, not "starting".
            return f"restarting (after {exit_info.reason})" if exit_info is not None else "restarting"
        if active == "activating":
            return f"starting ({stage or 'gate'})"
        if active == "active":
            return "unhealthy" if stage != "starting" else "starting"
        if active == "failed":
            return "failed"
        if active == "deactivating":
            return _stopping(supervisor)
        return "stopped" if exit_info is None or not exit_info.failed else "failed"
    # Foreground: the supervisor's own status file and whether it still runs.
    alive = supervisor is not None and exit_info is None and pid_alive(supervisor.supervisor_pid)
    if alive and healthy:
        return _serving(supervisor)
    if alive:
        if stage == "stopping":
            return _stopping(supervisor)
        if stage in ("healthy", "unhealthy", "degraded"):
            return "unhealthy"
        return f"starting ({stage})"
    if exit_info is not None and exit_info.failed:
        return "failed"
    return "stopped"


def _serving(supervisor: SupervisorState | None) -> str:
    """An engine that answers: healthy, or degraded with the supervisor's reason (a chip it runs on in Alarm)."""
    if supervisor is None or supervisor.stage != Stage.DEGRADED:
        return "healthy"
    detail = supervisor.stages[-1].detail if supervisor.stages else ""
    return f"degraded: {detail}" if detail else "degraded"


def _stopping(supervisor: SupervisorState | None) -> str:
    """A stopping engine, with the requests its drain still holds (the supervisor counts them)."""
    held = supervisor.in_flight if supervisor is not None and supervisor.stage == Stage.STOPPING else None
    return f"draining ({held} requests in flight)" if held else "stopping"


def _journal_if_failed(manager: SystemdManager, unit_name: str, unit: UnitState) -> list[str]:
    """The unit's last journal lines when it failed (whether systemd gave up restarting it is said only there)."""
    return manager.recent_log(unit_name, JOURNAL_LINES) if unit.active_state == "failed" else []


def _replica_set_status(record: InstanceRecord, manager: SystemdManager | None, metrics_interval_s: float
                        ) -> InstanceStatus:
    """A host's replicas of a model whose router runs on another host: healthy when every one of them is."""
    parts = _replica_statuses(record, manager, metrics_interval_s)
    down = [p.name for p in parts if not p.healthy or p.state.startswith("degraded")]
    healthy = bool(parts) and not down
    state = ("healthy" if healthy else "stopped" if all(p.state == "stopped" for p in parts)
             else f"degraded ({', '.join(down)} not healthy)")
    return InstanceStatus(name=record.name, state=state, healthy=healthy, manager=record.manager,
                          url=base_url(record.host, record.port), model=record.served_model_name,
                          role=ROLE_REPLICAS, parts=parts)


def instance_status(record: InstanceRecord, manager: SystemdManager | None, *, metrics_interval_s: float = 1.0,
                    ) -> InstanceStatus:
    if record.is_replica_set:
        return _replica_set_status(record, manager, metrics_interval_s)
    url = base_url(record.host, record.port)
    unit = None
    if record.manager == MANAGER_SYSTEMD and manager is not None and manager.unavailable_reason() is None:
        unit = manager.state(record.unit)
    supervisor = read_status(record)
    if record.serves_api:
        healthy = health_ok(url, timeout=3.0, path=record.health_path)
    else:
        # A Ray worker or a headless engine answers no HTTP: its unit running (and, for an engine, its
        # supervisor seeing the process) is its health; the group's health is the first host's endpoint.
        healthy = unit is not None and unit.active_state == "active"
    done = supervisor.exit if supervisor is not None else None
    uptime = None
    if healthy and supervisor is not None and supervisor.healthy_at is not None and done is None:
        uptime = round(time.time() - supervisor.healthy_at, 1)
    metrics = None
    if healthy and record.is_router:
        metrics = _router_metrics(record)
    elif healthy and record.serves_api:
        before = scrape_metrics(url)
        if before is not None:
            time.sleep(metrics_interval_s)
            now = scrape_metrics(url)
            if now is not None:
                metrics = engine_figures(now, before, metrics_interval_s)
    last = done.diagnosis if done is not None else None
    # The supervisor's diagnosis, unless systemd could not even run it (or gave up restarting it).
    diagnosis = (unit_diagnosis(record.unit, unit, last, _journal_if_failed(manager, record.unit, unit))
                 if unit is not None and manager is not None else None) or last
    state = summarize(record, unit, supervisor, healthy)
    parts = _replica_statuses(record, manager, metrics_interval_s) if record.is_router else ()
    # A degraded replica answers but is out of the router (a chip of its in Alarm): the endpoint is short of it too.
    down = [p.name for p in parts if not p.healthy or p.state.startswith("degraded")]
    if healthy and down:
        # The endpoint answers (the router sends everything to the rest), but not at full strength.
        state, healthy = f"degraded ({', '.join(down)} not healthy)", False
    return InstanceStatus(
        name=record.name, state=state, healthy=healthy, parts=parts,
        metrics_port=record.metrics_port if record.is_router else None,
        manager=record.manager, unit=record.unit if record.manager == MANAGER_SYSTEMD else None, url=url,
        model=record.served_model_name, devices=record.devices, unit_state=unit,
        stage=supervisor.stage.value if supervisor is not None and supervisor.stage is not None else None,
        uptime_s=uptime, metrics=metrics, diagnosis=diagnosis,
        # The exit as status shows it: its summary and the gate's refusing checks (the diagnosis is a field of its
        # own, the log tail stays home).
        exit=replace(done, diagnosis=None, log_tail=()) if done is not None else None,
        cluster=cluster_status(record),
        role=record.role if record.cluster is not None or record.is_router else None,
        pd_role=record.pd_role,
        previous_exit=supervisor.previous_exit if supervisor is not None else None,
        last_bench=bench_headline(report) if (report := last_bench(record)) is not None else None,
        warnings=record_warnings(record),
        revision=record.revision,
        rollout=progress.describe() if (progress := rollout_in_progress(Path(record.instance_dir).parent,
                                                                         record.name)) else None,
    )


def lingering_fix(status: InstanceStatus) -> str | None:
    """What `list` says of an instance that lingers (pure): a foreground run that has ended keeps its record
    until launched again or removed; a failed unit stays installed until fixed or removed."""
    if status.manager != MANAGER_SYSTEMD and status.state in ("failed", "stopped"):
        return (f"its foreground run has ended; fix: launch it again, or `npuops remove {status.name}` "
                "to forget it")
    if status.manager == MANAGER_SYSTEMD and status.state == "failed":
        return f"fix: `npuops status {status.name}` says why; `npuops remove {status.name}` uninstalls it"
    return None


def record_warnings(record: InstanceRecord) -> tuple[str, ...]:
    """What status says about an instance every time (pure): a unit that runs as root."""
    if record.service_user == "root":
        return ("the unit runs as root (launched with --allow-root): a compromised engine owns the node; "
                "launch it again with an unprivileged --service-user",)
    return ()


def _router_metrics(record: InstanceRecord) -> dict[str, Any] | None:
    if record.metrics_port is None:
        return None
    samples = scrape_metrics(base_url("127.0.0.1", record.metrics_port))
    return router_figures(samples) if samples is not None else None


def _replica_statuses(record: InstanceRecord, manager: SystemdManager | None, metrics_interval_s: float
                      ) -> tuple[InstanceStatus, ...]:
    """The status of each replica behind a router."""
    return tuple(instance_status(part, manager, metrics_interval_s=metrics_interval_s) for part in parts_of(record))


def top_level(records: list[InstanceRecord]) -> list[InstanceRecord]:
    """The records `status`/`list` show on their own: a replica behind a router is shown under it."""
    routers = {r.name for r in records if r.is_router}
    return [r for r in records if r.behind not in routers]


def wait_for_statuses(state_dir: Path, name: str | None, manager: SystemdManager, wait_s: float = 0.0
                      ) -> list[InstanceStatus]:
    """The status of instance `name` (of every instance without a name), waiting up to `wait_s` until each is
    healthy or failed; an instance whose record a launch has not written yet is waited for too."""
    deadline = time.monotonic() + wait_s
    unreadable: list[UnreadableRecord] = []
    while True:
        try:
            if name:
                records = [load_record(state_dir, name)]
            else:
                found, unreadable = scan_records(state_dir)
                records = top_level(found)
            break
        except BadInputError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
    while True:
        statuses = [instance_status(r, manager) for r in records]
        # A stopped instance may be about to start (a boot, a restart): only healthy or failed ends the wait.
        if all(s.state in ("healthy", "failed") for s in statuses) or time.monotonic() >= deadline:
            return statuses + [unreadable_status(u) for u in unreadable]
        time.sleep(1.0)


def unreadable_status(unreadable: UnreadableRecord) -> InstanceStatus:
    """The row of an instance whose record cannot be read: its problem and fix, as a diagnosis (pure)."""
    return InstanceStatus(name=unreadable.name, state=UNREADABLE, healthy=False,
                          diagnosis=Diagnosis("record-unreadable", unreadable.problem, unreadable.fix, "",
                                              "instance record"))


def cluster_status(record: InstanceRecord) -> ClusterStatus | None:
    """This host's part of a multi-node instance and, under Ray, which hosts' nodes are alive."""
    cluster = record.cluster
    if cluster is None:
        return None
    ray = probe_ray_cluster(cluster) if cluster.is_ray else None
    return ClusterStatus(cluster.group, cluster.strategy, cluster.rank, cluster.role, cluster.endpoint_host,
                         cluster.nodes, ray)


def _fmt(value: Any, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value * scale:.{digits}f}{unit}"


def render_status_text(status: InstanceStatus) -> str:
    """The status as an operator reads it. Its texts come from the supervisor's status file (the service user's to
    write), the engine's /metrics, the journal and other hosts' answers: each line is escaped as a whole (a control
    character, an escape sequence or a newline inside a value shows as `\\x1b`, `\\n`), so no value can move the
    cursor, retitle the terminal or forge a line of its own; `--json` keeps every value as it was read."""
    return "\n".join(printable(line) for line in _status_lines(status))


def _status_lines(status: InstanceStatus) -> list[str]:
    """The status's lines, one element each, their values as they were read (render_status_text escapes them)."""
    if status.state == UNREADABLE and status.diagnosis is not None:
        return [f"{status.name}: {UNREADABLE}", f"  problem   {status.diagnosis.cause}",
                f"  fix       {status.diagnosis.fix}"]
    lines = [f"{status.name}: {status.state}  ({status.model} on {status.url})"]
    lines += [f"  warning   {warning}" for warning in status.warnings]
    if status.revision:
        lines.append(f"  revision  {status.revision}")
    if status.rollout:
        lines += wrapped(status.rollout, "  rollout   ").split("\n")
    unit = status.unit_state
    if unit:
        restarts = f", {unit.restarts} restart(s)" if unit.restarts else ""
        pid = f", main pid {unit.main_pid}" if unit.main_pid else ""
        # systemd's Result= of the last run: "success" unless it failed (exit-code, signal, watchdog, timeout, ...).
        result = f", last result {unit.result}" if unit.result and unit.result != "success" else ""
        lines.append(f"  unit      {status.unit}: {unit.active_state}/{unit.sub_state}"
                     f"{', since ' + unit.since if unit.since else ''}{pid}{restarts}{result}")
    elif status.manager != MANAGER_SYSTEMD:
        lines.append("  manager   foreground supervisor (no unit)")
    if status.stage:
        lines.append(f"  stage     {status.stage}")
    if status.uptime_s is not None:
        lines.append(f"  uptime    {status.uptime_s:.0f} s")
    previous = status.previous_exit
    if previous is not None and previous.failed:
        why = f"[{previous.diagnosis.id}] {previous.diagnosis.cause}" if previous.diagnosis else previous.reason
        lines.append(f"  restarted after {previous.reason} (status {previous.code}): {why}")
    if status.devices:
        lines.append(f"  devices   {','.join(map(str, status.devices))}")
    metrics = status.metrics
    if metrics and status.role != ROLE_ROUTER:
        lines.append(f"  requests  {_fmt(metrics['requests_running'], digits=0)} running, "
                     f"{_fmt(metrics['requests_waiting'], digits=0)} waiting")
        lines.append(f"  KV cache  {_fmt(metrics['kv_cache_usage'], 100, '%')} used"
                     + (f" of {metrics['kv_cache_tokens']:,} tokens" if metrics.get("kv_cache_tokens") else ""))
        lines.append(f"  tokens/s  {_fmt(metrics.get('generation_tokens_per_s'))} generated, "
                     f"{_fmt(metrics.get('prompt_tokens_per_s'))} prompt "
                     f"(totals {_fmt(metrics['generation_tokens_total'], digits=0)} / "
                     f"{_fmt(metrics['prompt_tokens_total'], digits=0)})")
        for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL")):
            q = metrics[key]
            lines.append(f"  {label:<9} p50 {_fmt(q['p50'], 1000, ' ms')}, p90 {_fmt(q['p90'], 1000, ' ms')}, "
                         f"p99 {_fmt(q['p99'], 1000, ' ms')}")
    if status.role in (ROLE_ROUTER, ROLE_REPLICAS):
        lines += _router_lines(status)
    if status.last_bench:
        lines.append(f"  bench     {render_bench_headline(dict(status.last_bench))}")
    cluster = status.cluster
    if cluster:
        lines.append(f"  cluster   {cluster.strategy} group {cluster.group}: this host is {cluster.role} "
                     f"(rank {cluster.rank}), endpoint on {cluster.endpoint_host}")
        if cluster.ray:
            lines.append(f"  ray       {cluster.ray.describe()}")
    diagnosis = status.diagnosis
    if diagnosis:
        done = status.exit
        lines.append(f"  last exit {done.reason if done else None} (status {done.code if done else None})")
        if done is not None and len(done.blocking) > 1:
            lines.append(f"  refused   by {', '.join(done.blocking)} (`npuops logs {status.name}` has each fix)")
        lines.append(f"  diagnosis [{diagnosis.id}] {diagnosis.cause}")
        if diagnosis.line:
            lines.append(f"  seen      {diagnosis.line}")
        lines.append(f"  fix       {diagnosis.fix}")
    elif status.exit is not None and status.exit.failed:
        # A failure no signature explains: what a support case needs, gathered in one step.
        lines.append(f"  last exit {status.exit.reason} (status {status.exit.code}), no known cause")
        lines.append(f"  next      `npuops logs {status.name}`, then `npuops collect {status.name}` for a support "
                     "case")
    return lines


def _router_lines(status: InstanceStatus) -> list[str]:
    """The router's figures and one line per replica behind it: its URL, state, requests, KV use, restarts."""
    metrics = status.metrics or {}
    workers = metrics.get("workers") or {}
    lines = [f"  router    {_fmt(metrics.get('requests_total'), digits=0)} request(s), "
             f"{_fmt(metrics.get('errors_total'), digits=0)} error(s); metrics on 127.0.0.1:{status.metrics_port}"
             if status.role == ROLE_ROUTER else "  replicas  this host's, behind the router on the group's first host"]
    for part in status.parts:
        seen = workers.get(part.url, {})
        figures = part.metrics or {}
        restarts = part.unit_state.restarts if part.unit_state is not None else None
        kv = f"KV {_fmt(figures.get('kv_cache_usage'), 100, '%')}, {restarts or 0} restart(s)"
        if part.pd_role == "decode":
            kv += f", {_fmt(figures.get('external_kv_tokens_total'), digits=0)} prompt token(s) loaded from prefill"
        if status.role != ROLE_ROUTER:  # the router that knows what it sends where is on another host
            lines.append(f"  {part.name:<9} {part.state} on {part.url}: {kv}")
            continue
        routed = "out (health checks fail)" if seen.get("healthy") is False else (
            "out (circuit open)" if seen.get("circuit_open") else "in")
        pool = f"{part.pd_role} " if part.pd_role else ""
        revision = f", revision {part.revision}" if part.revision else ""
        lines.append(f"  {part.name:<9} {pool}{part.state} on {part.url}: {routed}{revision}, "
                     f"{_fmt(seen.get('requests'), digits=0)} request(s) routed, {kv}")
    return lines
