"""Network for multi-node serving: the NPU NICs (RoCE ports on the chips) are up, healthy and addressed.

HCCL moves tensors between nodes over these NICs, not over the host's network; a NIC that is down or has no
address shows up as `EI0006 Getting socket times out` or a TCPStore timeout minutes into a launch (vllm-ascend's
multi-node tutorial features/ray.md; vllm-ascend #486). Single-node inference never touches them, which is
why these checks are level 2 and skip when `hccn_tool` is absent. 310P cards have no NPU NICs.

With `--peers` (the other hosts of a serving group; the fleet doctor passes them) two more look between hosts: each
NPU NIC pings the same device's NIC on every peer, and the host interface HCCL and Gloo use reaches every peer's
host address.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from npuops.doctor.common import skip_without_npus
from npuops.doctor.context import CheckContext, PeerGroup, PeerHost
from npuops.doctor.model import TAG_GATE_GROUP, Check, Result, Severity
from npuops.hardware.hccn import (
    PING_FAILURE_MARKERS,
    HccnIp,
    HccnLink,
    HccnLinkStat,
    HccnNetHealth,
    HccnPing,
    parse_hccn_ip,
    parse_hccn_link,
    parse_hccn_link_stat,
    parse_hccn_net_health,
    parse_hccn_ping,
)
from npuops.hardware.host import NetInterface
from npuops.hardware.node import Chip
from npuops.hardware.probe import CommandResult
from npuops.parsing import ParseError

T = TypeVar("T")

_SINGLE_NODE = "nothing to fix for single-node inference"


def _label(chip: Chip) -> str:
    return f"device {chip.device_id} (NPU {chip.smi.npu_id} chip {chip.smi.chip_id})"


@dataclass(frozen=True)
class _NicReadings:
    """What one hccn_tool query gave for each NIC: parsed values, or why a NIC could not be read."""

    values: list[tuple[Chip, Any]]
    unreadable: list[tuple[Chip, str]]


def _nic_chips(ctx: CheckContext) -> list[Chip] | Result:
    """The chips with an NPU NIC that the launch uses, or a skip Result when there are none (no NPU, only 310P)."""
    skipped = skip_without_npus(ctx)
    if skipped is not None:
        return skipped
    chips = ctx.selected_chips()
    with_nic = [c for c in chips if c.has_nic]
    if not with_nic:
        families = sorted({c.family for c in chips if c.family})
        return Result.skip(f"{', '.join(families)} chips have no NPU NICs (multi-node HCCL over RoCE needs A2/A3)",
                           f"{_SINGLE_NODE}; multi-node serving needs 910B (A2) or 910C (A3) nodes",
                           chips=[c.smi.name for c in chips], families=families)
    return with_nic


def _no_hccn_tool(tool: str) -> Result:
    # Before any NIC is judged: no hccn_tool means this node was not set up for multi-node serving.
    return Result.skip(f"`{tool}` is not installed: only multi-node serving uses the NPU NICs",
                       f"{_SINGLE_NODE}; for multi-node, install the driver's tools (hccn_tool ships in "
                       "/usr/local/Ascend/driver/tools) or mount that directory into the container", tool=tool)


def _first_line(result: CommandResult) -> str:
    said = next((line.strip() for line in result.output.splitlines() if line.strip()), "")
    return f"{result.describe()}" + (f": {said}" if said else "")


def _query(ctx: CheckContext, query: str, parse: Callable[[str], T]) -> _NicReadings | Result:
    """Run `hccn_tool -i <device> <query> -g` for every NIC the launch uses; a skip Result when there is nothing
    to ask (no NPU, only 310P chips, or no hccn_tool)."""
    with_nic = _nic_chips(ctx)
    if isinstance(with_nic, Result):
        return with_nic
    tool = ctx.settings.hccn_tool
    values: list[tuple[Chip, Any]] = []
    unreadable: list[tuple[Chip, str]] = []
    for chip in with_nic:
        result = ctx.probe.run(tool, "-i", str(chip.device_id), query, "-g")
        if result.missing:
            return _no_hccn_tool(tool)
        if not result.ok:
            unreadable.append((chip, _first_line(result)))
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


@dataclass(frozen=True)
class LinkFlaps:
    """What one NIC's `hccn_tool -i N -link_stat -g` says about its recent past, by the NIC's own clock."""

    downs: int | None  # LINK DOWN records within the window; None when the output gives no time to count from
    last_change: str | None  # the newest record as printed ("Fri Sep  1 06:34:43 2023 LINK DOWN")
    link_up_count: int | None

    def to_evidence(self) -> dict[str, Any]:
        return {"downs_in_window": self.downs, "last_change": self.last_change, "link_up_count": self.link_up_count}


def recent_link_downs(stat: HccnLinkStat, window_s: float) -> LinkFlaps:
    """The LINK DOWN records of the `window_s` seconds before the output's `current time`. Pure.

    Both times are the NIC's clock, so a host clock that is off does not matter; without a readable current time
    the records cannot be placed, and `downs` is None.
    """
    newest = stat.changes[0] if stat.changes else None
    last = f"{newest.time} {newest.event}" if newest is not None else None
    now = stat.current
    if now is None:
        return LinkFlaps(None, last, stat.link_up_count)
    since = now - datetime.timedelta(seconds=window_s)
    downs = sum(1 for change in stat.changes if not change.up and change.at is not None and change.at >= since)
    return LinkFlaps(downs, last, stat.link_up_count)


def _window(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


class HccnLinkUp(Check):
    """The NPU NIC of every chip a launch uses has link UP and has not been flapping (`hccn_tool -link/-link_stat`)."""

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
        window = float(ctx.threshold("hccn_link_flap_window_s"))
        warn_downs = int(ctx.threshold("hccn_link_flap_warn_downs"))
        flaps = self._flaps(ctx, window)
        evidence: dict[str, Any] = {"link": {c.device_id: link.status for c, link in links},
                                    "flap_window_s": window, "flap_warn_downs": warn_downs, **flaps.evidence}
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
        flapping = [(c, f) for c, f in flaps.values if f.downs is not None and f.downs >= warn_downs]
        if flapping:
            listing = "; ".join(f"{_label(c)} went down {f.downs} times in the last {_window(window)} "
                                f"(last change: {f.last_change})" for c, f in flapping)
            first = flapping[0][0].device_id
            return Result.warn(
                f"NPU NIC link flapping: {listing}",
                "have the optic/cable and the switch port of each NIC checked (the switch log shows the same "
                f"flaps; `hccn_tool -i {first} -link_stat -g` lists them): HCCL over a link that drops fails in "
                "long runs with ERROR CQE (EI0013, RoCE retransmission timeout) or a notify wait timeout (EI0002); "
                "larger HCCL_RDMA_TIMEOUT / HCCL_RDMA_RETRY_CNT ride out short drops", **evidence)
        return Result.passed(f"{len(links)} NPU NIC(s) link UP" + flaps.summary(window, warn_downs), **evidence)

    @staticmethod
    def _flaps(ctx: CheckContext, window: float) -> _FlapReadings:
        """`-link_stat -g` of every NIC: supporting evidence, so a NIC that cannot answer it is noted, not judged."""
        readings = _query(ctx, "-link_stat", parse_hccn_link_stat)
        if isinstance(readings, Result):
            return _FlapReadings([], {"link_stat_skipped": readings.message})
        stats: list[tuple[Chip, HccnLinkStat]] = readings.values
        values = [(chip, recent_link_downs(stat, window)) for chip, stat in stats]
        evidence: dict[str, Any] = {"link_stat": {c.device_id: f.to_evidence() for c, f in values}}
        if readings.unreadable:
            evidence["link_stat_unreadable"] = {c.device_id: why for c, why in readings.unreadable}
        return _FlapReadings(values, evidence)


@dataclass(frozen=True)
class _FlapReadings:
    values: list[tuple[Chip, LinkFlaps]]
    evidence: dict[str, Any]

    def summary(self, window: float, warn_downs: int) -> str:
        counted = [(c, f.downs) for c, f in self.values if f.downs is not None]
        if not counted:
            return ""
        dropped = [f"device {c.device_id} {downs}x" for c, downs in counted if downs]
        if not dropped:
            return f", none went down in the last {_window(window)}"
        return f"; went down in the last {_window(window)} (under {warn_downs} times each): {', '.join(dropped)}"


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
        planned = ctx.options.peers.npu_ips if ctx.options.peers is not None else {}
        if planned:
            # The inventory's addresses are the ones the peers were told and that provisioning sets: one source.
            evidence["inventory"] = dict(planned)
            wrong = [f"{_label(c)} has {ip.address}, the inventory gives {planned[c.device_id]}"
                     for c, ip in ips if ip.address and c.device_id in planned and ip.address != planned[c.device_id]]
            if wrong:
                problems.extend(wrong)
                fix = ("set the inventory's addresses on the NPU ports: `npuops provision -i INVENTORY --tags "
                       "npu-network` (or correct the inventory); the peers reach this host at the inventory's")
        if problems:
            return Result.fail("; ".join(problems), fix, **evidence)
        if readings.unreadable:
            return _unreadable_warn(readings, "-ip", evidence)
        return Result.passed(f"{len(ips)} NPU NIC(s) have an address: "
                             + ", ".join(f"{c.device_id}={ip.address}" for c, ip in ips), **evidence)


# --------------------------------------------------------------------------------------------------------------------
# Between hosts: `--peers` names the other hosts of the serving group (the fleet doctor passes them).
# --------------------------------------------------------------------------------------------------------------------

_NO_PEERS_FIX = ("for a multi-node launch, run `npuops doctor --level 2 --peers '<JSON>'` with the other hosts of the "
                 "serving group (the fleet doctor does this on every host); " + _SINGLE_NODE)


def _no_peers(group: PeerGroup | None) -> Result | None:
    if group is None:
        return Result.skip("no --peers given: the network between the hosts of a serving group needs their addresses",
                           _NO_PEERS_FIX, peers=None)
    if not group.peers:
        return Result.skip("--peers lists no other host", _NO_PEERS_FIX, peers=[])
    return None


@dataclass(frozen=True)
class PeerPing:
    """How one local NIC did against the same device's NIC on one peer."""

    chip: Chip
    peer: PeerHost
    address: str | None  # the peer's NIC address; None when the peer gave none for this device
    verdict: str  # "reachable", "lossy", "unreachable", "unreadable", "no-peer-ip"
    detail: str
    ping: HccnPing | None = None

    def label(self) -> str:
        return f"{self.peer.name} device {self.chip.device_id}" + (f" ({self.address})" if self.address else "")

    def to_evidence(self) -> dict[str, Any]:
        return {"peer": self.peer.name, "device": self.chip.device_id, "address": self.address,
                "verdict": self.verdict, "detail": self.detail,
                "transmitted": self.ping.transmitted if self.ping else None,
                "received": self.ping.received if self.ping else None}


