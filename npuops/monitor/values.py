"""What may reach Prometheus' files: label names and values, target addresses, and the instance records that carry
them (pure).

The records come from this node's state directory or, in a group render, from another host's `npuops monitor
targets --json`: input npuops does not trust. A record is watched only when every value it puts into a target file
or a rule meets Prometheus' own rules and npuops' (an instance name as launch allows it, a host that is an IP
address or a DNS name, a port in range, a label value of printable text); otherwise the render names it and why.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable

from npuops.errors import BadInputError
from npuops.httpclient import is_host_name
from npuops.instance.record import PD_ROLES, InstanceRecord, validate_instance_name

# Prometheus' label names (its data model); npuops' own are constants, and the tests hold every rendered one to it.
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
MAX_LABEL_VALUE = 1024
# Binds a server listens on every interface with: a client reaches them at the host's address.
WILDCARD_BINDS = ("0.0.0.0", "", "*", "::")  # noqa: S104 - binds, read from records
_PORTS = (1, 65535)


def quoted(value: object, limit: int = 60) -> str:
    """An untrusted value as a message shows it: its repr (no control character reaches a terminal), clipped."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def label_value_problem(value: object, what: str) -> str | None:
    """Why `value` cannot be a label value npuops writes, or None: printable text (no control, format or surrogate
    character: what an operator reads in an alert is what the series carries) of at most MAX_LABEL_VALUE."""
    if not isinstance(value, str):
        return f"{what} {quoted(value)} is not text"
    if len(value) > MAX_LABEL_VALUE:
        return f"{what} {quoted(value)} is longer than {MAX_LABEL_VALUE} characters"
    if not value.isprintable():
        return f"{what} {quoted(value)} holds a control or unprintable character"
    return None


def host_problem(host: object, what: str) -> str | None:
    """Why `host` cannot be where Prometheus scrapes, or None: an IP address (no IPv6 zone) or a DNS name."""
    if not isinstance(host, str):
        return f"{what} {quoted(host)} is not text"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if is_host_name(host):
            return None
        return f"{what} {quoted(host)} is neither an IP address nor a DNS name"
    return f"{what} {quoted(host)} carries an IPv6 zone" if "%" in host else None


def bind_problem(bind: object, what: str) -> str | None:
    """Why a server's bind address cannot be turned into a target, or None (a wildcard, an address, a name)."""
    return None if bind in WILDCARD_BINDS else host_problem(bind, what)


def port_problem(port: object, what: str) -> str | None:
    if isinstance(port, bool) or not isinstance(port, int) or not _PORTS[0] <= port <= _PORTS[1]:
        return f"{what} {quoted(port)} is not a port (1-65535)"
    return None


def split_address(text: str, what: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT; HOST may be a wildcard bind) as (host, port); else BadInputError naming `what`."""
    fix = f"give {what} as HOST:PORT, e.g. {what} 127.0.0.1:9100"
    if not isinstance(text, str):
        raise BadInputError(f"{what} {quoted(text)} is not text", fix)
    host, colon, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    # A bare IPv6 address is ambiguous (which colon ends it?), and brackets hold only an IPv6 address.
    if not colon or not host or (":" in host) != bracketed:
        raise BadInputError(f"{what} {quoted(text)} is not HOST:PORT", fix)
    number = int(port) if port.isascii() and port.isdigit() and len(port) <= 5 else 0
    problem = bind_problem(host, f"{what}'s host") or port_problem(number, f"{what}'s port")
    if problem:
        raise BadInputError(problem, fix)
    return host, number


def _name_problem(name: object, what: str) -> str | None:
    try:
        validate_instance_name(name)  # type: ignore[arg-type]
    except BadInputError:
        return f"{what} {quoted(name)} is not an instance name npuops launches"
    return None


def _first(problems: Iterable[str | None]) -> str | None:
    return next((p for p in problems if p), None)


def record_problem(record: InstanceRecord) -> str | None:
    """Why Prometheus cannot be pointed at what `record` serves, or None: every value it puts into a target file
    or a rule (names, the served model's name, the bind address, ports, devices, the role)."""
    return _first((
        _name_problem(record.name, "instance name"),
        _name_problem(record.behind, "router name") if record.behind is not None else None,
        _first(_name_problem(r, "replica name") for r in record.replicas),
        label_value_problem(record.served_model_name, "served model name"),
        bind_problem(record.host, "host"),
        port_problem(record.port, "port"),
        port_problem(record.metrics_port, "metrics port") if record.metrics_port is not None else None,
        None if record.pd_role in (None, *PD_ROLES) else f"pd_role {quoted(record.pd_role)} is not npuops'",
        _first(None if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else f"device {quoted(d)} is not "
               "a device id" for d in record.devices),
    ))


def predicted(record: InstanceRecord, key: str) -> float:
    """The record's plan prediction `key` as a positive finite number, 0 when it has none (a value that is not a
    number means no prediction to alert on, not a broken render)."""
    value = (record.prediction if isinstance(record.prediction, dict) else {}).get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return 0.0
    return float(value)
