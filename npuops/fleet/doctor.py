"""The fleet doctor (`npuops doctor -i INVENTORY`): every host's doctor report, and what differs between hosts.

Two playbook runs through ansible-runner: node-facts.yml first (every host's node model, see facts.py),
then playbooks/fleet-doctor.yml on the hosts that answered (each runs `npuops doctor --json` and reads its
clock). The result is a `FleetDoctorReport`: per host the full doctor report or why there is none, the
`Difference`s that break a multi-node job (driver, CANN, stack versions, chips that differ between hosts),
and each host's clock skew against this controller.

With a serving group (`--group G`) each host's doctor also gets `--peers`: the other hosts of G (inventory
address and port, their NPU NIC addresses from their node models), for the network checks.

Everything but `run_fleet_doctor` is pure: it reads each host's typed node model (npuops.hardware.node.Node, as
npuops.fleet.facts read it from the host's answer) and the doctor's JSON report; the serving group's hosts come from
npuops.fleet.inventory (ansible-inventory).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from npuops.doctor.model import Status
from npuops.errors import BadInputError, UsageError
from npuops.fleet.events import PlaybookEvent
from npuops.fleet.facts import FIX_UNREACHABLE, FleetFacts, HostNode, collect_node_models, failure_fix
from npuops.fleet.host_results import HostResult, PlaybookRun
from npuops.fleet.inventory import InventoryHost, read_inventory_group
from npuops.fleet.npu_network import npu_ips_of
from npuops.fleet.runner import run_playbook
from npuops.hardware.node import Node

FLEET_DOCTOR_PLAYBOOK = "fleet-doctor.yml"
# The set_stats keys fleet-doctor.yml hands each host's data back under: the npuops version and the clock
# reading (before the doctor runs), then the doctor's report.
HOST_STATS_KEY = "npuops_fleet_host"
DOCTOR_STATS_KEY = "npuops_fleet_doctor"
# The name of fleet-doctor.yml's clock task: its result event carries the controller's times around the reading.
CLOCK_TASK = "Read the host clock"

# Clock skew between a host and the controller, in seconds. Above 1 s, logs of one request no longer line up
# across nodes (a Ray or HCCL error on one node cannot be matched with the others' lines). Above 5 s,
# distributed start-up breaks: Ray's and torch's rendezvous and HCCL's connection set-up work with timeouts and
# leases of a few seconds, which a node whose clock is that far off sees expire early or late.
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 5.0

FIX_DOCTOR_FAILED = "run `npuops doctor --json` on the host to see the problem there"
FIX_NO_REPORT = "check that npuops_command runs npuops on that host, and do not filter fleet-doctor by tags"

HostDoctorStatus = Literal["ok", "checks-failed", "failed", "unreachable"]
# Worst first, for the table's order.
_HOST_STATUS_RANK: Mapping[str, int] = {"unreachable": 0, "failed": 1, "checks-failed": 2, "ok": 3}
# The order of check areas in the table; areas not named here follow, alphabetically.
AREA_ORDER = ("driver", "chips", "cann", "stack", "environment", "host", "network", "service", "precision")


# --- what must be the same on every host -------------------------------------------------------------------------


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip()
    return text or None


def _package(name: str) -> Callable[[Node], str | None]:
    return lambda node: _text(node.python_stack.version(name))


@dataclass(frozen=True)
class ComparedFact:
    key: str
    what: str
    read: Callable[[Node], str | None]


# What a multi-node job needs to be the same everywhere, read from each host's node model
# (npuops/hardware/node.py). One line per fact; the npuops version comes from fleet-doctor.yml.
COMPARED: tuple[ComparedFact, ...] = (
    ComparedFact("driver", "NPU driver", lambda n: _text(n.driver.version) or _text(n.npu_smi.driver_version)),
    ComparedFact("firmware", "NPU firmware", lambda n: _text(n.firmware.version)),
    ComparedFact("cann", "CANN toolkit", lambda n: _text(n.cann.toolkit.version)),
    ComparedFact("kernels", "CANN kernels/ops", lambda n: _text(n.cann.kernels.version)),
    ComparedFact("nnal", "NNAL (ATB)", lambda n: _text(n.cann.nnal.version)),
    ComparedFact("python", "Python", lambda n: _text(n.python_stack.python)),
    ComparedFact("torch", "torch", _package("torch")),
    ComparedFact("torch_npu", "torch_npu", _package("torch_npu")),
    ComparedFact("vllm", "vllm", _package("vllm")),
    ComparedFact("vllm_ascend", "vllm-ascend", _package("vllm_ascend")),
    ComparedFact("triton_ascend", "triton-ascend", _package("triton_ascend")),
    ComparedFact("chip_model", "chip model", lambda n: ", ".join(name for name in n.chip_names() if name) or None),
    ComparedFact("chip_count", "chip count", lambda n: str(len(n.chips))),
    ComparedFact("arch", "CPU architecture", lambda n: _text(n.host.arch)),
)
NPUOPS_VERSION = ComparedFact("npuops", "npuops", lambda n: None)  # read from `npuops --version`, not the node


@dataclass(frozen=True)
class Difference:
    """One fact the hosts disagree on: each value with its hosts, the majority's value, and the odd hosts.

    A value of None means the host has none (not installed, no chips). On a tie there is no majority and
    every host is odd: nothing says which side is right.
    """

    key: str
    what: str
    values: tuple[tuple[str | None, tuple[str, ...]], ...]  # most hosts first
    majority: str | None
    has_majority: bool
    odd_hosts: tuple[str, ...]

    def value_of(self, host: str) -> str | None:
        for value, hosts in self.values:
            if host in hosts:
                return value
        return None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "what": self.what, "majority": self.majority if self.has_majority else None,
                "has_majority": self.has_majority, "odd_hosts": list(self.odd_hosts),
                "values": [{"value": value, "hosts": list(hosts)} for value, hosts in self.values]}


def compare_values(key: str, what: str, values: Mapping[str, str | None]) -> Difference | None:
    """The Difference among `values` (host -> value), or None when every host has the same. Pure."""
    groups: dict[str | None, list[str]] = {}
    for host, value in values.items():
        groups.setdefault(value, []).append(host)
    if len(groups) < 2:
        return None
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0] is None, item[0] or ""))
    top = len(ordered[0][1])
    has_majority = len(ordered[1][1]) < top
    majority = ordered[0][0] if has_majority else None
    odd = tuple(h for h in values if not has_majority or values[h] != majority)
    return Difference(key, what, tuple((value, tuple(hosts)) for value, hosts in ordered), majority, has_majority,
                      odd)


def fleet_differences(nodes: Mapping[str, Node],
                      npuops_versions: Mapping[str, str | None] | None = None) -> list[Difference]:
    """What the hosts' node models (by host) disagree on, in COMPARED order; with
    `npuops_versions` (host -> `npuops --version`) the npuops version too. Hosts without a model are left
    out. Pure."""
    found: list[Difference] = []
    for fact in COMPARED:
        difference = compare_values(fact.key, fact.what, {host: fact.read(node) for host, node in nodes.items()})
        if difference is not None:
            found.append(difference)
    if npuops_versions:
        difference = compare_values(NPUOPS_VERSION.key, NPUOPS_VERSION.what, dict(npuops_versions))
        if difference is not None:
            found.append(difference)
    return found


# --- clocks ------------------------------------------------------------------------------------------------------


def parse_clock_reading(text: Any) -> float | None:
    """`date +%s.%N` output as epoch seconds, or None. A `date` without %N (busybox prints "N" or "%N")
    still gives whole seconds. Pure."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    if not isinstance(text, str):
        return None
    head, _, tail = text.strip().partition(".")
    if not head.isdigit():
        return None
    return float(f"{head}.{tail}") if tail.isdigit() else float(head)


