"""Setting a host's NPU ports to what the inventory wants with `hccn_tool`, and proving they came up.

The provisioning role `npu_network` runs this on the controller (its action plugin); every `hccn_tool` call goes
to the host through `run_calls`, a batch of argument lists run one after another there (vendor docs warn that
hccn_tool answers "hccn_tool is busy" to concurrent callers). What the host prints is read with the pure parsers
of `npuops.hardware.hccn`. The steps, per host:

1. read every port: `-ip -g`, `-netdetect -g`, `-gateway -g` (a value never set reads as none);
2. set only what differs, in the order hccn_tool needs: `-ip -s address A netmask M` first (it refuses a gateway
   outside the port's subnet), then `-gateway -s gateway G`, then `-netdetect -s address D` (hicann/driver
   hccn_tool cmd.c; the vendor's "使用hccn_tool工具配置RoCE网卡IP地址和子网掩码"); hccn_tool keeps each value in
   /etc/hccn.conf itself. In check mode nothing is set and the commands are what would run;
3. read the ports again, then wait (bounded) for every set port's link to be UP and its net health Success, and
   ping each port's detect address from the port (`-ping -g address D`). A port that does not come up fails the
   host with the NPU named and the fix; other hosts are not affected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from npuops.fleet.npu_network import NpuPort
from npuops.hardware.hccn import (
    NOT_PRESET_MESSAGES,
    parse_hccn_gateway,
    parse_hccn_ip,
    parse_hccn_link,
    parse_hccn_net_health,
    parse_hccn_netdetect,
    parse_hccn_ping,
)
from npuops.parsing import ParseError

# (exit code, stdout, stderr) of one `hccn_tool ARGS...` on the host.
Call = tuple[int, str, str]
RunCalls = Callable[[Sequence[Sequence[str]]], list[Call]]

CONF_FILE = "/etc/hccn.conf"
RERUN = "then run `npuops provision --tags npu-network` again"


class PortReadError(Exception):
    """A port whose settings hccn_tool could not read: nothing is set on that host."""


@dataclass(frozen=True)
class PortSetting:
    """What a port has (or is to have): None for a value never set."""

    address: str | None = None
    netmask: str | None = None
    gateway: str | None = None
    detect: str | None = None

    @classmethod
    def wanted(cls, port: NpuPort) -> PortSetting:
        return cls(port.address, port.netmask, port.gateway, port.detect)

    def to_json(self) -> dict[str, str | None]:
        return {"address": self.address, "netmask": self.netmask, "gateway": self.gateway, "detect": self.detect}

    def conf_lines(self, device: int) -> list[str]:
        """The port as hccn_tool keeps it in /etc/hccn.conf (`address_0=...`): the form an operator knows."""
        values = (("address", self.address), ("netmask", self.netmask), ("gateway", self.gateway),
                  ("netdetect", self.detect))
        return [f"{key}_{device}={value}" for key, value in values if value is not None]


def _args(device: int, *rest: str) -> tuple[str, ...]:
    return ("-i", str(device), *rest)


def read_calls(device: int) -> list[tuple[str, ...]]:
    return [_args(device, "-ip", "-g"), _args(device, "-netdetect", "-g"), _args(device, "-gateway", "-g")]


def _failed(call: Call, args: Sequence[str]) -> str:
    said = (call[2].strip() or call[1].strip()).splitlines()
    return f"`hccn_tool {' '.join(args)}` failed (exit {call[0]}){': ' + said[0] if said else ''}"


def _not_preset(call: Call, query: str) -> bool:
    return call[0] != 0 and NOT_PRESET_MESSAGES[query] in call[2] + call[1]


def port_setting(device: int, calls: Sequence[Call]) -> PortSetting:
    """A port's settings from its three read calls (`read_calls`). Pure; raises PortReadError."""
    ip_call, detect_call, gateway_call = calls
    args = read_calls(device)
    try:
        if _not_preset(ip_call, "-ip"):
            address = netmask = None
        elif ip_call[0] != 0:
            raise PortReadError(_failed(ip_call, args[0]))
        else:
            ip = parse_hccn_ip(ip_call[1])
            address, netmask = ip.address, ip.netmask
        if detect_call[0] != 0:
            raise PortReadError(_failed(detect_call, args[1]))
        detect = parse_hccn_netdetect(detect_call[1]).address
        if _not_preset(gateway_call, "-gateway"):
            gateway = None
        elif gateway_call[0] != 0:
            raise PortReadError(_failed(gateway_call, args[2]))
        else:
            gateway = parse_hccn_gateway(gateway_call[1]).address
    except ParseError as exc:
        raise PortReadError(f"device {device}: {exc}") from None
    return PortSetting(address, netmask, gateway, detect)