def judge_ping(result: CommandResult) -> tuple[str, str, HccnPing | None]:
    """(verdict, detail, parsed) for the result of one `hccn_tool -i N -ping -g address A`. Pure.

    The summary line decides when it parses; otherwise a failed run whose output carries a failure hccn_tool itself
    recognises ("recv time out seq", ...) is unreachable, and anything else could not be read.
    """
    if result.error is not None:
        return "unreadable", result.describe(), None
    try:
        ping = parse_hccn_ping(result.output)
    except ParseError as exc:
        marker = next((m for m in PING_FAILURE_MARKERS if m.lower() in result.output.lower()), None)
        if result.returncode != 0 and marker is not None:
            return "unreachable", f"`{marker}` (exit {result.returncode})", None
        return "unreadable", (_first_line(result) if result.returncode != 0 else str(exc)), None
    counts = f"{ping.received}/{ping.transmitted} replies, {ping.loss_percent:g}% loss"
    if not ping.reachable:
        return "unreachable", counts, ping
    if not ping.lossless:
        return "lossy", counts, ping
    return "reachable", counts, ping


class NpuPeerPing(Check):
    """Every NPU NIC a launch uses reaches the same device's NIC on each peer host (`hccn_tool -i N -ping -g`)."""

    id = "npu-peer-ping"
    area = "network"
    severity = Severity.HIGH
    level = 2
    tags = (TAG_GATE_GROUP,)
    requires = ("hccn_tool",)

    def run(self, ctx: CheckContext) -> Result:
        group = ctx.options.peers
        skipped = _no_peers(group)
        if skipped is not None:
            return skipped
        assert group is not None
        with_nic = _nic_chips(ctx)
        if isinstance(with_nic, Result):
            return with_nic
        tool = ctx.settings.hccn_tool
        pairs: list[PeerPing] = []
        # One ping at a time: vendor docs warn that hccn_tool answers "hccn_tool is busy" to concurrent callers; an
        # unreachable pair costs only the seconds its three probes wait.
        for chip in with_nic:
            for peer in group.peers:
                address = peer.npu_ips.get(chip.device_id)
                if address is None:
                    pairs.append(PeerPing(chip, peer, None, "no-peer-ip",
                                          f"{peer.name} gave no NPU NIC address for device {chip.device_id}"))
                    continue
                result = ctx.probe.run(tool, "-i", str(chip.device_id), "-ping", "-g", "address", address)
                if result.missing:
                    return _no_hccn_tool(tool)
                verdict, detail, ping = judge_ping(result)
                pairs.append(PeerPing(chip, peer, address, verdict, detail, ping))
        return self._verdict(pairs)

    @staticmethod
    def _verdict(pairs: list[PeerPing]) -> Result:
        evidence: dict[str, Any] = {"pairs": [p.to_evidence() for p in pairs]}
        by: dict[str, list[PeerPing]] = {}
        for pair in pairs:
            by.setdefault(pair.verdict, []).append(pair)

        def listing(verdict: str) -> str:
            return "; ".join(f"{p.label()}: {p.detail}" for p in by.get(verdict, []))

        untested = by.get("no-peer-ip", [])
        untested_note = ("; not tested, no NPU NIC address given: "
                         + ", ".join(f"{p.peer.name} device {p.chip.device_id}" for p in untested)) if untested else ""
        ip_fix = ("give each peer's \"npu_ips\" by device id (its `npuops node --json` chips[].nic_ip, or "
                  "`hccn_tool -i N -ip -g` on it); a peer chip without an address cannot join HCCL either")
        if len(untested) == len(pairs):
            return Result.skip(f"no peer gave an NPU NIC address for the devices this launch uses{untested_note}",
                               ip_fix, **evidence)
        if "unreachable" in by:
            devices = sorted({p.chip.device_id for p in by["unreachable"]})
            first = by["unreachable"][0]
            return Result.fail(
                f"NPU NIC(s) cannot reach the same device on a peer: {listing('unreachable')}"
                + (f"; with loss: {listing('lossy')}" if "lossy" in by else "") + untested_note,
                f"for each pair, on both hosts: the cable/optic and switch port (`hccn_tool -i {first.chip.device_id} "
                f"-link -g`), the addresses (`hccn_tool -i {first.chip.device_id} -ip -g` must show what the peers "
                "were given), and when the NICs are on different subnets the route and gateway (`hccn_tool -i N "
                "-route -g`, `-gateway -g`); addresses are kept in /etc/hccn.conf. A multi-node launch over these "
                f"NICs (devices {', '.join(map(str, devices))}) hangs in HCCL with EI0006", **evidence)
        if "lossy" in by or "unreadable" in by:
            problems = []
            if "lossy" in by:
                problems.append(f"packets lost: {listing('lossy')}")
            if "unreadable" in by:
                problems.append(f"could not ping: {listing('unreadable')}")
            return Result.warn("; ".join(problems) + untested_note,
                               "lost probes point at the link or the switch port (`hccn_tool -i N -link_stat -g` "
                               "shows link flaps, `hccn_tool -i N -status -g` the speed); a ping npuops could not "
                               "run: try `hccn_tool -i N -ping -g address <peer NIC>` by hand", **evidence)
        if untested:
            return Result.warn(f"{len(by['reachable'])} NPU NIC pair(s) reach each other{untested_note}", ip_fix,
                               **evidence)
        return Result.passed(f"{len(pairs)} NPU NIC pair(s) reach each other with no loss: "
                             + ", ".join(p.label() for p in pairs), **evidence)


