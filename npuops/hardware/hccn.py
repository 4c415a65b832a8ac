"""Pure parsers of ``hccn_tool -i <dev> ... -g`` outputs (the NPU RoCE NIC tool).

One parser per query the doctor asks:

=====================================  ===========================  ===================
command                                parser                       result
=====================================  ===========================  ===================
``hccn_tool -i N -link -g``            :func:`parse_hccn_link`        :class:`HccnLink`
``hccn_tool -i N -net_health -g``      :func:`parse_hccn_net_health`  :class:`HccnNetHealth`
``hccn_tool -i N -ip -g``              :func:`parse_hccn_ip`          :class:`HccnIp`
``hccn_tool -i N -netdetect -g``       :func:`parse_hccn_netdetect`   :class:`HccnNetdetect`
``hccn_tool -i N -gateway -g``         :func:`parse_hccn_gateway`     :class:`HccnGateway`
``hccn_tool -i N -link_stat -g``       :func:`parse_hccn_link_stat`   :class:`HccnLinkStat`
``hccn_tool -i N -ping -g address A``  :func:`parse_hccn_ping`        :class:`HccnPing`
=====================================  ===========================  ===================

Text in, frozen dataclass out; the only exception raised is :class:`npuops.parsing.ParseError`.
What the set commands print and the errors the getters print on stderr are constants here too (:data:`SET_OK`,
:data:`NOT_PRESET_MESSAGES`), from the driver's own source.
Values published redacted (``10.xx.xx.10``) are kept as strings. Lines the parser does not know are kept in each
result's ``raw`` so nothing is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from npuops.parsing import Pairs, ParseError, content_lines, first_value, is_elision, parse_int, split_pair

__all__ = [
    "NET_HEALTH_STATUSES",
    "NOT_PRESET_MESSAGES",
    "NO_NIC_FAMILIES",
    "PING_FAILURE_MARKERS",
    "SET_OK",
    "HccnGateway",
    "HccnIp",
    "HccnLink",
    "HccnLinkChange",
    "HccnLinkStat",
    "HccnNetHealth",
    "HccnNetdetect",
    "HccnPing",
    "HccnPingReply",
    "parse_hccn_gateway",
    "parse_hccn_ip",
    "parse_hccn_link",
    "parse_hccn_link_stat",
    "parse_hccn_net_health",
    "parse_hccn_netdetect",
    "parse_hccn_ping",
]

# The statuses ``-net_health -g`` prints after "net health status: ", as listed (with their numeric codes
# 0..8) in the comment of a public health-check script: 0 Success, 1 Socket fail, 2 Receive timeout,
# 3 Unreachable, 4 Time exceeded, 5 Fault, 6 Init, 7 Thread error, 8 Detect ip set; anything else is "Unknown".
# Only "Success" means the NPU can reach its detect IP.
NET_HEALTH_STATUSES = (
    "Success",
    "Socket fail",
    "Receive timeout",
    "Unreachable",
    "Time exceeded",
    "Fault",
    "Init",
    "Thread error",
    "Detect ip set",
    # An older driver (910A, firmware 7.1) prints "Socket failed" for status 1 (tests/fixtures/ascend/INDEX.md).
    "Socket failed",
)

# What every hccn_tool command that is not a query prints on success (the driver's record_result_success_to_log,
# hicann/driver src/custom/network/hccn/ascend910B/hccn_tool/cmd.c; captured in hccn_tool-tls_set_910b3_1.txt).
SET_OK = "Cmd executed successfully!"

# What `-ip -g` and `-gateway -g` print on stderr (non-zero exit) for a port nothing was set on yet (the same
# file's g_uda_dsmi_err_list): not a failure to read, an empty value.
NOT_PRESET_MESSAGES = {
    "-ip": "Get ipconf failed, because no ip was preset there!",
    "-gateway": "Get gateway failed, because no gateway was preset there!",
}

# Chip families whose chips carry no NPU NIC: the 300I Duo and other 310P inference cards talk over PCIe only, and
# the 310B is an SoC on a developer board (Atlas 200I A2) with the board's own Ethernet, so hccn_tool has nothing to
# ask them.
NO_NIC_FAMILIES = frozenset({"310P", "310B"})


# ----------------------------------------------------------------------------------------------------------------
# -link -g / -net_health -g / -ip -g : "key: value" lines
# ----------------------------------------------------------------------------------------------------------------


def _simple_pairs(text: str, what: str) -> Pairs:
    pairs: list[tuple[str, str]] = []
    for line_no, line in content_lines(text, what):
        pair = split_pair(line)
        if pair is None:
            raise ParseError(what, "expected a 'key: value' line", line_no, line)
        pairs.append(pair)
    return tuple(pairs)


@dataclass(frozen=True)
class HccnLink:
    """``link status: UP``."""

    status: str  # as printed: "UP", "DOWN"
    up: bool
    raw: Pairs


def parse_hccn_link(text: str) -> HccnLink:
    what = "hccn_tool -link -g"
    pairs = _simple_pairs(text, what)
    status = first_value(pairs, "link status")
    if not status:
        raise ParseError(what, "no 'link status:' line")
    return HccnLink(status=status, up=status.upper() == "UP", raw=pairs)


@dataclass(frozen=True)
class HccnNetHealth:
    """``net health status: Init`` (see :data:`NET_HEALTH_STATUSES`)."""

    status: str  # as printed: "Success", "Init", "Socket fail", "Receive timeout", ...
    healthy: bool  # only "Success"
    known: bool  # the status is one of NET_HEALTH_STATUSES
    raw: Pairs


def parse_hccn_net_health(text: str) -> HccnNetHealth:
    what = "hccn_tool -net_health -g"
    pairs = _simple_pairs(text, what)
    status = first_value(pairs, "net health status")
    if not status:
        raise ParseError(what, "no 'net health status:' line")
    known = status.lower() in {s.lower() for s in NET_HEALTH_STATUSES}
    return HccnNetHealth(status=status, healthy=status.lower() == "success", known=known, raw=pairs)


@dataclass(frozen=True)
class HccnIp:
    """``ipaddr:10.20.11.24`` / ``netmask:255.255.255.0`` (kept verbatim, so redacted ``10.xx.xx.10`` survives)."""

    address: str | None
    netmask: str | None
    raw: Pairs


def parse_hccn_ip(text: str) -> HccnIp:
    what = "hccn_tool -ip -g"
    pairs = _simple_pairs(text, what)
    address = first_value(pairs, "ipaddr")
    netmask = first_value(pairs, "netmask")
    if address is None and netmask is None:
        raise ParseError(what, "no 'ipaddr:' or 'netmask:' line")
    return HccnIp(address=address or None, netmask=netmask or None, raw=pairs)


_IPV4_RE = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
# `-netdetect -g` prints "netdetect address: A" in the captures and "netdetect addr: A" in today's driver source
# (tool_ops.c tool_get_netdetect); an address never set reads 0.0.0.0 there (the stored address is 0).
_NETDETECT_RE = re.compile(r"netdetect\s+addr(?:ess)?\s*:\s*(?P<address>\S+)", re.IGNORECASE)
# "default gateway:11.12.165.1, Iface:eth0" (tool_ops_ext.c: "default gateway:%s, Iface:eth%d").
_GATEWAY_RE = re.compile(
    r"default\s+gateway\s*:\s*(?P<address>[^,\s]+)\s*(?:,\s*Iface\s*:\s*(?P<iface>\S+))?", re.IGNORECASE)


def _unset_ipv4(address: str) -> str | None:
    return None if address == "0.0.0.0" else address  # noqa: S104 (a value read, never bound to)


def _one_address(text: str, what: str, pattern: re.Pattern[str], shape: str) -> tuple[str | None, re.Match[str]]:
    """The one line of a one-device query, matched by `pattern` (group "address", an IPv4 address; 0.0.0.0 is
    None). Several lines are refused: a shell loop over devices printed them, and which is which is lost."""
    lines = content_lines(text, what)
    if len(lines) > 1:
        raise ParseError(what, "more than one line (one command per device, please)", *lines[1])
    if not lines:
        raise ParseError(what, f"no {shape!r} line")
    line_no, line = lines[0]
    match = pattern.fullmatch(line)
    if match is None:
        raise ParseError(what, f"expected {shape!r}", line_no, line)
    address = match.group("address")
    if not _IPV4_RE.fullmatch(address):
        raise ParseError(what, f"{address!r} is not an IPv4 address", line_no, line)
    return _unset_ipv4(address), match


@dataclass(frozen=True)
class HccnNetdetect:
    """``netdetect address: 11.12.165.1``: the address the NIC probes for ``-net_health`` (None: never set)."""

    address: str | None


def parse_hccn_netdetect(text: str) -> HccnNetdetect:
    what = "hccn_tool -netdetect -g"
    return HccnNetdetect(_one_address(text, what, _NETDETECT_RE, "netdetect address: <ip>")[0])


@dataclass(frozen=True)
class HccnGateway:
    """``default gateway:11.12.165.1, Iface:eth0``."""

    address: str | None
    interface: str | None  # "eth0": the NPU port as the NIC names it


def parse_hccn_gateway(text: str) -> HccnGateway:
    what = "hccn_tool -gateway -g"
    address, match = _one_address(text, what, _GATEWAY_RE, "default gateway:<ip>, Iface:eth<N>")
    return HccnGateway(address, match.group("iface"))


# ----------------------------------------------------------------------------------------------------------------
# -link_stat -g
# ----------------------------------------------------------------------------------------------------------------

_DEVICE_PREFIX_RE = re.compile(r"\[\s*(?:device|devid)\s+([0-9]{1,9})\s*\](.*)", re.IGNORECASE)
_LINK_EVENT_RE = re.compile(r"(?P<time>.*?\S)\s+(?P<event>LINK\s+(?:UP|DOWN))", re.IGNORECASE)


def _strip_device_prefix(line: str, what: str, line_no: int, seen: list[int]) -> str:
    """Remove a ``[device 0]`` / ``[devid 3]`` prefix, checking that all lines name the same device."""
    match = _DEVICE_PREFIX_RE.fullmatch(line)
    if match is None:
        return line
    device = int(match.group(1))
    if seen and seen[0] != device:
        raise ParseError(what, f"lines from more than one device ({seen[0]} and {device})", line_no, line)
    if not seen:
        seen.append(device)
    return match.group(2).strip()


# hccn_tool prints times as C's asctime() does ("Tue Jun  6 16:32:12 2023", by the NIC's clock, no time zone).
# Read with a table rather than strptime, whose %a/%b follow the locale of the process reading them.
_ASCTIME_RE = re.compile(
    r"(?:[A-Za-z]{3}\s+)?(?P<month>[A-Za-z]{3})\s+(?P<day>[0-9]{1,2})\s+"
    r"(?P<hour>[0-9]{1,2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})\s+(?P<year>[0-9]{4})"
)
_MONTHS = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}


def _asctime(text: str | None) -> datetime | None:
    """``Tue Jun  6 16:32:12 2023`` as a naive datetime; None when the text is not such a time."""
    match = _ASCTIME_RE.fullmatch(text.strip()) if text else None
    month = _MONTHS.get(match.group("month").lower()) if match else None
    if match is None or month is None:
        return None
    try:
        return datetime(int(match.group("year")), month, int(match.group("day")), int(match.group("hour")),
                        int(match.group("minute")), int(match.group("second")))
    except ValueError:  # "Feb 30", hour 25: shaped like a time, but none
        return None


@dataclass(frozen=True)
class HccnLinkChange:
    time: str  # as printed, e.g. "Tue Jun  6 16:32:12 2023"
    event: str  # "LINK UP" / "LINK DOWN"
    up: bool

    @property
    def at(self) -> datetime | None:
        """``time`` by the NIC's clock, or None when it is not an asctime-style time."""
        return _asctime(self.time)


