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
    return f"{status.name}: {'; '.join(problems)}" if problems else None


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
        problems = [p for s in statuses if (p := _problem(s))]
        if problems:
            return Result.fail("; ".join(problems),
                               "see `npuops status NAME` (and `npuops logs NAME`) on this host; for a multi-node "
                               "instance `npuops status NAME -i INVENTORY --group GROUP` shows every host's part",
                               instances=states)
        stopped = [name for name, state in states.items() if state in ("stopped", "stopping")]
        if stopped:
            return Result.warn(f"stopped: {', '.join(stopped)}",
                               "start them with `systemctl start npuops-NAME` if they should serve", instances=states)
        return Result.passed(f"{len(statuses)} instance(s) running: "
                             + ", ".join(f"{n} {s}" for n, s in states.items()), instances=states)