@dataclass(frozen=True)
class ClockSkew:
    """A host's clock against the controller's. The host read its clock at some moment between `sent` and
    `received` (controller times), so its skew lies in [reading - received, reading - sent]; `skew_s` is the
    middle of that range and `least_s` the smallest skew it allows (0 when the reading falls inside the
    window), which is what is judged: a slow connection widens the window but never makes a skew up."""

    reading: float
    sent: float
    received: float

    @property
    def skew_s(self) -> float:
        return self.reading - (self.sent + self.received) / 2

    @property
    def uncertainty_s(self) -> float:
        return max(0.0, self.received - self.sent) / 2

    @property
    def least_s(self) -> float:
        return max(0.0, abs(self.skew_s) - self.uncertainty_s)

    @property
    def status(self) -> Status:
        return clock_status(self.least_s)

    def to_json(self) -> dict[str, Any]:
        return {"skew_s": round(self.skew_s, 3), "uncertainty_s": round(self.uncertainty_s, 3),
                "status": self.status.value}


def clock_status(least_skew_s: float, warn_s: float = CLOCK_WARN_S, fail_s: float = CLOCK_FAIL_S) -> Status:
    """The verdict on a skew of at least `least_skew_s` seconds (either direction). Pure."""
    skew = abs(least_skew_s)
    if skew > fail_s:
        return Status.FAIL
    if skew > warn_s:
        return Status.WARN
    return Status.PASS