# A peer that has not answered a TCP handshake in this time is not going to answer Gloo's or HCCL's either; a host
# that is up answers at once, with a connection or a reset.
PEER_CONNECT_TIMEOUT_S = 2.0

_UNREACHABLE_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN})
_ANSWERED_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET})


@dataclass(frozen=True)
class TcpReach:
    """What a TCP connect to a peer's address said."""

    outcome: str  # "connected", "refused" (the host answered with a reset), "timeout", "unreachable",
    #               "local-address" (the source address cannot be used here), "error"
    detail: str
    local_address: str | None = None  # the source address the kernel used

    @property
    def reachable(self) -> bool:
        """The host answered: a connection, or a reset from a closed port."""
        return self.outcome in ("connected", "refused")


def classify_connect_error(exc: OSError) -> tuple[str, str]:
    """(outcome, detail) for an exception from connect(). Pure."""
    if isinstance(exc, socket.gaierror):
        return "error", f"cannot resolve the address: {exc.strerror or exc}"
    if isinstance(exc, TimeoutError) or exc.errno == errno.ETIMEDOUT:
        return "timeout", "no answer (timed out)"
    reason = exc.strerror or str(exc)
    if exc.errno in _ANSWERED_ERRNOS:
        return "refused", f"the host answered ({reason.lower()}): up, nothing listens on the port"
    if exc.errno in _UNREACHABLE_ERRNOS:
        return "unreachable", reason.lower()
    return "error", reason


