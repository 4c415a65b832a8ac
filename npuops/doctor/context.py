"""What checks read: the probe, the settings, the options of this run, and facts computed once."""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.envfile import read_env_file
from npuops.errors import BadInputError
from npuops.hardware.node import Chip, Node, discover_node
from npuops.hardware.probe import Probe
from npuops.instance.record import InstanceRecord
from npuops.settings import Settings


@dataclass(frozen=True)
class PeerHost:
    """Another host of the serving group, as the network preflight sees it."""

    name: str
    address: str  # its host address (IP or name): what Gloo/HCCL's TCP bootstrap connects to
    port: int = 22  # a TCP port that answers on it (its ssh port), to tell "reachable" from "filtered"
    # Its NPU NIC addresses by device id (the `hccn_tool -i <id>` / ASCEND_RT_VISIBLE_DEVICES id).
    npu_ips: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class PeerGroup:
    """The other hosts of a serving group (`npuops doctor --peers`), and the local interface HCCL/Gloo use."""

    peers: tuple[PeerHost, ...]
    ifname: str | None = None  # the local interface (GLOO_SOCKET_IFNAME / HCCL_SOCKET_IFNAME); None: the route's
    # This host's own NPU NIC addresses by device id, as the inventory gives them (what `npuops provision --tags
    # npu-network` sets); empty when the inventory gives none. The hccn-ip check compares them with the NICs'.
    npu_ips: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))


PEERS_EXAMPLE = ('[{"name": "node-b", "address": "10.213.0.12", "port": 22, "npu_ips": {"0": "29.1.112.214"}}]'
                 ' or {"ifname": "eth0", "npu_ips": {"0": "29.1.112.213"}, "peers": [...]}')
_PEER_KEYS = ("name", "address", "port", "npu_ips")
_GROUP_KEYS = ("ifname", "npu_ips", "peers")


def _peers_error(problem: str) -> BadInputError:
    return BadInputError(f"--peers: {problem}", f"pass JSON like {PEERS_EXAMPLE}")


def _unknown_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(k for k in data if k not in allowed)
    if unknown:
        raise _peers_error(f"{where} has unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(allowed)})")


def _peer(raw: Any, index: int) -> PeerHost:
    where = f"peer #{index + 1}"
    if not isinstance(raw, dict):
        raise _peers_error(f"{where} is {type(raw).__name__}, not an object")
    _unknown_keys(raw, _PEER_KEYS, where)
    address = raw.get("address")
    if not isinstance(address, str) or not address.strip() or any(c.isspace() for c in address.strip()):
        raise _peers_error(f"{where} needs \"address\": the host's IP or name as a string")
    address = address.strip()
    name = raw.get("name", address)
    if not isinstance(name, str) or not name.strip():
        raise _peers_error(f"{where} has a \"name\" that is not a non-empty string")
    port = raw.get("port", 22)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise _peers_error(f"{where} ({name}) has \"port\" {port!r}, not a TCP port 1-65535")
    npu_ips = _npu_ips(raw.get("npu_ips", {}), f"{where} ({name})")
    return PeerHost(name=name.strip(), address=address, port=port, npu_ips=npu_ips)


def _npu_ips(raw_ips: Any, where: str) -> Mapping[int, str]:
    if not isinstance(raw_ips, dict):
        raise _peers_error(f"{where} has \"npu_ips\" that is not an object of device id to IP")
    npu_ips: dict[int, str] = {}
    for device, ip in raw_ips.items():
        if not str(device).isdigit():
            raise _peers_error(f"{where} has npu_ips key {device!r}, not a device id like \"0\"")
        if ip is None:
            continue  # that chip has no NIC address (the node model's "nic_ip": null)
        try:
            npu_ips[int(device)] = str(ipaddress.IPv4Address(ip if isinstance(ip, str) else ""))
        except ValueError:
            raise _peers_error(f"{where} has npu_ips[{device!r}] = {ip!r}, not an IPv4 address") from None
    return MappingProxyType(npu_ips)


