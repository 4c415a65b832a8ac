"""Network for multi-node serving: the NPU NICs (RoCE ports on the chips) are up, healthy and addressed.

HCCL moves tensors between nodes over these NICs, not over the host's network; a NIC that is down or has no
address shows up as `EI0006 Getting socket times out` or a TCPStore timeout minutes into a launch (ascend-facts
§5, §6 no. 11). Single-node inference never touches them, which is why these checks are level 2 and skip when
`hccn_tool` is absent. 310P cards have no NPU NICs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from npuops.doctor.common import skip_without_npus
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity
from npuops.hardware.hccn import HccnIp, HccnLink, HccnNetHealth, parse_hccn_ip, parse_hccn_link, parse_hccn_net_health
from npuops.hardware.node import Chip
from npuops.hardware.parsing import ParseError

T = TypeVar("T")

# Families whose chips carry no NPU NIC (the 300I Duo and other 310P inference cards talk over PCIe only).
_NO_NIC_FAMILIES = frozenset({"310P"})
_SINGLE_NODE = "nothing to fix for single-node inference"


def _label(chip: Chip) -> str:
    return f"device {chip.device_id} (NPU {chip.smi.npu_id} chip {chip.smi.chip_id})"


@dataclass(frozen=True)
class _NicReadings:
    """What one hccn_tool query gave for each NIC: parsed values, or why a NIC could not be read."""

    values: list[tuple[Chip, Any]]
    unreadable: list[tuple[Chip, str]]


def _query(ctx: CheckContext, query: str, parse: Callable[[str], T]) -> _NicReadings | Result:
    """Run `hccn_tool -i <device> <query> -g` for every NIC the launch uses; a skip Result when there is nothing
    to ask (no NPU, only 310P chips, or no hccn_tool)."""
    skipped = skip_without_npus(ctx)
    if skipped is not None:
        return skipped
    chips = ctx.selected_chips()
    with_nic = [c for c in chips if c.family not in _NO_NIC_FAMILIES]
    if not with_nic:
        families = sorted({c.family for c in chips if c.family})
        return Result.skip(f"{', '.join(families)} chips have no NPU NICs (multi-node HCCL over RoCE needs A2/A3)",
                           f"{_SINGLE_NODE}; multi-node serving needs 910B (A2) or 910C (A3) nodes",
                           chips=[c.smi.name for c in chips])
    tool = ctx.settings.hccn_tool
    values: list[tuple[Chip, Any]] = []
    unreadable: list[tuple[Chip, str]] = []
    for chip in with_nic:
        result = ctx.probe.run(tool, "-i", str(chip.device_id), query, "-g")
        if result.missing:
            # Before any NIC is judged: no hccn_tool means this node was not set up for multi-node serving.
            return Result.skip(f"`{tool}` is not installed: only multi-node serving uses the NPU NICs",
                               f"{_SINGLE_NODE}; for multi-node, install the driver's tools (hccn_tool ships in "
                               "/usr/local/Ascend/driver/tools) or mount that directory into the container")
        if not result.ok:
            said = next((line.strip() for line in result.output.splitlines() if line.strip()), "")
            unreadable.append((chip, f"{result.describe()}" + (f": {said}" if said else "")))
            continue
        try:
            values.append((chip, parse(result.output)))
        except ParseError as exc:
            unreadable.append((chip, str(exc)))
    return _NicReadings(values, unreadable)


def _unreadable_warn(readings: _NicReadings, query: str, evidence: dict[str, Any]) -> Result:
    listing = "; ".join(f"{_label(c)}: {why}" for c, why in readings.unreadable)
    first = readings.unreadable[0][0].device_id
    return Result.warn(f"cannot read `hccn_tool {query} -g` for {listing}",
                       f"run `hccn_tool -i {first} {query} -g` by hand; a NIC hccn_tool cannot query usually means "
                       "the driver's network part is not up (`dmesg | grep -i hccn`), which breaks multi-node HCCL",
                       unreadable={c.device_id: why for c, why in readings.unreadable}, **evidence)


class HccnLinkUp(Check):
    """The NPU NIC of every chip a launch uses has link status UP (`hccn_tool -i N -link -g`)."""

    id = "hccn-link"
    area = "network"
    severity = Severity.HIGH
    level = 2
    requires = ("hccn_tool",)

    def run(self, ctx: CheckContext) -> Result:
        readings = _query(ctx, "-link", parse_hccn_link)
        if isinstance(readings, Result):
            return readings
        links: list[tuple[Chip, HccnLink]] = readings.values
        evidence: dict[str, Any] = {"link": {c.device_id: link.status for c, link in links}}
        down = [(c, link) for c, link in links if not link.up]
        if down:
            listing = ", ".join(f"{_label(c)} {link.status}" for c, link in down)
            ids = " ".join(str(c.device_id) for c, _ in down)
            return Result.fail(f"NPU NIC link not up: {listing}",
                               f"check the cable/optic and the switch port of each NIC (for i in {ids}: "
                               "`hccn_tool -i $i -link_stat -g` shows the flaps, `hccn_tool -i $i -status -g` the "
                               "speed); a multi-node launch over these NICs times out in HCCL (EI0006)", **evidence)
        if readings.unreadable:
            return _unreadable_warn(readings, "-link", evidence)
        return Result.passed(f"{len(links)} NPU NIC(s) link UP", **evidence)


# `-net_health -g` statuses (npuops.hardware.hccn.NET_HEALTH_STATUSES): "Init" means no detection has run yet (no
# detect address set) and "Detect ip set" that one was just set; neither says the path is broken, so they warn.
_NOT_YET_DETECTED = frozenset({"init", "detect ip set"})


class HccnNetHealthy(Check):
    """The NPU NIC of every chip a launch uses reaches its detect address (`hccn_tool -i N -net_health -g`: Success)."""

    id = "hccn-net-health"
    area = "network"
    severity = Severity.HIGH
    level = 2
    requires = ("hccn_tool",)

    def run(self, ctx: CheckContext) -> Result:
        readings = _query(ctx, "-net_health", parse_hccn_net_health)
        if isinstance(readings, Result):
            return readings
        healths: list[tuple[Chip, HccnNetHealth]] = readings.values
        evidence: dict[str, Any] = {"net_health": {c.device_id: h.status for c, h in healths}}
        broken = [(c, h) for c, h in healths if not h.healthy and h.status.lower() not in _NOT_YET_DETECTED]
        pending = [(c, h) for c, h in healths if h.status.lower() in _NOT_YET_DETECTED]
        if broken:
            listing = ", ".join(f"{_label(c)} {h.status!r}" + ("" if h.known else " (a status npuops does not know)")
                                for c, h in broken)
            return Result.fail(f"NPU NIC health check failing: {listing}",
                               "check what each NIC probes (`hccn_tool -i N -netdetect -g`), its address "
                               "(`-ip -g`), gateway (`-gateway -g`) and route (`-route -g`), and that the peer "
                               "answers; "
                               "set addresses with `hccn_tool -i N -ip -s address A netmask M` (kept in "
                               "/etc/hccn.conf)", **evidence)
        if pending:
            listing = ", ".join(f"{_label(c)} {h.status!r}" for c, h in pending)
            ids = [c.device_id for c, _ in pending]
            return Result.warn(f"NPU NIC health not detected yet: {listing}",
                               "give each NIC an address to probe (the gateway, or the same device's NPU IP on a "
                               f"peer node): `hccn_tool -i {ids[0]} -netdetect -s address <ip>` (for each of "
                               f"{', '.join(map(str, ids))}), wait a few seconds, re-run", **evidence)
        if readings.unreadable:
            return _unreadable_warn(readings, "-net_health", evidence)
        return Result.passed(f"{len(healths)} NPU NIC(s) report net health Success", **evidence)


class HccnIpConfigured(Check):
    """The NPU NIC of every chip a launch uses has an IP address, and no two share one (`hccn_tool -i N -ip -g`)."""

    id = "hccn-ip"
    area = "network"
    severity = Severity.HIGH
    level = 2
    requires = ("hccn_tool",)

    def run(self, ctx: CheckContext) -> Result:
        readings = _query(ctx, "-ip", parse_hccn_ip)
        if isinstance(readings, Result):
            return readings
        ips: list[tuple[Chip, HccnIp]] = readings.values
        evidence: dict[str, Any] = {"ip": {c.device_id: (ip.address, ip.netmask) for c, ip in ips}}
        fix = ("set one address per NIC: `hccn_tool -i N -ip -s address A netmask M` (kept in /etc/hccn.conf); "
               "on A2 all NPU NICs of the cluster may share a subnet, each address distinct")
        missing = [c for c, ip in ips if not ip.address]
        by_address: dict[str, list[Chip]] = {}
        for chip, ip in ips:
            if ip.address:
                by_address.setdefault(ip.address, []).append(chip)
        # Redacted addresses ("10.xx.xx.10") are not real ones; only compare addresses that look whole.
        shared = {a: cs for a, cs in by_address.items() if len(cs) > 1 and "x" not in a.lower()}
        problems = []
        if missing:
            problems.append("no IP address on " + ", ".join(_label(c) for c in missing))
        for address, chips in shared.items():
            problems.append(f"{address} is set on " + " and ".join(_label(c) for c in chips))
        if problems:
            return Result.fail("; ".join(problems), fix, **evidence)
        if readings.unreadable:
            return _unreadable_warn(readings, "-ip", evidence)
        return Result.passed(f"{len(ips)} NPU NIC(s) have an address: "
                             + ", ".join(f"{c.device_id}={ip.address}" for c, ip in ips), **evidence)