def set_calls(device: int, now: PortSetting, want: PortSetting) -> list[tuple[str, ...]]:
    """The `hccn_tool` calls that take a port from `now` to `want`, in the order hccn_tool accepts them. Pure.
    A gateway the inventory does not give is left as it is (hccn_tool has no command that clears one)."""
    calls = []
    ip_changes = (now.address, now.netmask) != (want.address, want.netmask)
    if ip_changes:
        calls.append(_args(device, "-ip", "-s", "address", str(want.address), "netmask", str(want.netmask)))
    if want.gateway is not None and (ip_changes or now.gateway != want.gateway):
        calls.append(_args(device, "-gateway", "-s", "gateway", want.gateway))
    if want.detect is not None and now.detect != want.detect:
        calls.append(_args(device, "-netdetect", "-s", "address", want.detect))
    return calls


@dataclass(frozen=True)
class PortOutcome:
    """One port: before, after (in check mode: what it would be), the calls run (or that would run) and how the
    verification went."""

    device: int
    before: PortSetting
    after: PortSetting
    calls: tuple[tuple[str, ...], ...] = ()
    link: str | None = None  # "UP", "DOWN", as printed
    health: str | None = None  # "Success", "Init", ...
    reaches_detect: bool | None = None
    problem: str | None = None
    fix: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.calls)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "before": self.before.to_json(), "after": self.after.to_json(),
                "changed": self.changed, "commands": [f"hccn_tool {' '.join(c)}" for c in self.calls],
                "link": self.link, "health": self.health, "reaches_detect": self.reaches_detect,
                "problem": self.problem, "fix": self.fix}


@dataclass(frozen=True)
class PortsReport:
    """A host's ports after `configure_ports`: ok unless a port could not be read, set or verified."""

    ports: tuple[PortOutcome, ...] = ()
    check: bool = False
    problem: str | None = None  # a failure of the host as a whole (nothing read, a set refused)
    fix: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def failed_ports(self) -> list[PortOutcome]:
        return [p for p in self.ports if p.problem]

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.failed_ports

    @property
    def changed(self) -> bool:
        return any(p.changed for p in self.ports)

    def message(self) -> str:
        if self.problem:
            return f"{self.problem}; fix: {self.fix}" if self.fix else self.problem
        return "; ".join(f"NPU {p.device}: {p.problem}; fix: {p.fix}" for p in self.failed_ports)

    def diff(self) -> dict[str, str]:
        """Before and after as /etc/hccn.conf lines, for `--diff`."""
        before = [line for p in self.ports for line in p.before.conf_lines(p.device)]
        after = [line for p in self.ports for line in p.after.conf_lines(p.device)]
        return {"before_header": CONF_FILE, "after_header": CONF_FILE, "before": "".join(f"{b}\n" for b in before),
                "after": "".join(f"{a}\n" for a in after)}

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "check": self.check, "changed": sum(1 for p in self.ports if p.changed),
                "ports": [p.to_json() for p in self.ports], "problem": self.problem or (self.message() or None),
                "notes": list(self.notes)}


def _read_all(ports: Sequence[NpuPort], run_calls: RunCalls) -> list[PortSetting]:
    calls = [c for port in ports for c in read_calls(port.device)]
    results = run_calls(calls)
    return [port_setting(port.device, results[3 * i: 3 * i + 3]) for i, port in enumerate(ports)]


@dataclass(frozen=True)
class Waiting:
    """How long to wait for the ports to come up after a change, and how often to look."""

    timeout_s: float = 60.0
    poll_s: float = 2.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


def configure_ports(ports: Sequence[NpuPort], run_calls: RunCalls, *, check: bool = False,
                    waiting: Waiting | None = None) -> PortsReport:
    """Read, set what differs, read again and verify the ports of one host (see the module's docstring)."""
    try:
        before = _read_all(ports, run_calls)
    except PortReadError as exc:
        return PortsReport(check=check, problem=f"cannot read the NPU ports: {exc}",
                           fix="check that every NPU the inventory lists is present (`npu-smi info`) and that the "
                               "driver's hccn_tool works (`hccn_tool -i 0 -ip -g`)")
    plans = [set_calls(port.device, now, PortSetting.wanted(port)) for port, now in zip(ports, before, strict=True)]
    if check:
        would = tuple(PortOutcome(p.device, now, PortSetting.wanted(p) if calls else now, tuple(calls))
                      for p, now, calls in zip(ports, before, plans, strict=True))
        return PortsReport(would, check=True, notes=("check mode: nothing set, nothing verified",))
    flat = [c for calls in plans for c in calls]
    for args, result in zip(flat, run_calls(flat) if flat else [], strict=True):
        if result[0] != 0:
            return PortsReport(check=False, problem=f"NPU {args[1]}: {_failed(result, args)}",
                               fix=f"check the inventory's values for it (hccn_tool said why), {RERUN}")
    try:
        after = _read_all(ports, run_calls)
    except PortReadError as exc:
        return PortsReport(problem=f"cannot read the NPU ports back: {exc}", fix=f"check the driver, {RERUN}")
    outcomes = [PortOutcome(p.device, now, then, tuple(calls))
                for p, now, then, calls in zip(ports, before, after, plans, strict=True)]
    return PortsReport(tuple(verify_ports(ports, outcomes, run_calls, waiting or Waiting())))


