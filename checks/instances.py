"""Instances: the vLLM services `npuops launch` put on this node are running and whole.

For a multi-node instance this is where the fleet doctor learns which node is missing: the head's report names
the hosts whose Ray node is gone, and a worker's report says its own Ray unit is down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity

if TYPE_CHECKING:
    from npuops.instance.status import InstanceStatus


def _problem(status: InstanceStatus) -> str | None:
    """What is wrong with one instance's part here, or None. A missing Ray node comes first: it is usually why the
    head's engine failed, and it names the host to look at. Pure."""
    diagnosis = status.diagnosis
    ray = status.cluster.ray if status.cluster is not None else None
    problems = []
    if ray is not None and ray.error:
        problems.append(ray.error)
    elif ray is not None and ray.missing:
        problems.append(f"no live Ray node on {', '.join(ray.missing)}")
    elif ray is not None and ray.short:
        problems.append(f"the Ray nodes of {', '.join(ray.short)} offer fewer resources than the engine needs")
    if status.state == "failed":
        problems.append("failed" + (f": [{diagnosis.id}] {diagnosis.cause}" if diagnosis else ""))
    elif status.state == "unhealthy":
        problems.append("runs but does not answer /health")
    elif status.state.startswith("degraded:"):
        problems.append(status.state)  # a chip it runs on in Alarm or Critical, named by the supervisor
    return f"{status.name}: {'; '.join(problems)}" if problems else None


def _fix(status: InstanceStatus) -> str:
    """The next step for one instance, by name and by how it runs (a unit, or a foreground supervisor). Pure."""
    name = status.name
    if status.state.startswith("degraded:"):
        return (f"`npuops doctor --only chip-health,chip-health-detail` reads the chip's alarm; launch {name} again "
                "on the other chips (`--devices`), or reset or replace the chip")
    stopped = status.state in ("stopped", "stopping")
    if status.manager == "systemd":
        if stopped:
            return f"`systemctl start {status.unit}` if it should serve"
        group = (f"; `npuops status {name} -i INVENTORY --group GROUP` shows every host's part"
                 if status.cluster is not None else "")
        return f"`npuops status {name}` and `npuops logs {name}` say why{group}"
    if stopped:
        return f"launch {name} again (`npuops launch ... --name {name} --foreground`), or `npuops remove {name}`"
    return f"`npuops logs {name}` says why; launch it again, or `npuops remove {name}`"


class InstancesHealthy(Check):
    """The vLLM instances launched on this node are running, and a multi-node instance has all its nodes."""

    id = "instances-healthy"
    area = "service"
    severity = Severity.HIGH
    level = 2

    def run(self, ctx: CheckContext) -> Result:
        from npuops.instance.manager import service_manager
        from npuops.instance.record import list_records
        from npuops.instance.status import instance_status

        settings = ctx.settings
        records = list_records(settings.state_dir)
        if not records:
            return Result.skip(f"no instance launched here ({settings.state_dir} has none)",
                               "nothing to check until `npuops launch` installs one")
        manager = service_manager(settings)
        statuses = [instance_status(r, manager, metrics_interval_s=0) for r in records]
        states = {s.name: s.state for s in statuses}
        failing = [s for s in statuses if _problem(s)]
        if failing:
            return Result.fail("; ".join(str(_problem(s)) for s in failing),
                               "; ".join(f"{s.name}: {_fix(s)}" for s in failing), instances=states)
        stopped = [s for s in statuses if s.state in ("stopped", "stopping")]
        if stopped:
            return Result.warn(f"stopped: {', '.join(s.name for s in stopped)}",
                               "; ".join(f"{s.name}: {_fix(s)}" for s in stopped), instances=states)
        return Result.passed(f"{len(statuses)} instance(s) running: "
                             + ", ".join(f"{n} {s}" for n, s in states.items()), instances=states)
