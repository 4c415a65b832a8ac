"""The start gate: `npuops run --preflight NAME`, the unit's ExecStartPre (and the first step of the foreground).

It runs the doctor checks tagged for it (npuops.doctor.model.TAGS): `gate` on every instance, and `gate-npu` too on
NPUs. They are the level-1 checks that matter for this instance (its chips healthy, cool and free, CANN and the stack
present and matching, the environment file right, the host able to hold it), run with the instance's own env file,
devices and memory fraction, and the instance's own checks (checks/launch.py: the engine executable, the model
directory, the port, the Ray cluster), which read its record. A failing check of high or critical severity refuses
the start, with that check's remediation; anything else is reported and let through.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from npuops.doctor.context import CheckContext, DoctorOptions, PeerGroup, PeerHost
from npuops.doctor.model import (
    TAG_GATE,
    TAG_GATE_GROUP,
    TAG_GATE_NPU,
    TAG_INSTANCE,
    Check,
    CheckOutcome,
    Severity,
    Status,
)
from npuops.doctor.registry import checks_tagged, discover_checks
from npuops.doctor.runner import run_checks
from npuops.hardware.probe import Probe
from npuops.instance.record import InstanceRecord
from npuops.instance.state import SupervisorState
from npuops.settings import Settings

BLOCKING_SEVERITIES = (Severity.CRITICAL, Severity.HIGH)
CHIP_HEALTH_CHECK = "chip-health"  # checks/chips.py: what a serving engine's chips are watched with
_AREA_ORDER = ("driver", "chips", "cann", "stack", "environment", "host", "launch")


@dataclass(frozen=True)
class GateReport:
    outcomes: tuple[CheckOutcome, ...]
    duration_s: float

    @property
    def blocking(self) -> list[CheckOutcome]:
        """The checks that refuse the start, most fundamental first (a missing driver before a sick chip)."""
        failed = [o for o in self.outcomes if o.result.status is Status.FAIL and o.severity in BLOCKING_SEVERITIES]
        return sorted(failed, key=lambda o: _AREA_ORDER.index(o.area) if o.area in _AREA_ORDER else len(_AREA_ORDER))

    @property
    def warnings(self) -> list[CheckOutcome]:
        blocking = {o.check_id for o in self.blocking}
        return [o for o in self.outcomes if o.check_id not in blocking
                and o.result.status in (Status.FAIL, Status.WARN, Status.ERROR)]

    @property
    def ok(self) -> bool:
        return not self.blocking

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "duration_s": round(self.duration_s, 3),
                "blocking": [o.check_id for o in self.blocking],
                "checks": [o.to_json() for o in self.outcomes]}


def gate_settings(settings: Settings, record: InstanceRecord) -> Settings:
    """The stack checks look at the interpreter beside the instance's vllm, not at npuops' own."""
    exe = record.vllm_command[0]
    python = Path(exe).parent / "python"
    if os.path.isabs(exe) and python.exists():
        return replace(settings, stack_python=str(python))
    return settings


def gate_tags(record: InstanceRecord) -> tuple[str, ...]:
    """The tags of the checks this instance's start gate runs."""
    # A router touches no chip: the NPU checks are its replicas' gates'.
    tags = (TAG_GATE, TAG_GATE_NPU) if record.target_kind == "npu" and not record.is_router else (TAG_GATE,)
    # A host of a multi-node instance looks at the network to the others before its engine starts: a peer it cannot
    # reach otherwise shows as a TCPStore or HCCL connect timeout minutes later (HCCL_CONNECT_TIMEOUT).
    return (*tags, TAG_GATE_GROUP) if record.cluster is not None else tags