def parse_peers(text: str) -> PeerGroup:
    """Read `--peers`: a JSON list of peers, or an object {"ifname": ..., "peers": [...]}. Pure; bad input raises
    BadInputError naming the problem."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _peers_error(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    ifname: str | None = None
    own_ips: Mapping[int, str] = MappingProxyType({})
    if isinstance(data, dict):
        _unknown_keys(data, _GROUP_KEYS, "the object")
        own_ips = _npu_ips(data.get("npu_ips", {}), "the object")
        raw_ifname = data.get("ifname")
        if raw_ifname is not None and (not isinstance(raw_ifname, str) or not raw_ifname.strip()):
            raise _peers_error(f"\"ifname\" {raw_ifname!r} is not an interface name")
        ifname = raw_ifname.strip() if raw_ifname else None
        if "peers" not in data:
            raise _peers_error("the object has no \"peers\" list")
        data = data["peers"]
    if not isinstance(data, list):
        raise _peers_error(f"expected a list of peers, got {type(data).__name__}")
    peers = tuple(_peer(raw, i) for i, raw in enumerate(data))
    names = [p.name for p in peers]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise _peers_error(f"peer name(s) {', '.join(map(repr, duplicated))} given more than once")
    return PeerGroup(peers=peers, ifname=ifname, npu_ips=own_ips)


@dataclass(frozen=True)
class DoctorOptions:
    expect_chips: int | None = None
    # The environment file a launch rendered (systemd EnvironmentFile=); None checks npuops' own environment.
    env_file: Path | None = None
    # A model directory whose disk the checks should look at.
    model_dir: Path | None = None
    # Device ids a launch will use; None means all chips.
    devices: tuple[int, ...] | None = None
    gpu_memory_utilization: float = 0.9
    # Whether the service runs with graph mode (not --enforce-eager).
    graph_mode: bool = True
    # Served-model precision: the endpoint, its model name, the reference (a golden file or a model directory for
    # a transformers reference), the API key, and the serving dtype (which picks the bounds).
    endpoint: str | None = None
    served_model: str | None = None
    golden: Path | None = None
    reference_model: Path | None = None
    api_key: str | None = None
    served_dtype: str | None = None
    # The other hosts of a multi-node serving group (`--peers`); None: no network preflight between hosts.
    peers: PeerGroup | None = None
    # The launched instance the start gate is about (its `instance`-tagged checks read it); None in a doctor run.
    instance: InstanceRecord | None = None


class CheckContext:
    """Shared by all checks of one doctor run; expensive facts are computed once, thread-safely."""

    def __init__(self, probe: Probe, options: DoctorOptions | None = None) -> None:
        self.probe = probe
        self.options = options or DoctorOptions()
        self._lock = threading.Lock()
        self._node: Node | None = None
        self._service_env: dict[str, str] | None = None
        self._thresholds: dict[str, Any] | None = None

    @property
    def settings(self) -> Settings:
        return self.probe.settings

    @property
    def node(self) -> Node:
        with self._lock:
            if self._node is None:
                self._node = discover_node(self.probe)
            return self._node

    def service_env(self) -> Mapping[str, str]:
        """The environment the service will run with: the env file when given, else npuops' own."""
        with self._lock:
            if self._service_env is None:
                env_file = self.options.env_file
                if env_file is None:
                    self._service_env = dict(self.settings.environ)
                else:
                    self._service_env = read_env_file(
                        env_file, "pass the env file a launch rendered (e.g. /etc/npuops/NAME/env), or re-render it "
                        "with `npuops launch`")
            return self._service_env

    @property
    def env_source(self) -> str:
        return str(self.options.env_file) if self.options.env_file else "the current environment"

    def threshold(self, name: str) -> Any:
        """A value from npuops/data/doctor_thresholds.toml (thresholds are data, not code)."""
        with self._lock:
            if self._thresholds is None:
                self._thresholds = load_data_toml("doctor_thresholds.toml")
        return self._thresholds[name]

    def selected_chips(self) -> list[Chip]:
        """The chips this run is about: all, or those a launch will use (--devices)."""
        chips = list(self.node.chips)
        if self.options.devices is None:
            return chips
        wanted = set(self.options.devices)
        return [c for c in chips if c.device_id in wanted]