@dataclass(frozen=True)
class HccnLinkStat:
    """``[device 0]current time : ...`` / ``link up count : 2`` / ``link change records :`` + one line per change
    (newer drivers also print ``link down count``, kept in ``raw``)."""

    device_id: int | None
    current_time: str | None
    link_up_count: int | None
    changes: tuple[HccnLinkChange, ...]  # newest first, as printed
    raw: Pairs

    @property
    def current(self) -> datetime | None:
        """``current time`` by the NIC's clock (the clock the change records are in), when it parses."""
        return _asctime(self.current_time)

    @property
    def link_down_count(self) -> int:
        """LINK DOWN events among the printed change records."""
        return sum(1 for change in self.changes if not change.up)


def parse_hccn_link_stat(text: str) -> HccnLinkStat:
    what = "hccn_tool -link_stat -g"
    seen: list[int] = []
    pairs: list[tuple[str, str]] = []
    changes: list[HccnLinkChange] = []
    for line_no, line in content_lines(text, what):
        body = _strip_device_prefix(line, what, line_no, seen)
        if not body or is_elision(body):
            continue
        event = _LINK_EVENT_RE.fullmatch(body)
        if event is not None:
            label = " ".join(event.group("event").upper().split())
            changes.append(HccnLinkChange(time=event.group("time"), event=label, up=label.endswith("UP")))
            continue
        pair = split_pair(body)
        if pair is None:
            raise ParseError(what, "expected 'key : value' or '<time>  LINK UP|DOWN'", line_no, line)
        pairs.append(pair)
    raw = tuple(pairs)
    current_time = first_value(raw, "current time")
    up_count = first_value(raw, "link up count")
    if current_time is None and up_count is None and not changes:
        raise ParseError(what, "no 'current time', 'link up count' or link change records")
    return HccnLinkStat(
        device_id=seen[0] if seen else None,
        current_time=current_time or None,
        link_up_count=parse_int(up_count),
        changes=tuple(changes),
        raw=raw,
    )