def peer_group(record: InstanceRecord) -> PeerGroup | None:
    """The group's other hosts as the network checks take them (`npuops doctor --peers`), from the membership
    launch wrote into this host's record: their cluster addresses and NPU NIC addresses, this host's interface."""
    cluster = record.cluster
    if cluster is None:
        return None
    own = cluster.nodes[cluster.rank] if 0 <= cluster.rank < len(cluster.nodes) else None
    peers = tuple(PeerHost(n.name, n.address, npu_ips=dict(n.npu_ips)) for i, n in enumerate(cluster.nodes)
                  if i != cluster.rank)
    return PeerGroup(peers, own.ifname or None if own else None, dict(own.npu_ips) if own else {})


def gate_checks(record: InstanceRecord) -> list[type[Check]]:
    """The checks of this instance's start gate: the instance's own first (what is wrong with it is named before
    what is wrong with the node), then the node's, each group in discovery order."""
    selected = checks_tagged(discover_checks(), *gate_tags(record))
    return sorted(selected, key=lambda c: TAG_INSTANCE not in c.tags)


def run_gate(record: InstanceRecord, settings: Settings) -> GateReport:
    started = time.monotonic()
    options = DoctorOptions(
        env_file=record.env_file if record.env_file.exists() else None,
        model_dir=Path(record.model_path),
        devices=record.devices or None,
        gpu_memory_utilization=record.gpu_memory_utilization,
        graph_mode=record.graph_mode,
        instance=record,
        peers=peer_group(record),
    )
    context = CheckContext(Probe(gate_settings(settings, record)), options)
    report = run_checks(gate_checks(record), context)
    return GateReport(report.outcomes, time.monotonic() - started)


def render_gate_text(report: GateReport, name: str) -> str:
    lines = []
    for outcome in report.blocking:
        lines.append(f"refused [{outcome.check_id}] {outcome.result.message}")
        lines.append(f"  fix: {outcome.result.remediation}")
    for outcome in report.warnings:
        lines.append(f"{outcome.result.status.value} [{outcome.check_id}] {outcome.result.message}")
    # What a group host's gate found of its peers goes to the journal too: the first place to look when the group
    # does not form.
    group_checks = {c.id for c in checks_tagged(discover_checks(), TAG_GATE_GROUP)}
    for outcome in report.outcomes:
        if outcome.check_id in group_checks and outcome.result.status is Status.PASS:
            lines.append(f"pass [{outcome.check_id}] {outcome.result.message}")
    passed = sum(1 for o in report.outcomes if o.result.status is Status.PASS)
    skipped = sum(1 for o in report.outcomes if o.result.status is Status.SKIP)
    verdict = "refuses to start" if report.blocking else "lets it start"
    lines.append(f"start gate for {name}: {passed} passed, {skipped} skipped, {len(report.warnings)} warning(s), "
                 f"{len(report.blocking)} blocking: {verdict} ({report.duration_s:.1f} s)")
    return "\n".join(lines)


def refusal_status(report: GateReport, name: str) -> SupervisorState:
    """What the status file says after a refused start, so `npuops status` can name the check and its fix."""
    return SupervisorState.refused(name, [(o.check_id, o.result.message, o.result.remediation or "")
                                          for o in report.blocking])


def chip_watch(record: InstanceRecord, settings: Settings) -> Callable[[], str | None] | None:
    """What the supervisor asks of a serving NPU engine's chips: the start gate's own chip-health check on the
    instance's devices (one `npu-smi info`), its message when a chip the instance runs on is in Alarm or Critical,
    else None (a Warning, or npu-smi not answering, does not degrade a serving engine). None for an instance on no
    chip (a CPU engine, a router)."""
    if record.target_kind != "npu" or record.is_router:
        return None
    health = next(c for c in discover_checks() if c.id == CHIP_HEALTH_CHECK)
    options = DoctorOptions(devices=record.devices or None, instance=record)

    def failing() -> str | None:
        outcome = run_checks([health], CheckContext(Probe(gate_settings(settings, record)), options)).outcomes[0]
        return outcome.result.message if outcome.result.status is Status.FAIL else None
    return failing