def clock_skew(reading: float | None, sent: float | None, received: float | None) -> ClockSkew | None:
    """The skew of a host clock `reading` taken between the controller times `sent` and `received`, or
    None when a piece is missing. Pure."""
    if reading is None or sent is None or received is None:
        return None
    return ClockSkew(reading, min(sent, received), max(sent, received))


# --- the network preflight of a serving group ---------------------------------------------------------------------


def chip_nic_ips(node: Node | None) -> dict[str, str]:
    """A node model's NPU NIC addresses by device id (the id ASCEND_RT_VISIBLE_DEVICES uses). Pure."""
    if node is None:
        return {}
    return {str(chip.device_id): nic.strip() for chip in node.chips if (nic := _text(chip.nic_ip))}


def local_interface_for(node: Node | None, addresses: Sequence[str]) -> str | None:
    """The name of the host's up interface whose IPv4 network holds the peers' addresses (the first one
    that holds any), from the node model's host interfaces; None when none does. Pure."""
    if node is None:
        return None
    targets = []
    for address in addresses:
        try:
            targets.append(ipaddress.ip_address(address))
        except ValueError:
            continue
    for target in targets:
        for interface in node.host.interfaces:
            if not interface.up or not interface.name:
                continue
            for cidr in interface.ipv4:
                try:
                    network = ipaddress.ip_interface(cidr).network
                except ValueError:
                    continue
                if target in network and not network.is_loopback:
                    return interface.name
    return None


def peer_address(member: InventoryHost) -> str:
    """Where the other hosts reach a member: its ansible_host, or its name when that is a template only Ansible
    can resolve."""
    return member.name if "{{" in member.address else member.address


def member_npu_ips(planned: Mapping[int, str] | None, node: Node | None) -> dict[str, str]:
    """A member's NPU NIC addresses by device id: the inventory's (`planned`), when it gives them (what `npuops
    provision --tags npu-network` sets: one source for the role, the network checks and a launch), else its node
    model's. Pure."""
    if planned is not None:
        return {str(device): address for device, address in planned.items()}
    return chip_nic_ips(node)


def build_peers(members: Sequence[InventoryHost], nodes: Mapping[str, Node | None]) -> dict[str, dict[str, Any]]:
    """Each member's `npuops doctor --peers` value: the other members (inventory order) with their address, port
    and NPU NIC addresses (`member_npu_ips`), the member's own addresses when the inventory gives them (its hccn-ip
    check compares its NICs with them), and the local interface that reaches the others when the member's node
    model shows one. Pure."""
    planned = {m.name: npu_ips_of(m.name, m.vars) for m in members}
    peers: dict[str, dict[str, Any]] = {}
    for member in members:
        others = [m for m in members if m.name != member.name]
        value: dict[str, Any] = {"peers": [{"name": m.name, "address": peer_address(m), "port": m.port,
                                            "npu_ips": member_npu_ips(planned[m.name], nodes.get(m.name))}
                                           for m in others]}
        own = planned[member.name]
        if own:
            value = {"npu_ips": member_npu_ips(own, None), **value}
        ifname = local_interface_for(nodes.get(member.name), [peer_address(m) for m in others])
        if ifname:
            value = {"ifname": ifname, **value}
        peers[member.name] = value
    return peers