def _mismatch(port: NpuPort, outcome: PortOutcome) -> str | None:
    want, got = PortSetting.wanted(port), outcome.after
    wrong = [key for key, value in want.to_json().items()
             if value is not None and got.to_json()[key] != value]
    return ", ".join(f"{key} reads {got.to_json()[key]} (set {want.to_json()[key]})" for key in wrong) or None


def _link_and_health(devices: Sequence[int], run_calls: RunCalls) -> dict[int, tuple[str | None, str | None]]:
    calls = [c for d in devices for c in (_args(d, "-link", "-g"), _args(d, "-net_health", "-g"))]
    results = run_calls(calls)
    out: dict[int, tuple[str | None, str | None]] = {}
    for i, device in enumerate(devices):
        link_call, health_call = results[2 * i], results[2 * i + 1]
        try:
            link = parse_hccn_link(link_call[1]).status if link_call[0] == 0 else None
        except ParseError:
            link = None
        try:
            health = parse_hccn_net_health(health_call[1]).status if health_call[0] == 0 else None
        except ParseError:
            health = None
        out[device] = (link, health)
    return out


def _up(state: tuple[str | None, str | None]) -> bool:
    return (state[0] or "").upper() == "UP" and (state[1] or "").lower() == "success"


def verify_ports(ports: Sequence[NpuPort], outcomes: Sequence[PortOutcome], run_calls: RunCalls,
                 waiting: Waiting) -> list[PortOutcome]:
    """Each port's link UP and net health Success (waiting up to `waiting.timeout_s` for ports just set: the
    health probe needs a few seconds after a change), then a ping of its detect address from the port."""
    deadline = waiting.clock() + (waiting.timeout_s if any(o.changed for o in outcomes) else 0.0)
    devices = [p.device for p in ports]
    states = _link_and_health(devices, run_calls)
    while not all(_up(states[d]) for d in devices) and waiting.clock() < deadline:
        waiting.sleep(waiting.poll_s)
        states = _link_and_health(devices, run_calls)
    pings = run_calls([_args(p.device, "-ping", "-g", "address", p.detect) for p in ports])
    verified = []
    for port, outcome, ping_call in zip(ports, outcomes, pings, strict=True):
        link, health = states[port.device]
        try:
            reaches = ping_call[0] == 0 and parse_hccn_ping(ping_call[1]).reachable
        except ParseError:
            reaches = False
        verified.append(_judge(port, replace(outcome, link=link, health=health, reaches_detect=reaches)))
    return verified


def _judge(port: NpuPort, outcome: PortOutcome) -> PortOutcome:
    d = port.device
    mismatch = _mismatch(port, outcome)
    if mismatch:
        return replace(outcome, problem=f"after setting, {mismatch}",
                       fix=f"set it by hand to see hccn_tool's answer (`hccn_tool -i {d} -ip -g`), {RERUN}")
    if (outcome.link or "").upper() != "UP":
        return replace(outcome, problem=f"link {outcome.link or 'unreadable'} (`hccn_tool -i {d} -link -g`)",
                       fix=f"check the NPU port's cable or optical module and its switch port (`hccn_tool -i {d} "
                           f"-link_stat -g` shows flaps, `hccn_tool -i {d} -status -g` the speed), {RERUN}")
    if (outcome.health or "").lower() != "success":
        return replace(outcome, problem=f"net health {outcome.health or 'unreadable'}: the port does not reach its "
                                        f"detect address {port.detect}",
                       fix=f"make {port.detect} answer on the parameter-plane network (usually the switch's gateway "
                           f"address in the port's VLAN) or give the port another npuops_npu_detect_ips, {RERUN}")
    if not outcome.reaches_detect:
        return replace(outcome, problem=f"`hccn_tool -i {d} -ping -g address {port.detect}` got no reply",
                       fix=f"check the route between the port and {port.detect} (`hccn_tool -i {d} -route -g`), "
                           f"{RERUN}")
    return outcome
