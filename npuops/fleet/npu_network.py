"""The NPU parameter-plane network of a fleet, from its inventory: every NPU port's address, netmask, gateway and
detect address, validated with the chip family's rules before any host is touched.

A fresh Atlas cluster cannot run a multi-node job until each NPU's own RoCE port has an address (vllm-ascend's
multi-node tutorial, docs/source/tutorials/features/ray.md, checks them with hccn_tool first). The inventory is the
one source of these addresses: the provisioning role `npu_network` sets them (`npuops provision --tags npu-network`),
and the fleet doctor's network checks and a multi-node launch read the same plan (`npu_ips_of`), so what is set and
what is probed are the same addresses.

Per host (or group), either every port's address or one base address and a rule:

    npuops_npu_ips: [10.20.0.2, 10.20.0.3, ...]     # device 0, 1, ... (a list, or "a,b,c" as ascend-deployer has it)
    npuops_npu_ip_base: 10.20.0.2                   # or: the family's rule derives the rest (npuops_npu_count)
    npuops_npu_netmask: 255.255.255.0               # required
    npuops_npu_gateways: [10.20.0.1]                # optional; each port takes the one inside its subnet
    npuops_npu_detect_ips: 10.20.0.1                # one for all, or one per port; default: the port's gateway
    npuops_npu_family: A2                           # A1 (910A servers), A2 (910B), A3 (two dies per NPU)

The variables of ascend-deployer's `[hccn]` section (`deviceip`, `detectip`, `netmask`, `gateways`; MindCluster
Ascend Deployer user guide, "使用MindCluster Ascend Deployer配置") are read the same way: its inventory works as is.

The families' rules (MindCluster Ascend Deployer user guide, the "配置策略说明" table; HDK A3 HCCN reference):
- A2 (Atlas 800T/800I A2, Atlas 900 A2 PoD): the 8 NPU ports of a node in one subnet ("每台训练节点的8个NPU网口IP
  地址使用同一网段"); the base rule numbers them consecutively.
- A1 (Atlas 800 9000/9010, 910A): 8 ports in 4 subnets, NPU i with NPU i+4 ("NPU0和NPU4为同一网段, 同理NPU1和NPU5
  ..."), ports 0-3 in different subnets, and the same position on every server in one subnet; the base rule is
  ascend-deployer's SMP rule (10.0.0.1 -> 10.0.0.1, 10.0.1.1, 10.0.2.1, 10.0.3.1, 10.0.0.2, 10.0.1.2, ...).
- A3 (Atlas 800T/800I A3, 900 A3 SuperPoD): one port per die, `hccn_tool -i` 0-15 (0-7 on the 9000 A3 SuperPoD
  cluster system); the two dies of one NPU (2k, 2k+1) in different subnets ("同一个NPU的2个chip需配置成不同网段的IP";
  in one subnet HCCN ping fails). The base rule is npuops' own: die d -> third octet + d % 2, fourth + d // 2.
The gateway must lie in its port's subnet (hccn_tool refuses another: "The segment of configured gateway doesn't
match that of the configured ip adress!"); the detect address is what `-net_health` probes, usually the gateway.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from npuops.errors import BadInputError

FAMILIES = ("A1", "A2", "A3")
# How many ports a node of each family has (the base rule's default count) and may have.
DEFAULT_PORTS = {"A1": 8, "A2": 8, "A3": 16}
ALLOWED_PORTS = {"A1": (8,), "A2": tuple(range(1, 9)), "A3": (8, 16)}

# npuops' variables, and ascend-deployer's [hccn] names for the same things.
IPS, BASE, COUNT, NETMASK, GATEWAYS, DETECT, FAMILY = (
    "npuops_npu_ips", "npuops_npu_ip_base", "npuops_npu_count", "npuops_npu_netmask", "npuops_npu_gateways",
    "npuops_npu_detect_ips", "npuops_npu_family")
DEPLOYER_NAMES = {IPS: "deviceip", DETECT: "detectip", NETMASK: "netmask", GATEWAYS: "gateways"}
FIX = "set the NPU port variables in the inventory (npuops_npu_ips or npuops_npu_ip_base, npuops_npu_netmask, ...)"


@dataclass(frozen=True)
class NpuPort:
    """One NPU port (`hccn_tool -i device`) as the inventory wants it."""

    device: int
    address: str
    netmask: str
    gateway: str | None
    detect: str

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.address}/{self.netmask}", strict=False)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "address": self.address, "netmask": self.netmask, "gateway": self.gateway,
                "detect": self.detect}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NpuPort:
        gateway = data.get("gateway")
        return cls(int(data["device"]), str(data["address"]), str(data["netmask"]),
                   str(gateway) if gateway else None, str(data["detect"]))


@dataclass(frozen=True)
class HostNpuNetwork:
    """The NPU ports of one host."""

    host: str
    family: str
    ports: tuple[NpuPort, ...]

    def addresses(self) -> dict[int, str]:
        return {port.device: port.address for port in self.ports}

    def to_json(self) -> list[dict[str, Any]]:
        return [port.to_json() for port in self.ports]


def _problem(host: str, problem: str, fix: str = FIX) -> BadInputError:
    return BadInputError(f"inventory host {host}: {problem}", fix)


def _ipv4(host: str, value: Any, what: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(str(value).strip())
    except ValueError:
        raise _problem(host, f"{what} {value!r} is not an IPv4 address") from None


def _address_list(host: str, value: Any, what: str) -> list[ipaddress.IPv4Address]:
    """A list, or a comma-separated string as ascend-deployer writes them ("10.0.0.2,10.0.0.3")."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise _problem(host, f"{what} is {type(value).__name__}, not a list of addresses")
    return [_ipv4(host, item, f"{what}[{i}]") for i, item in enumerate(items) if str(item).strip()]