# --- per host ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostDoctor:
    """One host's part of the fleet report: its doctor's report and node model, or why there is none."""

    host: str
    status: HostDoctorStatus
    report: Mapping[str, Any] | None = None
    node: Node | None = None
    message: str = ""
    fix: str = ""
    npuops_version: str | None = None
    clock: ClockSkew | None = None
    peers: Mapping[str, Any] | None = None

    def checks(self) -> list[Mapping[str, Any]]:
        checks = _get(self.report, "checks")
        return [c for c in checks if isinstance(c, Mapping)] if isinstance(checks, list) else []

    def area_status(self) -> dict[str, Status]:
        """The worst status of this host's checks in each area."""
        worst: dict[str, Status] = {}
        for check in self.checks():
            try:
                status = Status(check.get("status"))
            except ValueError:
                continue
            area = str(check.get("area") or "other")
            if area not in worst or status.rank < worst[area].rank:
                worst[area] = status
        return worst

    def failed_checks(self) -> list[Mapping[str, Any]]:
        return [c for c in self.checks() if c.get("status") in (Status.FAIL.value, Status.ERROR.value)]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "status": self.status, "message": self.message, "fix": self.fix,
            "npuops_version": self.npuops_version,
            "clock_skew_s": round(self.clock.skew_s, 3) if self.clock else None,
            "report": self.report, "node": self.node.to_json() if self.node is not None else None,
        }
        if self.peers is not None:
            data["peers"] = self.peers
        return data


def _npuops_version(text: Any) -> str | None:
    """`npuops, version 0.1.0` -> 0.1.0."""
    value = _text(text)
    if value is None:
        return None
    return value.rsplit("version", 1)[-1].strip() or value


def host_doctor(name: str, node_entry: HostNode | None, result: HostResult | None,
                clock_window: tuple[float, float] | None = None,
                peers: Mapping[str, Any] | None = None) -> HostDoctor:
    """One host's entry from its node-facts answer and its fleet-doctor result (None: the doctor did not run
    there). Pure."""
    node = node_entry.node if node_entry is not None else None
    if node_entry is not None and node_entry.status != "ok":
        return HostDoctor(name, node_entry.status, None, None, node_entry.message, node_entry.fix, peers=peers)
    if result is None:
        return HostDoctor(name, "failed", None, node, "the doctor did not run on the host",
                          FIX_NO_REPORT, peers=peers)
    if result.status == "unreachable":
        return HostDoctor(name, "unreachable", None, node, result.message or "unreachable", FIX_UNREACHABLE,
                          peers=peers)
    host_data = result.data.get(HOST_STATS_KEY)
    host_data = host_data if isinstance(host_data, Mapping) else {}
    version = _npuops_version(host_data.get("npuops_version"))
    clock = None
    if clock_window is not None:
        clock = clock_skew(parse_clock_reading(host_data.get("clock")), *clock_window)
    data = result.data.get(DOCTOR_STATS_KEY)
    data = data if isinstance(data, Mapping) else {}
    if result.status == "failed":
        return HostDoctor(name, "failed", None, node, result.message or "failed",
                          failure_fix(result, FIX_DOCTOR_FAILED), version, clock, peers)
    report = data.get("report")
    if not isinstance(report, Mapping):
        return HostDoctor(name, "failed", None, node, "the host returned no doctor report", FIX_NO_REPORT,
                          version, clock, peers)
    error = report.get("error")
    if "checks" not in report and isinstance(error, Mapping):
        # npuops stopped with an expected error that exits 1 (its JSON error shape).
        return HostDoctor(name, "failed", None, node, str(error.get("problem") or "the doctor stopped"),
                          str(error.get("fix") or FIX_DOCTOR_FAILED), version, clock, peers)
    ok = report.get("ok") is True
    return HostDoctor(name, "ok" if ok else "checks-failed", report, node, "" if ok else "checks failed",
                      "" if ok else "see the failed checks and their fixes", version, clock, peers)


