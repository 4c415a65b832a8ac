"""`npuops status|stop|logs NAME -i INVENTORY --group GROUP`: the same commands on every host of a serving group,
through playbooks/npuops-command.yml, folded into one answer for the group.

Each host answers for its own part (its units, its supervisor); the group is healthy when every part runs and the
first host's endpoint answers, and under Ray when every host's node is alive. A lost worker shows as that host's
part down and as the head naming it among the missing Ray nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuops.fleet.events import PlaybookEvent
from npuops.fleet.facts import FIX_UNREACHABLE, failure_fix
from npuops.fleet.host_results import HostStatus
from npuops.fleet.inventory import InventoryHost, read_inventory_group
from npuops.fleet.runner import run_playbook
from npuops.instance.ray import RayState
from npuops.instance.status import InstanceStatus
from npuops.safefiles import printable
from npuops.wire import WireFormatError

COMMAND_PLAYBOOK = "npuops-command.yml"


@dataclass(frozen=True)
class HostAnswer:
    host: str
    status: HostStatus
    answer: Mapping[str, Any] | None
    rc: int | None = None
    message: str = ""
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "rc": self.rc, "message": self.message, "fix": self.fix,
                "answer": self.answer}


def run_on_hosts(inventory: Path, limit: str, args: Sequence[str], *, ok_rcs: Sequence[int] = (0,),
                 artifacts_dir: Path, forks: int = 10, timeout_s: int = 300,
                 on_event: Callable[[PlaybookEvent], None] | None = None) -> dict[str, HostAnswer]:
    """`npuops ARGS` on the hosts `limit` selects; each host's parsed JSON answer, or why there is none."""
    run = run_playbook(COMMAND_PLAYBOOK, inventory=inventory, artifacts_dir=artifacts_dir, limit=limit,
                       extravars={"npuops_args": list(args), "npuops_ok_rcs": list(ok_rcs),
                                  "npuops_command_timeout_s": timeout_s},
                       forks=forks, on_event=on_event)
    answers: dict[str, HostAnswer] = {}
    for name, result in run.hosts.items():
        answer = result.data.get("npuops_answer")
        rc_raw = result.data.get("npuops_rc")
        rc = int(rc_raw) if isinstance(rc_raw, (int, str)) and str(rc_raw).lstrip("-").isdigit() else None
        if result.status == "unreachable":
            answers[name] = HostAnswer(name, "unreachable", None, None, result.message or "unreachable",
                                       FIX_UNREACHABLE)
        elif result.status == "failed" or not isinstance(answer, Mapping):
            failure = result.failures[-1] if result.failures else None
            answers[name] = HostAnswer(name, "failed", None, failure.rc if failure else None,
                                       result.message or "no answer", failure_fix(result))
        else:
            answers[name] = HostAnswer(name, "ok", answer, rc)
    return answers


FIX_NO_STATUS = "run `npuops status NAME --json` on the host; upgrade npuops there if it is not npuops' answer"


@dataclass(frozen=True)
class HostPartStatus:
    """One host's part of the group: its instance's status (read from its answer), or why there is none."""

    status: str  # ok, or why the host gave no status (unreachable, failed, not reached, unreadable)
    instance: InstanceStatus | None = None
    message: str = ""
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        if self.status == "ok":
            return {"status": "ok", "instance": self.instance.to_json() if self.instance is not None else None}
        return {"status": self.status, "message": self.message, "fix": self.fix, "instance": None}


@dataclass(frozen=True)
class GroupStatus:
    """The group from every host's `npuops status NAME --json`: healthy when every part runs, the first host's
    endpoint answers and, under Ray, every host's node is alive."""

    hosts: Mapping[str, HostPartStatus]
    down: tuple[str, ...]
    endpoint_host: str | None = None  # the first host, when it answered
    endpoint: InstanceStatus | None = None
    answers: Mapping[str, HostAnswer] = field(default_factory=dict)

    @property
    def ray(self) -> RayState | None:
        cluster = self.endpoint.cluster if self.endpoint is not None else None
        return cluster.ray if cluster is not None else None

    @property
    def ok(self) -> bool:
        return (not self.down and self.endpoint is not None and self.endpoint.healthy
                and (self.ray is None or self.ray.complete))

    def to_json(self) -> dict[str, Any]:
        endpoint = None
        if self.endpoint is not None:
            endpoint = {"host": self.endpoint_host, "url": self.endpoint.url, "state": self.endpoint.state,
                        "healthy": self.endpoint.healthy}
        data: dict[str, Any] = {"ok": self.ok, "hosts": {h: p.to_json() for h, p in self.hosts.items()},
                                "down": list(self.down), "endpoint": endpoint,
                                "ray": self.ray.to_json() if self.ray is not None else None}
        if self.answers:
            data["answers"] = {h: a.to_json() for h, a in self.answers.items()}
        return data