def tcp_reach(source: str | None, address: str, port: int, timeout: float) -> TcpReach:
    """Connect from `source` (an address of this host; None lets the route choose) to address:port. Never raises."""
    family = socket.AF_INET if source else socket.AF_UNSPEC
    try:
        infos = socket.getaddrinfo(address, port, family, socket.SOCK_STREAM)
    except OSError as exc:
        return TcpReach(*classify_connect_error(exc))
    sock_family, sock_type, proto, _, sockaddr = infos[0]
    try:
        sock = socket.socket(sock_family, sock_type, proto)
    except OSError as exc:
        return TcpReach("error", f"cannot open a socket: {exc.strerror or exc}")
    with sock:
        sock.settimeout(timeout)
        if source:
            try:
                sock.bind((source, 0))
            except OSError as exc:
                return TcpReach("local-address", f"cannot send from {source}: {(exc.strerror or str(exc)).lower()}")
        try:
            sock.connect(sockaddr)
        except OSError as exc:
            outcome, detail = classify_connect_error(exc)
            if outcome == "timeout":
                detail = f"no answer in {timeout:g} s"
            return TcpReach(outcome, detail, source)
        return TcpReach("connected", "connected", str(sock.getsockname()[0]))


def _source_interface(group: PeerGroup, interfaces: tuple[NetInterface, ...]) -> tuple[str | None, str] | Result:
    """(source address, how to name it) for the group's interface, or a failing Result when it cannot be used."""
    if group.ifname is None:
        return None, "the interface the route picks"
    have = ", ".join(f"{i.name} {' '.join(i.ipv4) or '(no IPv4)'}" for i in interfaces) or "none"
    fix = (f"name the interface GLOO_SOCKET_IFNAME/HCCL_SOCKET_IFNAME use on this host in --peers' \"ifname\" "
           f"(this host has: {have}); `ip -br addr` lists them")
    interface = next((i for i in interfaces if i.name == group.ifname), None)
    if interface is None:
        return Result.fail(f"no interface {group.ifname!r} on this host", fix, ifname=group.ifname,
                           interface_state="missing")
    if not interface.up:
        return Result.fail(f"interface {interface.name} is down", f"bring it up (`ip link set {interface.name} up`) "
                           "or " + fix, ifname=interface.name, interface_state="down")
    if not interface.ipv4:
        return Result.fail(f"interface {interface.name} has no IPv4 address", fix, ifname=interface.name,
                           interface_state="no-ipv4")
    source = interface.ipv4[0].split("/")[0]
    return source, f"{interface.name} ({source})"