# --- the fleet -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetDoctorReport:
    hosts: Mapping[str, HostDoctor]
    differences: tuple[Difference, ...]
    level: int
    group: str | None = None
    artifacts: tuple[Path, ...] = ()
    errors: tuple[str, ...] = ()
    # Inventory order where known (a serving group's): it breaks ties in the table, else the name does.
    order: tuple[str, ...] = ()
    clock_warn_s: float = CLOCK_WARN_S
    clock_fail_s: float = CLOCK_FAIL_S

    @property
    def clock_status(self) -> Status:
        statuses = [h.clock.status for h in self.hosts.values() if h.clock is not None]
        return min(statuses, key=lambda s: s.rank) if statuses else Status.SKIP

    @property
    def ok(self) -> bool:
        """Every host's doctor passed, the hosts agree, and no clock is off by more than the failing bound."""
        return (bool(self.hosts) and all(h.status == "ok" for h in self.hosts.values()) and not self.differences
                and self.clock_status is not Status.FAIL)

    def areas(self) -> list[str]:
        present = {area for h in self.hosts.values() for area in h.area_status()}
        return [a for a in AREA_ORDER if a in present] + sorted(present - set(AREA_ORDER))

    def odd_hosts(self) -> set[str]:
        return {host for d in self.differences for host in d.odd_hosts}

    def sorted_hosts(self) -> list[HostDoctor]:
        """Worst first: no report, then failed checks, then the worst area or clock, more failures, odd ones;
        then inventory order (where known) and name."""
        odd = self.odd_hosts()
        position = {name: i for i, name in enumerate(self.order)}

        def key(h: HostDoctor) -> tuple[int, int, int, int, int, str]:
            ranks = [s.rank for s in h.area_status().values()]
            if h.clock is not None:
                ranks.append(h.clock.status.rank)
            return (_HOST_STATUS_RANK.get(h.status, 0), min(ranks, default=Status.PASS.rank),
                    -len(h.failed_checks()), 0 if h.host in odd else 1, position.get(h.host, len(position)), h.host)

        return sorted(self.hosts.values(), key=key)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "level": self.level,
            "group": self.group,
            "hosts": {h.host: h.to_json() for h in self.sorted_hosts()},
            "differences": [d.to_json() for d in self.differences],
            "clock": {"status": self.clock_status.value, "warn_s": self.clock_warn_s, "fail_s": self.clock_fail_s,
                      "hosts": {name: h.clock.to_json() for name, h in self.hosts.items() if h.clock is not None}},
            "artifacts": [str(a) for a in self.artifacts],
            "errors": list(self.errors),
        }


def clock_windows(events: Sequence[PlaybookEvent]) -> dict[str, tuple[float, float]]:
    """Per host, the controller's (start, end) times of the clock task's result. Pure."""
    windows: dict[str, tuple[float, float]] = {}
    for event in events:
        if (event.task == CLOCK_TASK and event.host and event.kind in ("ok", "changed")
                and event.started_at is not None and event.ended_at is not None):
            windows[event.host] = (event.started_at, event.ended_at)
    return windows


def fleet_doctor_report(facts: FleetFacts, run: PlaybookRun | None, *, level: int, group: str | None = None,
                        peers: Mapping[str, Mapping[str, Any]] | None = None,
                        order: Sequence[str] | None = None) -> FleetDoctorReport:
    """The fleet report from the node-facts run and the fleet-doctor run (None when no host could run it).
    `order` lists hosts in inventory order (the table's order among equals). Pure."""
    names = list(order or ())
    names += [h for h in facts.hosts if h not in names]
    if run is not None:
        names += [h for h in run.hosts if h not in names]
    windows = clock_windows(run.events) if run is not None else {}
    hosts: dict[str, HostDoctor] = {}
    for name in names:
        node_entry = facts.hosts.get(name)
        if node_entry is None and (run is None or name not in run.hosts):
            continue
        result = run.hosts.get(name) if run is not None else None
        hosts[name] = host_doctor(name, node_entry, result, windows.get(name), (peers or {}).get(name))
    nodes = {name: h.node for name, h in hosts.items() if h.node is not None}
    versions = {name: h.npuops_version for name, h in hosts.items() if h.npuops_version is not None}
    artifacts = (facts.run.artifacts,) + ((run.artifacts,) if run is not None else ())
    errors = tuple(facts.run.errors) + (tuple(run.errors) if run is not None else ())
    return FleetDoctorReport(hosts, tuple(fleet_differences(nodes, versions)), level, group, artifacts, errors,
                             tuple(order or ()))