# ----------------------------------------------------------------------------------------------------------------
# -ping -g address A
# ----------------------------------------------------------------------------------------------------------------

# What the NIC's ping prints when a probe fails. hccn_tool itself turns an output containing any of these into a
# non-zero exit (its dsmi_ping_fun), and vendor docs name "recv time out seq" as the sign of two NICs that cannot
# reach each other.
PING_FAILURE_MARKERS = ("recv time out seq", "Destination Host Unreachable", "Message too long")

_PING_HEADER_RE = re.compile(r"device\s+(?P<device>[0-9]{1,9})\s+PING6?\s+(?P<address>\S+)", re.IGNORECASE)
# "recv seq=1,time=0.049000ms". A vendor doc prints one reply as "time-0.049000ms" and one sequence number as the
# letter "O": the separators and the sequence are read loosely, the time strictly.
_PING_REPLY_RE = re.compile(
    r"recv\s+seq\s*[=:]\s*(?P<seq>\w+)\s*,\s*time\s*[=:-]\s*(?P<ms>[0-9]{1,9}(?:\.[0-9]{1,9})?)\s*ms", re.IGNORECASE
)
_PING_TIMEOUT_RE = re.compile(r"recv\s+time\s*out\s+seq\s*[=:]\s*(?P<seq>\w+)", re.IGNORECASE)
_PING_SEND_FAIL_RE = re.compile(r"pkt\s+send\s+fail\s+seq\s*[=:]\s*(?P<seq>\w+)", re.IGNORECASE)
_PING_SUMMARY_RE = re.compile(
    r"(?P<sent>[0-9]{1,9})\s+packets?\s+transmitted\s*,\s*(?P<received>[0-9]{1,9})\s+(?:packets?\s+)?received"
    r"\s*,\s*(?P<loss>[0-9]{1,3}(?:\.[0-9]{1,6})?)\s*%\s+packet\s+loss\b.*",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class HccnPingReply:
    """One probe: ``recv seq=0,time=0.067000ms``, ``recv time out seq=0`` or ``pkt send fail seq:0``."""

    seq: str  # as printed ("0"; kept as text because one vendor doc prints the letter "O")
    outcome: str  # "reply", "timeout", "send-fail"
    time_ms: float | None  # round trip of a reply

    @property
    def answered(self) -> bool:
        return self.outcome == "reply"


@dataclass(frozen=True)
class HccnPing:
    """``device 0 PING 10.10.100.10`` / ``recv seq=0,time=0.067000ms`` ... /
    ``3 packets transmitted, 3 received, 0.00% packet loss``: one NPU NIC pinging an address over RoCE."""

    device_id: int | None  # from the "device N PING A" line, when printed
    address: str | None
    replies: tuple[HccnPingReply, ...]
    transmitted: int
    received: int
    loss_percent: float
    raw: tuple[str, ...]  # lines the parser does not know (e.g. "Destination Host Unreachable")

    @property
    def reachable(self) -> bool:
        """At least one probe came back."""
        return self.received > 0

    @property
    def lossless(self) -> bool:
        return self.transmitted > 0 and self.received == self.transmitted


def parse_hccn_ping(text: str) -> HccnPing:
    """Parse the output of one ``hccn_tool -i N -ping -g address A``; the summary line is required, because it is
    the verdict (several device blocks, as a shell loop over devices prints them, are refused)."""
    what = "hccn_tool -ping -g"
    device_id: int | None = None
    address: str | None = None
    replies: list[HccnPingReply] = []
    summary: re.Match[str] | None = None
    raw: list[str] = []
    for line_no, line in content_lines(text, what):
        header = _PING_HEADER_RE.fullmatch(line)
        if header is not None:
            if address is not None or summary is not None or replies:
                raise ParseError(what, "more than one ping in the output (one command per device, please)",
                                 line_no, line)
            device_id = int(header.group("device"))
            address = header.group("address")
            continue
        if summary is not None:
            raise ParseError(what, "output after the 'packets transmitted' summary", line_no, line)
        reply = _PING_REPLY_RE.fullmatch(line)
        if reply is not None:
            replies.append(HccnPingReply(reply.group("seq"), "reply", float(reply.group("ms"))))
            continue
        timeout = _PING_TIMEOUT_RE.fullmatch(line)
        if timeout is not None:
            replies.append(HccnPingReply(timeout.group("seq"), "timeout", None))
            continue
        send_fail = _PING_SEND_FAIL_RE.fullmatch(line)
        if send_fail is not None:
            replies.append(HccnPingReply(send_fail.group("seq"), "send-fail", None))
            continue
        match = _PING_SUMMARY_RE.fullmatch(line)
        if match is not None:
            summary = match
            continue
        raw.append(line)
    if summary is None:
        raise ParseError(what, "no 'N packets transmitted, M received, X% packet loss' line")
    transmitted, received = int(summary.group("sent")), int(summary.group("received"))
    loss = float(summary.group("loss"))
    if received > transmitted or loss > 100:
        raise ParseError(what, f"{received} received of {transmitted} transmitted ({loss}% loss) is impossible")
    return HccnPing(
        device_id=device_id,
        address=address,
        replies=tuple(replies),
        transmitted=transmitted,
        received=received,
        loss_percent=loss,
        raw=tuple(raw),
    )
