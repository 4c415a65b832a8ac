"""A host's part of a multi-node instance, as its record keeps it and other hosts read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npuops.wire import WireObject

STRATEGY_RAY = "ray"
STRATEGY_DP = "dp"
_MEMBERSHIP = "cluster membership"


@dataclass(frozen=True)
class ClusterNode:
    """One host of a multi-node instance: its inventory name, the address the cluster traffic uses, its role, the
    interface that address is on and its NPU NIC addresses by device id (the inventory's, what `npuops provision
    --tags npu-network` sets; empty when it gives none). Each host's start gate checks its peers with them."""

    name: str
    address: str
    role: str = ""
    ifname: str = ""
    npu_ips: Mapping[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "address": self.address, "role": self.role}
        if self.ifname:
            data["ifname"] = self.ifname
        if self.npu_ips:
            data["npu_ips"] = {str(device): ip for device, ip in sorted(self.npu_ips.items())}
        return data

    @classmethod
    def from_json(cls, data: object) -> ClusterNode:
        node = WireObject.wrap(data, _MEMBERSHIP)
        ips = node.text_map("npu_ips")
        if not all(device.isdigit() for device in ips):
            raise node.fail("npu_ips", "has a key that is not a device id (0, 1, ...)")
        return cls(node.req_text("name"), node.req_text("address"), node.text("role"), node.text("ifname"),
                   {int(device): ip for device, ip in ips.items()})


@dataclass(frozen=True)
class ClusterMembership:
    """This host's part of a multi-node instance (npuops.launch.multinode renders one per host): the group, the
    strategy, this host's rank and role, every host of the group, and under Ray where its cluster is."""

    group: str
    strategy: str  # "ray" or "dp"
    rank: int
    role: str  # head | worker (ray); leader | follower (dp)
    nodes: tuple[ClusterNode, ...]
    endpoint_host: str  # the host that serves the API (the first)
    expected_nodes: int = 0
    # Ray only: the host's Ray node unit, the head's address, the `ray` executable the units run, the resources each
    # node advertises, the authentication ("token" or "none") and the 0600 file that holds the token.
    ray_unit: str | None = None
    ray_address: str | None = None
    ray_command: tuple[str, ...] = ()
    ray_resources: Mapping[str, float] = field(default_factory=dict)
    ray_auth: str | None = None
    ray_env_file: str | None = None

    @property
    def is_ray(self) -> bool:
        return self.strategy == STRATEGY_RAY

    def to_json(self) -> dict[str, Any]:
        """The record's `cluster` object; the Ray keys only under Ray."""
        data: dict[str, Any] = {"group": self.group, "strategy": self.strategy,
                                "nodes": [n.to_json() for n in self.nodes], "expected_nodes": self.expected_nodes,
                                "endpoint_host": self.endpoint_host}
        if self.is_ray:
            data.update(ray_unit=self.ray_unit, ray_address=self.ray_address, ray_command=list(self.ray_command),
                        ray_resources=dict(self.ray_resources), ray_auth=self.ray_auth, ray_env_file=self.ray_env_file)
        data.update(rank=self.rank, role=self.role)
        return data

    @classmethod
    def from_json(cls, data: object) -> ClusterMembership:
        """A record's `cluster` object; only the strategy is required (the keys an older npuops did not write, such
        as the Ray authentication, take their defaults)."""
        cluster = WireObject.wrap(data, _MEMBERSHIP)
        nodes = tuple(ClusterNode.from_json(n) for n in cluster.objects("nodes"))
        return cls(
            group=cluster.text("group"), strategy=cluster.req_text("strategy"), rank=cluster.integer("rank"),
            role=cluster.text("role"), nodes=nodes, endpoint_host=cluster.text("endpoint_host"),
            expected_nodes=cluster.integer("expected_nodes", len(nodes)),
            ray_unit=cluster.opt_text("ray_unit"), ray_address=cluster.opt_text("ray_address"),
            ray_command=cluster.texts("ray_command"), ray_resources=cluster.number_map("ray_resources"),
            ray_auth=cluster.opt_text("ray_auth"), ray_env_file=cluster.opt_text("ray_env_file"),
        )