def _names_limit(names: Sequence[str]) -> str:
    return ",".join(names)


def run_fleet_doctor(
    *,
    inventory: Path | Sequence[str],
    artifacts_dir: Path,
    limit: str | None = None,
    level: int = 2,
    group: str | None = None,
    forks: int = 5,
    npuops_command: str | None = None,
    ascend_root: Path | str | None = None,
    doctor_timeout_s: float | None = None,
    on_event: Callable[[PlaybookEvent], None] | None = None,
    ansible_playbook: Path | None = None,
) -> FleetDoctorReport:
    """Run the doctor on every host of `inventory` (a file/directory, or host names as with --host).

    node-facts.yml runs first; fleet-doctor.yml then runs on the hosts that answered. With `group` (an
    inventory group; needs an inventory file) only its hosts run, each with `--peers` naming the others.
    `npuops_command` and `ascend_root`, when given, apply to every host; None lets the inventory decide.
    Expected problems (bad inventory, unknown group, no host matched) raise NpuopsError."""
    if level not in (1, 2, 3):
        raise BadInputError(f"--level {level} is not a doctor level", "pass --level 1, 2 or 3")
    members: list[InventoryHost] = []
    order: list[str] = []
    run_limit = limit
    if group is not None:
        if not isinstance(inventory, Path):
            raise UsageError("--group needs an inventory file", "pass the inventory with -i INVENTORY")
        members = read_inventory_group(inventory, group)
        order = [m.name for m in members]
        # Ansible applies `&` patterns to the union of the plain ones: LIMIT,&GROUP is LIMIT within GROUP.
        run_limit = f"{limit},&{group}" if limit else group
    try:
        facts = collect_node_models(inventory=inventory, artifacts_dir=artifacts_dir, limit=run_limit, forks=forks,
                                    npuops_command=npuops_command, ascend_root=ascend_root, on_event=on_event,
                                    ansible_playbook=ansible_playbook)
    except BadInputError as exc:
        if limit and "no hosts to target" in exc.problem:
            scope = f"group {group}" if group else "the inventory"
            raise BadInputError(f"no host of {scope} matches --limit {limit}",
                                "check the pattern against the inventory's hosts and groups "
                                f"(`ansible-inventory -i {inventory if isinstance(inventory, Path) else 'INVENTORY'} "
                                "--graph`)") from None
        raise
    answered = [name for name, h in facts.hosts.items() if h.status == "ok"]
    peers: dict[str, dict[str, Any]] = {}
    if group is not None:
        # The group's hosts within --limit: those the node-facts run reached or tried to.
        in_scope = [m for m in members if m.name in facts.hosts]
        peers = build_peers(in_scope, {name: h.node for name, h in facts.hosts.items()})
    run: PlaybookRun | None = None
    if answered:
        extravars: dict[str, Any] = {"npuops_doctor_level": level}
        if npuops_command:
            extravars["npuops_command"] = npuops_command
        if ascend_root is not None:
            extravars["npuops_ascend_root"] = str(ascend_root)
        if doctor_timeout_s is not None:
            extravars["npuops_doctor_timeout_s"] = max(1, int(doctor_timeout_s))
        if peers:
            extravars["npuops_doctor_peers_by_host"] = {name: peers[name] for name in answered if name in peers}
        run = run_playbook(FLEET_DOCTOR_PLAYBOOK, inventory=inventory, artifacts_dir=artifacts_dir,
                           limit=_names_limit(answered), extravars=extravars, forks=forks, on_event=on_event,
                           ansible_playbook=ansible_playbook)
    return fleet_doctor_report(facts, run, level=level, group=group, peers=peers or None, order=order)

