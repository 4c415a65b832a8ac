"""`npuops status|stop|logs NAME -i INVENTORY --group GROUP`: the same commands on every host of a serving group,
through playbooks/npuops-command.yml, folded into one answer for the group.

Each host answers for its own part (its units, its supervisor); the group is healthy when every part runs and the
first host's endpoint answers, and under Ray when every host's node is alive. A lost worker shows as that host's
part down and as the head naming it among the missing Ray nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.fleet.events import PlaybookEvent
from npuops.fleet.facts import FIX_UNREACHABLE, failure_fix
from npuops.fleet.host_results import HostStatus
from npuops.fleet.inventory import InventoryHost, read_inventory_group
from npuops.fleet.runner import run_playbook
from npuops.instance.ray import describe_ray_state

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


def group_status(hosts: Sequence[InventoryHost], answers: Mapping[str, HostAnswer]) -> dict[str, Any]:
    """One view of the group from every host's `npuops status NAME --json`. Pure."""
    parts: dict[str, Any] = {}
    down: list[str] = []
    endpoint: dict[str, Any] | None = None
    ray: dict[str, Any] | None = None
    for index, host in enumerate(hosts):
        answer = answers.get(host.name)
        if answer is None or answer.answer is None:
            parts[host.name] = {"status": answer.status if answer else "not reached",
                                "message": answer.message if answer else "the host gave no answer",
                                "fix": answer.fix if answer else FIX_UNREACHABLE, "instance": None}
            down.append(host.name)
            continue
        instances = answer.answer.get("instances") or []
        instance = instances[0] if instances and isinstance(instances[0], Mapping) else None
        parts[host.name] = {"status": "ok", "instance": instance}
        if instance is None or not instance.get("healthy"):
            down.append(host.name)
        if index == 0 and instance is not None:
            endpoint = {"host": host.name, "url": instance.get("url"), "state": instance.get("state"),
                        "healthy": bool(instance.get("healthy"))}
            ray = (instance.get("cluster") or {}).get("ray")
    healthy = not down and endpoint is not None and endpoint["healthy"] and (ray is None or bool(ray.get("complete")))
    return {"ok": healthy, "hosts": parts, "down": down, "endpoint": endpoint, "ray": ray}


def render_group_status_text(name: str, group: str, view: Mapping[str, Any]) -> str:
    lines = [f"{name} on group {group}: {'healthy' if view['ok'] else 'NOT healthy'}"]
    for host, part in view["hosts"].items():
        instance = part.get("instance")
        if instance is None:
            lines.append(f"  {host:<20} {part['status']}: {part['message']} (fix: {part['fix']})")
            continue
        unit = instance.get("unit_state") or {}
        role = instance.get("role") or (instance.get("cluster") or {}).get("role") or "engine"
        lines.append(f"  {host:<20} {role:<10} {instance.get('state')}  {instance.get('unit') or ''} "
                     f"{unit.get('active_state', '')}/{unit.get('sub_state', '')}".rstrip())
        diagnosis = instance.get("diagnosis")
        if diagnosis:
            lines.append(f"  {'':<20} [{diagnosis.get('id')}] {diagnosis.get('cause')}; fix: {diagnosis.get('fix')}")
    endpoint = view.get("endpoint")
    if endpoint:
        lines.append(f"endpoint: {endpoint['url']} on {endpoint['host']}: {endpoint['state']}")
    ray = view.get("ray")
    if ray:
        lines.append(f"ray: {describe_ray_state(ray)}")
    return "\n".join(lines)


def status_group(inventory: Path, group: str, name: str, *, artifacts_dir: Path, forks: int,
                 on_event: Callable[[PlaybookEvent], None] | None = None) -> dict[str, Any]:
    hosts = read_inventory_group(inventory, group)
    answers = run_on_hosts(inventory, group, ["status", name, "--json"], ok_rcs=(0, 1), artifacts_dir=artifacts_dir,
                           forks=forks, timeout_s=120, on_event=on_event)
    view = group_status(hosts, answers)
    view["answers"] = {h: a.to_json() for h, a in answers.items()}
    return view


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
