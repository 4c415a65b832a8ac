"""`rollout --surge`: a temporary extra replica of the new revision behind the router while the others switch.

Kubernetes' maxSurge for one node: before any replica leaves, one more starts on chips no instance of the node
holds (on the CPU engine, where the plan binds each replica to its own cores, on the cores of the first replica to
switch: it shares them until that replica drains), is verified like any switched replica and joins the router.
Serving capacity then never drops below the instance's own replica count, and an instance of a single replica
behind a router (`launch --router-policy P`) can change revision without a gap. After the last switch the surge
replica leaves the router, drains and is removed; it is never part of a revision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from npuops.errors import BadInputError
from npuops.instance.control import port_taken, remove_by_name
from npuops.instance.manager import SystemdManager
from npuops.instance.record import InstanceRecord, list_records, record_path
from npuops.launch.instance_files import InstanceFiles, LaunchSpec, render_surge_replica
from npuops.launch.revision_store import with_revision
from npuops.plan.result import Plan
from npuops.plan.rules import Replica

SURGE_SUFFIX = "-surge"
_PORT_TRIES = 200


def surge_name(name: str) -> str:
    return f"{name}{SURGE_SUFFIX}"


def _surge_port(router: InstanceRecord, records: list[InstanceRecord]) -> int:
    """A port after the instance's block (router, replicas, the router's metrics) no instance holds or listens on."""
    used = {r.port for r in records}
    candidate = router.port + len(router.replicas) + 2
    for port in range(candidate, min(candidate + _PORT_TRIES, 65536)):
        if port not in used and not port_taken("127.0.0.1", port):
            return port
    raise BadInputError(f"no free port for a surge replica of {router.name} from {candidate} on",
                        "free a port after the instance's, or roll out without --surge")


def _surge_resources(plan: Plan, name: str, records: list[InstanceRecord], chips: Sequence[int]) -> Replica:
    """The surge replica's chips (or cores): one replica's worth of the node's `chips` no instance holds."""
    first = plan.replicas[0] if plan.replicas else Replica(0, 0, ())
    if not first.devices:
        return replace(first, index=len(plan.replicas))
    held = {d for r in records if r.name != surge_name(name) for d in r.devices}
    free = [d for d in chips if d not in held]
    if len(free) < len(first.devices):
        raise BadInputError(f"--surge needs {len(first.devices)} free chip(s) for a temporary replica of {name}, "
                            f"and this node has {len(free)} ({', '.join(map(str, free)) or 'none'}) not held by "
                            "an instance", "roll out without --surge (a replica at a time while the others "
                            "serve), or stop an instance to free chips")
    return replace(first, index=len(plan.replicas), devices=tuple(free[:len(first.devices)]))


def surge_files(state_dir: Path, plan: Plan, spec: LaunchSpec, router: InstanceRecord, number: int,
                chips: Sequence[int]) -> InstanceFiles:
    """The surge replica of the new revision's plan, on free chips of the node's `chips` and a free port, behind
    `router`."""
    records = list_records(state_dir)
    replica = _surge_resources(plan, router.name, records, chips)
    files = render_surge_replica(plan, spec, replica, name=surge_name(router.name),
                                 port=_surge_port(router, records))
    return with_revision(files, number)


def remove_surge(state_dir: Path, name: str, manager: SystemdManager) -> bool:
    """Stop (its supervisor leaves the router first, then the engine drains) and remove the surge replica of
    `name`, if there is one: also one a killed rollout left serving. True when there was one."""
    if not record_path(state_dir, surge_name(name)).exists():
        return False
    remove_by_name(state_dir, surge_name(name), manager, force=True)
    return True