class HostPeerReach(Check):
    """Each peer host answers on its address from the interface HCCL and Gloo use (a TCP connect to its port)."""

    id = "host-peer-reach"
    area = "network"
    severity = Severity.HIGH
    level = 2
    tags = (TAG_GATE_GROUP,)

    # The connect, replaceable in tests: (source or None, address, port, timeout) -> TcpReach.
    connect: ClassVar[Callable[[str | None, str, int, float], TcpReach]] = staticmethod(tcp_reach)

    def run(self, ctx: CheckContext) -> Result:
        group = ctx.options.peers
        skipped = _no_peers(group)
        if skipped is not None:
            return skipped
        assert group is not None
        source = _source_interface(group, ctx.node.host.interfaces if group.ifname else ())
        if isinstance(source, Result):
            return source
        address, via = source
        connect = type(self).connect
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(group.peers))) as pool:
            futures = [pool.submit(connect, address, p.address, p.port, PEER_CONNECT_TIMEOUT_S) for p in group.peers]
            reaches = [f.result() for f in futures]
        evidence: dict[str, Any] = {
            "ifname": group.ifname, "source": address,
            "peers": {p.name: {"address": p.address, "port": p.port, "outcome": r.outcome, "detail": r.detail,
                               "local_address": r.local_address} for p, r in zip(group.peers, reaches, strict=True)},
        }
        bad = [(p, r) for p, r in zip(group.peers, reaches, strict=True) if not r.reachable]
        if bad:
            listing = "; ".join(f"{p.name} {p.address}:{p.port}: {r.detail}" for p, r in bad)
            first = bad[0][0]
            route = f"ip route get {first.address}" + (f" from {address}" if address else "")
            return Result.fail(
                f"peer host(s) not reachable from {via}: {listing}",
                f"check the route and firewall between the hosts (`{route}`, then a ping), that the peer is up, and "
                "that GLOO_SOCKET_IFNAME / HCCL_SOCKET_IFNAME / HCCL_IF_IP name an interface on the network the peers "
                "are on: Gloo, HCCL's bootstrap and Ray all connect over it, and a wrong one shows up as TCPStore or "
                "EI0006 socket timeouts", **evidence)
        answered = ", ".join(f"{p.name} ({'port closed, host up' if r.outcome == 'refused' else 'connected'})"
                             for p, r in zip(group.peers, reaches, strict=True))
        return Result.passed(f"{len(reaches)} peer host(s) answer from {via}: {answered}", **evidence)