def _netmask(host: str, value: Any) -> str:
    try:
        network = ipaddress.IPv4Network(f"0.0.0.0/{str(value).strip()}")
    except ValueError:
        raise _problem(host, f"netmask {value!r} is not a netmask like 255.255.255.0") from None
    if network.prefixlen < 8 or network.prefixlen > 30:
        raise _problem(host, f"netmask {value} (/{network.prefixlen}) leaves no room for NPU ports in one subnet",
                       "use a netmask between /8 and /30, e.g. 255.255.255.0")
    return str(network.netmask)


def derive_addresses(family: str, base: ipaddress.IPv4Address, count: int) -> list[ipaddress.IPv4Address]:
    """The ports' addresses from one base address by the family's rule (see the module's docstring). Pure; an
    address past x.x.x.254 or x.x.255.x raises ValueError."""
    a, b, c, d = base.packed
    out = []
    for device in range(count):
        if family == "A2":
            octets = [a, b, c, d + device]
        elif family == "A1":
            octets = [a, b, c + device % 4, d + device // 4]
        else:
            octets = [a, b, c + device % 2, d + device // 2]
        if any(o > 255 for o in octets) or octets[3] in (0, 255):
            raise ValueError(f"device {device} would get {'.'.join(map(str, octets))}")
        out.append(ipaddress.IPv4Address(bytes(octets)))
    return out


def _variable(hostvars: Mapping[str, Any], name: str) -> Any:
    value = hostvars.get(name)
    if value in (None, "") and name in DEPLOYER_NAMES and hostvars.get("deviceip") not in (None, ""):
        value = hostvars.get(DEPLOYER_NAMES[name])
    return None if value in (None, "") else value


def _family(host: str, hostvars: Mapping[str, Any], count: int | None) -> str:
    given = _variable(hostvars, FAMILY)
    if given is None:
        return "A3" if count == 16 else "A2"
    family = str(given).strip().upper()
    if family not in FAMILIES:
        raise _problem(host, f"{FAMILY} {given!r} is not a chip family",
                       f"use one of {', '.join(FAMILIES)} (A1 910A servers, A2 910B, A3 two dies per NPU)")
    return family


def _addresses(host: str, hostvars: Mapping[str, Any]) -> tuple[str, list[ipaddress.IPv4Address]]:
    ips, base = _variable(hostvars, IPS), _variable(hostvars, BASE)
    if ips is not None and base is not None:
        raise _problem(host, f"both {IPS} and {BASE} are set", f"keep one of {IPS} and {BASE}")
    if ips is not None:
        addresses = _address_list(host, ips, IPS)
        return _family(host, hostvars, len(addresses)), addresses
    raw_count = _variable(hostvars, COUNT)
    family = _family(host, hostvars, None if raw_count is None else _int(host, raw_count))
    count = DEFAULT_PORTS[family] if raw_count is None else _int(host, raw_count)
    try:
        return family, derive_addresses(family, _ipv4(host, base, BASE), count)
    except ValueError as exc:
        raise _problem(host, f"{BASE} {base}: {exc}, which no port can have",
                       f"choose a {BASE} from which the {family} rule gives every port x.x.x.1-254") from None


def _int(host: str, value: Any) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise _problem(host, f"{COUNT} {value!r} is not a number", f"set {COUNT} to the number of NPU ports") from None


def _per_port(host: str, values: list[ipaddress.IPv4Address], count: int, what: str) -> list[ipaddress.IPv4Address]:
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise _problem(host, f"{what} gives {len(values)} addresses for {count} NPU ports",
                       f"give one {what} address for all ports, or one per port")
    return values


def _gateway_for(host: str, device: int, network: ipaddress.IPv4Network,
                 gateways: list[ipaddress.IPv4Address]) -> ipaddress.IPv4Address:
    inside = [g for g in gateways if g in network]
    if len(inside) != 1:
        said = "none of the gateways" if not inside else f"{len(inside)} gateways ({', '.join(map(str, inside))})"
        raise _problem(host, f"device {device} ({network}): {said} in its subnet",
                       "give exactly one gateway inside each NPU port's subnet (hccn_tool refuses a gateway outside "
                       "it), or none")
    return inside[0]


def host_npu_network(host: str, hostvars: Mapping[str, Any]) -> HostNpuNetwork | None:
    """The NPU ports of one host from its inventory variables; None when it gives none. Pure; a value that cannot be
    used raises BadInputError naming the host, the device and the fix."""
    if _variable(hostvars, IPS) is None and _variable(hostvars, BASE) is None:
        return None
    family, addresses = _addresses(host, hostvars)
    if _variable(hostvars, NETMASK) is None:
        raise _problem(host, f"NPU port addresses without {NETMASK}", f"set {NETMASK} (e.g. 255.255.255.0)")
    netmask = _netmask(host, _variable(hostvars, NETMASK))
    raw_gateways, raw_detect = _variable(hostvars, GATEWAYS), _variable(hostvars, DETECT)
    gateways = _address_list(host, raw_gateways, GATEWAYS) if raw_gateways is not None else []
    detects = (_per_port(host, _address_list(host, raw_detect, DETECT), len(addresses), DETECT)
               if raw_detect is not None else None)
    ports = []
    for device, address in enumerate(addresses):
        network = ipaddress.IPv4Network(f"{address}/{netmask}", strict=False)
        _check_inside(host, device, address, network)
        gateway = _gateway_for(host, device, network, gateways) if gateways else None
        detect = detects[device] if detects is not None else gateway
        if detect is None:
            raise _problem(host, f"device {device} has no detect address (and no gateway to default to)",
                           f"set {DETECT} to the address each port probes, usually the switch's gateway address")
        ports.append(NpuPort(device, str(address), netmask, str(gateway) if gateway else None, str(detect)))
    host_network = HostNpuNetwork(host, family, tuple(ports))
    check_host(host_network)
    return host_network


def _check_inside(host: str, device: int, address: ipaddress.IPv4Address, network: ipaddress.IPv4Network) -> None:
    if address in (network.network_address, network.broadcast_address):
        which = "network" if address == network.network_address else "broadcast"
        raise _problem(host, f"device {device} {address}/{network.prefixlen} is the subnet's {which} address, not "
                       "one a port can have", "give every port an address inside its netmask")


def _check_port(host: str, port: NpuPort) -> None:
    address = ipaddress.IPv4Address(port.address)
    network = port.network
    label = f"device {port.device} {port.address}/{network.prefixlen}"
    if address.is_loopback or address.is_multicast or address.is_unspecified or address.is_link_local:
        raise _problem(host, f"{label} is not a unicast address a port can have", "use a private unicast address")
    if port.gateway is not None and port.gateway == port.address:
        raise _problem(host, f"{label} is its own gateway", "the gateway is the switch's address, not the port's")
    if port.detect == port.address:
        raise _problem(host, f"{label} is its own detect address",
                       "the detect address is one the port probes: the gateway, or a peer's NPU port")


def check_host(network: HostNpuNetwork) -> None:
    """The family's rules on one host's ports (see the module's docstring; each address inside its subnet is checked
    as the ports are built). Pure; raises BadInputError."""
    host, family, ports = network.host, network.family, network.ports
    if len(ports) not in ALLOWED_PORTS[family]:
        allowed = ALLOWED_PORTS[family]
        said = f"{allowed[0]}-{allowed[-1]}" if family == "A2" else " or ".join(map(str, allowed))
        raise _problem(host, f"{len(ports)} NPU port addresses for an {family} node, which has {said}",
                       f"give one address per NPU port ({FAMILY} {family}), or set {FAMILY}")
    for port in ports:
        _check_port(host, port)
    subnets = [port.network for port in ports]
    if family == "A2" and len(set(subnets)) > 1:
        raise _problem(host, "the NPU ports of an A2 node span subnets "
                       f"{', '.join(sorted({str(s) for s in subnets}))}", "put every NPU port of an A2 node in one "
                       "subnet (vendor rule: the 8 NPU ports of a node use one network segment)")
    if family == "A1":
        for device in range(4):
            if subnets[device] != subnets[device + 4]:
                raise _problem(host, f"devices {device} and {device + 4} are in different subnets "
                               f"({subnets[device]}, {subnets[device + 4]})", "on 910A servers NPU i and NPU i+4 "
                               "share a subnet, and NPUs 0-3 each have their own (4 subnets)")
        if len(set(subnets[:4])) != 4:
            raise _problem(host, "NPUs 0-3 do not have four different subnets", "on 910A servers NPUs 0, 1, 2 "
                           "and 3 each need their own subnet (NPU i+4 shares NPU i's)")
    if family == "A3":
        for device in range(0, len(ports), 2):
            if subnets[device] == subnets[device + 1]:
                raise _problem(host, f"dies {device} and {device + 1} (one NPU) are both in {subnets[device]}",
                               "give the two dies of one A3 NPU addresses in different subnets (in one subnet "
                               "hccn_tool ping fails)")


def check_fleet(networks: Iterable[HostNpuNetwork]) -> None:
    """Rules across hosts: no address used twice (a port's address, anywhere in the fleet), and on 910A clusters
    the same device of every server in one subnet. Pure; raises BadInputError before any host is touched."""
    seen: dict[str, tuple[str, int]] = {}
    a1_subnets: dict[int, tuple[str, ipaddress.IPv4Network]] = {}
    for network in networks:
        for port in network.ports:
            other = seen.get(port.address)
            if other is not None:
                where = f"{other[0]} device {other[1]}"
                raise BadInputError(f"NPU port address {port.address} is given to {where} and to {network.host} "
                                    f"device {port.device}", "give every NPU port of the fleet its own address")
            seen[port.address] = (network.host, port.device)
            if network.family == "A1":
                first = a1_subnets.setdefault(port.device, (network.host, port.network))
                if first[1] != port.network:
                    raise BadInputError(f"device {port.device} is in {first[1]} on {first[0]} but in {port.network} "
                                        f"on {network.host}", "on 910A clusters NPU i of every server shares "
                                        "one subnet")


def fleet_npu_network(hosts: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, HostNpuNetwork]:
    """Each host's NPU ports (hosts that give none are left out), checked host by host and across the fleet. Pure."""
    networks = {}
    for name, hostvars in hosts:
        network = host_npu_network(name, hostvars)
        if network is not None:
            networks[name] = network
    check_fleet(networks.values())
    return networks


def npu_ips_of(name: str, hostvars: Mapping[str, Any]) -> dict[int, str] | None:
    """The NPU port addresses the inventory gives a host, by device id; None when it gives none (or gives values
    that cannot be used: provisioning refuses those, the network checks then fall back on what the host reads)."""
    try:
        network = host_npu_network(name, hostvars)
    except BadInputError:
        return None
    return network.addresses() if network is not None else None