def _host_part(answer: HostAnswer | None) -> HostPartStatus:
    if answer is None or answer.answer is None:
        return HostPartStatus(answer.status if answer else "not reached",
                              message=answer.message if answer else "the host gave no answer",
                              fix=answer.fix if answer else FIX_UNREACHABLE)
    instances = answer.answer.get("instances") or []
    if not instances:
        return HostPartStatus("ok")
    try:
        return HostPartStatus("ok", InstanceStatus.from_json(instances[0]))
    except WireFormatError as exc:
        return HostPartStatus("unreadable", message=exc.problem, fix=FIX_NO_STATUS)


def group_status(hosts: Sequence[InventoryHost], answers: Mapping[str, HostAnswer]) -> GroupStatus:
    """One view of the group from every host's `npuops status NAME --json`. Pure."""
    parts = {host.name: _host_part(answers.get(host.name)) for host in hosts}
    down = tuple(name for name, part in parts.items() if part.instance is None or not part.instance.healthy)
    first = hosts[0].name if hosts else None
    endpoint = parts[first].instance if first is not None else None
    return GroupStatus(parts, down, first if endpoint is not None else None, endpoint)


def render_group_status_text(name: str, group: str, view: GroupStatus) -> str:
    lines = [f"{name} on group {group}: {'healthy' if view.ok else 'NOT healthy'}"]
    for host, part in view.hosts.items():
        instance = part.instance
        if instance is None:
            if part.status == "ok":
                lines.append(f"  {host:<20} ok: the host shows no instance {name}")
            else:
                lines.append(f"  {host:<20} {part.status}: {part.message} (fix: {part.fix})")
            continue
        unit = instance.unit_state
        role = instance.role or (instance.cluster.role if instance.cluster is not None else "") or "engine"
        lines.append(f"  {host:<20} {role:<10} {instance.state}  {instance.unit or ''} "
                     f"{unit.active_state if unit else ''}/{unit.sub_state if unit else ''}".rstrip())
        diagnosis = instance.diagnosis
        if diagnosis:
            lines.append(f"  {'':<20} [{diagnosis.id}] {diagnosis.cause}; fix: {diagnosis.fix}")
    if view.endpoint is not None:
        lines.append(f"endpoint: {view.endpoint.url} on {view.endpoint_host}: {view.endpoint.state}")
    if view.ray is not None:
        lines.append(f"ray: {view.ray.describe()}")
    # Every host's answer is its own to write (its supervisor's status file, its diagnosis): escaped line by line.
    return "\n".join(printable(line) for line in lines)


def status_group(inventory: Path, group: str, name: str, *, artifacts_dir: Path, forks: int,
                 on_event: Callable[[PlaybookEvent], None] | None = None) -> GroupStatus:
    hosts = read_inventory_group(inventory, group)
    answers = run_on_hosts(inventory, group, ["status", name, "--json"], ok_rcs=(0, 1), artifacts_dir=artifacts_dir,
                           forks=forks, timeout_s=120, on_event=on_event)
    view = group_status(hosts, answers)
    return GroupStatus(view.hosts, view.down, view.endpoint_host, view.endpoint, answers)


def stop_group(inventory: Path, group: str, name: str, *, artifacts_dir: Path, forks: int,
               on_event: Callable[[PlaybookEvent], None] | None = None) -> dict[str, Any]:
    """The first host (the endpoint, the head) first, so no request lands on a half-stopped cluster; then the rest."""
    hosts = read_inventory_group(inventory, group)
    first = hosts[0].name
    answers = run_on_hosts(inventory, first, ["stop", name, "--json"], ok_rcs=(0, 1), artifacts_dir=artifacts_dir,
                           forks=forks, on_event=on_event)
    if len(hosts) > 1:
        answers.update(run_on_hosts(inventory, f"{group}:!{first}", ["stop", name, "--json"], ok_rcs=(0, 1),
                                    artifacts_dir=artifacts_dir, forks=forks, on_event=on_event))
    stopped = {}
    for host in hosts:
        answer = answers[host.name].answer if host.name in answers else None
        stopped[host.name] = bool(answer is not None and answer.get("ok"))
    return {"ok": all(stopped.values()), "stopped": stopped, "answers": {h: a.to_json() for h, a in answers.items()}}


def logs_group(inventory: Path, group: str, name: str, lines: int, *, artifacts_dir: Path, forks: int,
               on_event: Callable[[PlaybookEvent], None] | None = None) -> dict[str, Any]:
    hosts = read_inventory_group(inventory, group)
    answers = run_on_hosts(inventory, group, ["logs", name, "-n", str(lines), "--json"],
                           artifacts_dir=artifacts_dir, forks=forks, on_event=on_event)
    return {"ok": all(a.status == "ok" for a in answers.values()) and len(answers) == len(hosts),
            "hosts": {h.name: answers[h.name].to_json() if h.name in answers else None for h in hosts}}
