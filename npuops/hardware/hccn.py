"""Pure parsers of ``hccn_tool -i <dev> ... -g`` outputs (the NPU RoCE NIC tool).

One parser per query:

=====================================  ===========================  ===================
command                                parser                       result
=====================================  ===========================  ===================
``hccn_tool -i N -link -g``            :func:`parse_hccn_link`        :class:`HccnLink`
``hccn_tool -i N -net_health -g``      :func:`parse_hccn_net_health`  :class:`HccnNetHealth`
``hccn_tool -i N -ip -g``              :func:`parse_hccn_ip`          :class:`HccnIp`
``hccn_tool -i N -link_stat -g``       :func:`parse_hccn_link_stat`   :class:`HccnLinkStat`
``hccn_tool -i N -route -g``           :func:`parse_hccn_route`       :class:`HccnRouteTable`
``hccn_tool -i N -status -g``          :func:`parse_hccn_status`      :class:`HccnNetdevStatus`
``hccn_tool -i N -hw_stats -g``        :func:`parse_hccn_hw_stats`    :class:`HccnHwStats`
``hccn_tool -i N -lldp -g``            :func:`parse_hccn_lldp`        :class:`HccnLldp`
``hccn_tool -i N -ping -g address A``  :func:`parse_hccn_ping`        :class:`HccnPing`
=====================================  ===========================  ===================

Text in, frozen dataclass out; the only exception raised is :class:`npuops.parsing.ParseError`.
Values published redacted (``10.xx.xx.10``, ``MAC: ...``) are kept as strings. Lines the parser does not know are
kept in each result's ``raw`` so nothing is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from npuops.parsing import ParseError

__all__ = [
    "NET_HEALTH_STATUSES",
    "NO_NIC_FAMILIES",
    "PING_FAILURE_MARKERS",
    "HccnHwStats",
    "HccnIp",
    "HccnLink",
    "HccnLinkChange",
    "HccnLinkStat",
    "HccnLldp",
    "HccnLldpTlv",
    "HccnNetHealth",
    "HccnNetdevStatus",
    "HccnPing",
    "HccnPingReply",
    "HccnRoute",
    "HccnRouteTable",
    "parse_hccn_hw_stats",
    "parse_hccn_ip",
    "parse_hccn_link",
    "parse_hccn_link_stat",
    "parse_hccn_lldp",
    "parse_hccn_net_health",
    "parse_hccn_ping",
    "parse_hccn_route",
    "parse_hccn_status",
]

Pairs = tuple[tuple[str, str], ...]

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
)

# Chip families whose chips carry no NPU NIC: the 300I Duo and other 310P inference cards talk over PCIe only, so
# hccn_tool has nothing to ask them.
NO_NIC_FAMILIES = frozenset({"310P"})

# ----------------------------------------------------------------------------------------------------------------
# Shared text handling
# ----------------------------------------------------------------------------------------------------------------

_BINARY_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
_ERROR_RE = re.compile(
    r"command not found|no such file or directory|permission denied|\bret(?:urn)?\s*(?:is|code|=|:)\s*-\d+",
    re.IGNORECASE,
)
_ELISION_RE = re.compile(r"(?:\.{3,}|\u2026+)")
_INT_RE = re.compile(r"[+-]?[0-9]{1,18}")


def _lines(text: str, what: str) -> list[tuple[int, str]]:
    """(1-based line number, line) pairs after the checks every parser shares."""
    if not isinstance(text, str):
        raise ParseError(what, f"expected text, got {type(text).__name__}")
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise ParseError(what, "empty output")
    numbered = list(enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), start=1))
    for line_no, line in numbered:
        if _BINARY_RE.search(line):
            raise ParseError(what, "binary data (control characters) instead of text", line_no, line)
    for line_no, line in numbered:
        if _ERROR_RE.search(line):
            raise ParseError(what, f"the output is an error message, not {what} output", line_no, line)
    return numbered


def _content(text: str, what: str) -> list[tuple[int, str]]:
    """Non-blank, non-elision lines, stripped."""
    out: list[tuple[int, str]] = []
    for line_no, line in _lines(text, what):
        stripped = line.strip()
        if stripped and not _ELISION_RE.fullmatch(stripped):
            out.append((line_no, stripped))
    return out


def _int(value: str | None) -> int | None:
    if value is None or not _INT_RE.fullmatch(value.strip()):
        return None
    return int(value)


def _colon_pair(line: str) -> tuple[str, str] | None:
    key, sep, value = line.partition(":")
    key = " ".join(key.split())
    if not sep or not key:
        return None
    return key, value.strip()


def _first(pairs: Pairs, key: str) -> str | None:
    wanted = key.lower()
    for k, v in pairs:
        if k.lower() == wanted:
            return v
    return None


# ----------------------------------------------------------------------------------------------------------------
# -link -g / -net_health -g / -ip -g : "key: value" lines
# ----------------------------------------------------------------------------------------------------------------


def _simple_pairs(text: str, what: str) -> Pairs:
    pairs: list[tuple[str, str]] = []
    for line_no, line in _content(text, what):
        pair = _colon_pair(line)
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
    status = _first(pairs, "link status")
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
    status = _first(pairs, "net health status")
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
    address = _first(pairs, "ipaddr")
    netmask = _first(pairs, "netmask")
    if address is None and netmask is None:
        raise ParseError(what, "no 'ipaddr:' or 'netmask:' line")
    return HccnIp(address=address or None, netmask=netmask or None, raw=pairs)


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


@dataclass(frozen=True)
class HccnLinkChange:
    time: str  # as printed, e.g. "Tue Jun  6 16:32:12 2023"
    event: str  # "LINK UP" / "LINK DOWN"
    up: bool


@dataclass(frozen=True)
class HccnLinkStat:
    """``[device 0]current time : ...`` / ``link up count : 2`` / ``link change records :`` + one line per change."""

    device_id: int | None
    current_time: str | None
    link_up_count: int | None
    changes: tuple[HccnLinkChange, ...]  # newest first, as printed
    raw: Pairs

    @property
    def link_down_count(self) -> int:
        """LINK DOWN events among the printed change records."""
        return sum(1 for change in self.changes if not change.up)


def parse_hccn_link_stat(text: str) -> HccnLinkStat:
    what = "hccn_tool -link_stat -g"
    seen: list[int] = []
    pairs: list[tuple[str, str]] = []
    changes: list[HccnLinkChange] = []
    for line_no, line in _content(text, what):
        body = _strip_device_prefix(line, what, line_no, seen)
        if not body or _ELISION_RE.fullmatch(body):
            continue
        event = _LINK_EVENT_RE.fullmatch(body)
        if event is not None:
            label = " ".join(event.group("event").upper().split())
            changes.append(HccnLinkChange(time=event.group("time"), event=label, up=label.endswith("UP")))
            continue
        pair = _colon_pair(body)
        if pair is None:
            raise ParseError(what, "expected 'key : value' or '<time>  LINK UP|DOWN'", line_no, line)
        pairs.append(pair)
    raw = tuple(pairs)
    current_time = _first(raw, "current time")
    up_count = _first(raw, "link up count")
    if current_time is None and up_count is None and not changes:
        raise ParseError(what, "no 'current time', 'link up count' or link change records")
    return HccnLinkStat(
        device_id=seen[0] if seen else None,
        current_time=current_time or None,
        link_up_count=_int(up_count),
        changes=tuple(changes),
        raw=raw,
    )


# ----------------------------------------------------------------------------------------------------------------
# -route -g
# ----------------------------------------------------------------------------------------------------------------

_ROUTE_COLUMNS = ("destination", "gateway", "genmask", "iface")
_KNOWN_ROUTE_COLUMNS = frozenset({"destination", "gateway", "genmask", "flags", "metric", "ref", "use", "iface"})
_ZERO_ADDRESS = "0.0.0.0"  # noqa: S104 - an address printed in a routing table, not a socket bind


@dataclass(frozen=True)
class HccnRoute:
    destination: str  # "default" or an address
    gateway: str | None  # None for "*" / "0.0.0.0" (directly connected)
    genmask: str
    flags: str
    metric: int | None
    ref: int | None
    use: int | None
    iface: str
    extra: Pairs = ()  # columns beyond Destination..Iface (e.g. "MSS", "Window"), as (header, value)

    @property
    def is_default(self) -> bool:
        return self.destination.lower() == "default" or (
            self.destination == _ZERO_ADDRESS and self.genmask in (_ZERO_ADDRESS, "")
        )


@dataclass(frozen=True)
class HccnRouteTable:
    """``Routing table:`` + a ``route -n``-style table."""

    routes: tuple[HccnRoute, ...]
    default_gateway: str | None  # gateway of the first default route, if any
    default_iface: str | None


def parse_hccn_route(text: str) -> HccnRouteTable:
    what = "hccn_tool -route -g"
    header: list[str] | None = None
    header_names: list[str] = []
    routes: list[HccnRoute] = []
    for line_no, line in _content(text, what):
        if header is None and re.fullmatch(r"(?i)(?:kernel ip )?routing table:?", line):
            continue
        tokens = line.split()
        if header is None:
            names = [token.lower() for token in tokens]
            if not names or names[0] != "destination":
                raise ParseError(what, "expected the 'Destination Gateway Genmask ...' header", line_no, line)
            missing = [name for name in _ROUTE_COLUMNS if name not in names]
            if missing:
                raise ParseError(what, f"header lacks column(s) {', '.join(missing)}", line_no, line)
            header = names
            header_names = tokens
            continue
        if len(tokens) != len(header):
            raise ParseError(what, f"expected {len(header)} columns, got {len(tokens)}", line_no, line)
        row = dict(zip(header, tokens, strict=True))
        gateway = row["gateway"]
        routes.append(
            HccnRoute(
                destination=row["destination"],
                gateway=None if gateway in ("*", _ZERO_ADDRESS) else gateway,
                genmask=row["genmask"],
                flags=row.get("flags", ""),
                metric=_int(row.get("metric")),
                ref=_int(row.get("ref")),
                use=_int(row.get("use")),
                iface=row["iface"],
                extra=tuple(
                    (name, value)
                    for name, key, value in zip(header_names, header, tokens, strict=True)
                    if key not in _KNOWN_ROUTE_COLUMNS
                ),
            )
        )
    if header is None:
        raise ParseError(what, "no routing table header")
    default = next((route for route in routes if route.is_default), None)
    return HccnRouteTable(
        routes=tuple(routes),
        default_gateway=default.gateway if default else None,
        default_iface=default.iface if default else None,
    )


# ----------------------------------------------------------------------------------------------------------------
# -status -g (ethtool's "Settings for ethN:")
# ----------------------------------------------------------------------------------------------------------------

_SETTINGS_FOR_RE = re.compile(r"(?:netdev status\s*:\s*)?settings for\s+(\S+?)\s*:?", re.IGNORECASE)
_ETHTOOL_KEYS = ("speed", "duplex", "link detected", "supported ports", "port", "auto-negotiation")


@dataclass(frozen=True)
class HccnNetdevStatus:
    """``Netdev status:Settings for eth3:`` followed by ethtool output."""

    interface: str | None  # "eth3"
    speed: str | None  # as printed: "200000Mb/s", "Unknown!"
    speed_mbps: int | None
    duplex: str | None  # "Full"
    port: str | None  # "Direct Attach Copper", "FIBRE"
    auto_negotiation: str | None  # "off"
    link_detected: bool | None  # "Link detected: yes"
    supported_link_modes: tuple[str, ...]
    settings: Pairs  # every "Key: value" (continuation lines joined with a space), in order


def parse_hccn_status(text: str) -> HccnNetdevStatus:
    what = "hccn_tool -status -g"
    interface: str | None = None
    settings: list[list[str]] = []
    for line_no, line in _content(text, what):
        header = _SETTINGS_FOR_RE.fullmatch(line)
        if header is not None:
            interface = header.group(1)
            continue
        pair = _colon_pair(line)
        if pair is None:
            if not settings:
                raise ParseError(what, "continuation line before any 'Key: value' line", line_no, line)
            settings[-1][1] = f"{settings[-1][1]} {line}".strip()
            continue
        settings.append([pair[0], pair[1]])
    pairs: Pairs = tuple((key, value) for key, value in settings)
    if not any(_first(pairs, key) is not None for key in _ETHTOOL_KEYS):
        raise ParseError(what, "no ethtool settings (Speed, Duplex, Link detected, ...) found")
    speed = _first(pairs, "speed")
    speed_match = re.fullmatch(r"([0-9]{1,12})\s*Mb/s", speed or "")
    detected = (_first(pairs, "link detected") or "").lower()
    modes = _first(pairs, "supported link modes")
    return HccnNetdevStatus(
        interface=interface,
        speed=speed,
        speed_mbps=int(speed_match.group(1)) if speed_match else None,
        duplex=_first(pairs, "duplex"),
        port=_first(pairs, "port"),
        auto_negotiation=_first(pairs, "auto-negotiation"),
        link_detected=True if detected == "yes" else False if detected == "no" else None,
        supported_link_modes=tuple(modes.split()) if modes and modes.lower() != "not reported" else (),
        settings=pairs,
    )


# ----------------------------------------------------------------------------------------------------------------
# -hw_stats -g
# ----------------------------------------------------------------------------------------------------------------

_COUNTER_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\- ]*")


@dataclass(frozen=True)
class HccnHwStats:
    """``[devid 3] pd_alloc: 1`` lines: RoCE resource counters."""

    device_id: int | None
    counters: tuple[tuple[str, int], ...]  # every integer-valued counter, in order
    raw: Pairs  # every line, including non-integer values

    def get(self, name: str) -> int | None:
        for key, value in self.counters:
            if key == name:
                return value
        return None


def parse_hccn_hw_stats(text: str) -> HccnHwStats:
    what = "hccn_tool -hw_stats -g"
    seen: list[int] = []
    pairs: list[tuple[str, str]] = []
    for line_no, line in _content(text, what):
        body = _strip_device_prefix(line, what, line_no, seen)
        pair = _colon_pair(body)
        if pair is None or not _COUNTER_KEY_RE.fullmatch(pair[0]):
            raise ParseError(what, "expected '[devid N] counter: value'", line_no, line)
        pairs.append(pair)
    if not pairs:
        raise ParseError(what, "no counters found")
    counters: list[tuple[str, int]] = []
    for key, value in pairs:
        number = _int(value)
        if number is not None:
            counters.append((key, number))
    return HccnHwStats(device_id=seen[0] if seen else None, counters=tuple(counters), raw=tuple(pairs))


# ----------------------------------------------------------------------------------------------------------------
# -lldp -g
# ----------------------------------------------------------------------------------------------------------------

_TLV_HEADER_RE = re.compile(r"[A-Za-z][A-Za-z0-9 ./\-]*\sTLV")


@dataclass(frozen=True)
class HccnLldpTlv:
    name: str  # "Chassis ID", "Port ID", "System Description", ... (without the trailing "TLV")
    lines: tuple[str, ...]  # content lines, stripped, blank and elided ("...") lines dropped


@dataclass(frozen=True)
class HccnLldp:
    """The LLDP neighbour (the switch port) as decoded by ``-lldp -g``: ``<Name> TLV`` headers, indented content."""

    chassis_id: str | None  # "MAC: ..." -> "..." (value after the subtype label, verbatim)
    port_id: str | None  # "Ifname: 400GE1/1/20:2" -> "400GE1/1/20:2"
    system_name: str | None
    system_description: str | None  # content lines joined with "\n"
    capabilities: tuple[str, ...]  # "Enabled capabilities: Bridge, Router" -> ("Bridge", "Router")
    management_address: str | None  # "IPv4: 26.xx.xx.xx" -> "26.xx.xx.xx"
    max_frame_size: int | None
    tlvs: tuple[HccnLldpTlv, ...]
    elided: bool  # the capture had "..." lines (content left out by whoever published it)

    def tlv(self, name: str) -> HccnLldpTlv | None:
        for tlv in self.tlvs:
            if tlv.name.lower() == name.lower():
                return tlv
        return None


def parse_hccn_lldp(text: str) -> HccnLldp:
    what = "hccn_tool -lldp -g"
    tlvs: list[tuple[str, list[str]]] = []
    elided = False
    for line_no, line in _lines(text, what):
        stripped = line.strip()
        if not stripped:
            continue
        if _ELISION_RE.fullmatch(stripped):
            elided = True
            continue
        if not line[:1].isspace() and _TLV_HEADER_RE.fullmatch(stripped):
            tlvs.append((stripped[: -len("TLV")].strip(), []))
            continue
        if not tlvs:
            raise ParseError(what, "content before the first '<Name> TLV' header", line_no, line)
        tlvs[-1][1].append(stripped)
    if not tlvs:
        raise ParseError(what, "no '<Name> TLV' headers found")
    result = tuple(HccnLldpTlv(name=name, lines=tuple(lines)) for name, lines in tlvs)

    def content(name: str) -> tuple[str, ...]:
        for tlv in result:
            if tlv.name.lower() == name.lower():
                return tlv.lines
        return ()

    def labelled(name: str) -> str | None:
        lines = content(name)
        if not lines:
            return None
        pair = _colon_pair(lines[0])
        return pair[1] if pair is not None else lines[0]

    capabilities: tuple[str, ...] = ()
    for line in content("System Capabilities"):
        pair = _colon_pair(line)
        if pair is not None and pair[0].lower() == "enabled capabilities":
            capabilities = tuple(item.strip() for item in pair[1].split(",") if item.strip())
    frame = content("Maximum Frame Size")
    description = content("System Description")
    name = content("System Name")
    return HccnLldp(
        chassis_id=labelled("Chassis ID"),
        port_id=labelled("Port ID"),
        system_name=name[0] if name else None,
        system_description="\n".join(description) if description else None,
        capabilities=capabilities,
        management_address=labelled("Management Address"),
        max_frame_size=_int(frame[0]) if frame else None,
        tlvs=result,
        elided=elided,
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
    for line_no, line in _content(text, what):
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
