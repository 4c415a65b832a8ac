"""The NPU parameter-plane network of a fleet from its inventory (npuops.fleet.npu_network): the addresses each host
gives or derives, and every rule that refuses a plan before any host is touched."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from npuops.errors import BadInputError
from npuops.fleet.npu_network import (
    HostNpuNetwork,
    NpuPort,
    derive_addresses,
    fleet_npu_network,
    host_npu_network,
    npu_ips_of,
)

A2 = {"npuops_npu_ip_base": "10.20.0.2", "npuops_npu_netmask": "255.255.255.0", "npuops_npu_gateways": "10.20.0.1"}


def _refused(hostvars: dict[str, Any], *words: str) -> BadInputError:
    with pytest.raises(BadInputError) as refused:
        host_npu_network("h1", hostvars)
    text = refused.value.one_line()
    assert "h1" in text and all(word in text for word in words), text
    assert "\n" not in text
    return refused.value


def test_a_host_that_gives_no_addresses_has_no_network() -> None:
    assert host_npu_network("h1", {"ansible_host": "10.0.0.5"}) is None
    assert npu_ips_of("h1", {}) is None


def test_an_a2_base_numbers_the_eight_ports_in_one_subnet() -> None:
    network = host_npu_network("h1", A2)
    assert network is not None and network.family == "A2"
    assert [p.address for p in network.ports] == [f"10.20.0.{i}" for i in range(2, 10)]
    assert {(p.netmask, p.gateway, p.detect) for p in network.ports} == {("255.255.255.0", "10.20.0.1", "10.20.0.1")}
    assert npu_ips_of("h1", A2) == {i: f"10.20.0.{i + 2}" for i in range(8)}


def test_the_910a_base_follows_ascend_deployers_smp_rule() -> None:
    # ascend-deployer's README (offline-deploy, mode=SMP): one address on 8 NPUs gives these, NPU i with NPU i+4.
    derived = derive_addresses("A1", ipaddress.IPv4Address("10.0.0.1"), 8)
    assert [str(a) for a in derived] == ["10.0.0.1", "10.0.1.1", "10.0.2.1", "10.0.3.1",
                                         "10.0.0.2", "10.0.1.2", "10.0.2.2", "10.0.3.2"]
    network = host_npu_network("h1", {"npuops_npu_family": "A1", "npuops_npu_ip_base": "10.0.0.1",
                                      "npuops_npu_netmask": "255.255.255.0", "npuops_npu_detect_ips": "10.0.0.254"})
    assert network is not None and network.ports[4].detect == "10.0.0.254"


def test_an_a3_base_puts_the_two_dies_of_one_npu_in_different_subnets() -> None:
    network = host_npu_network("h1", {"npuops_npu_ip_base": "10.30.0.2", "npuops_npu_count": 16,
                                      "npuops_npu_netmask": "255.255.255.0",
                                      "npuops_npu_gateways": ["10.30.0.1", "10.30.1.1"]})
    assert network is not None and network.family == "A3" and len(network.ports) == 16
    assert [p.address for p in network.ports[:4]] == ["10.30.0.2", "10.30.1.2", "10.30.0.3", "10.30.1.3"]
    # Each port takes the gateway of its own subnet.
    assert [p.gateway for p in network.ports[:2]] == ["10.30.0.1", "10.30.1.1"]


def test_ascend_deployers_hccn_variables_are_read_as_they_are() -> None:
    deployer = {"deviceip": ",".join(f"10.20.0.{i}" for i in range(2, 10)),
                "detectip": ",".join(["10.20.0.1"] * 8), "netmask": "255.255.255.0", "gateways": "10.20.0.1"}
    network = host_npu_network("h1", deployer)
    assert network is not None and network == host_npu_network("h1", A2)
    # Without deviceip, a plain `netmask` variable means nothing to npuops.
    assert host_npu_network("h1", {"netmask": "255.255.255.0"}) is None


def test_explicit_addresses_and_detect_per_port() -> None:
    ips = [f"10.20.0.{i}" for i in range(2, 10)]
    detect = [f"10.20.0.{i}" for i in range(100, 108)]
    network = host_npu_network("h1", {"npuops_npu_ips": ips, "npuops_npu_netmask": "255.255.255.0",
                                      "npuops_npu_detect_ips": detect})
    assert network is not None
    assert [(p.address, p.detect, p.gateway) for p in network.ports] == [(a, d, None)
                                                                          for a, d in zip(ips, detect, strict=True)]


@pytest.mark.parametrize(("hostvars", "words"), [
    ({**A2, "npuops_npu_netmask": "255.255.255.252"}, ["device 1", "broadcast"]),
    ({**A2, "npuops_npu_ip_base": "10.20.0.0"}, ["device 0 would get 10.20.0.0"]),
    ({**A2, "npuops_npu_ip_base": "10.20.0.250"}, ["device 5 would get 10.20.0.255"]),
    ({"npuops_npu_ips": ["10.20.0.0"], "npuops_npu_netmask": "255.255.255.0", "npuops_npu_detect_ips": "10.20.0.1"},
     ["device 0", "network address"]),
    ({**A2, "npuops_npu_gateways": "10.99.0.1"}, ["device 0", "none of the gateways"]),
    ({**A2, "npuops_npu_netmask": "255.255.0.255"}, ["not a netmask"]),
    ({**A2, "npuops_npu_netmask": None}, ["npuops_npu_netmask"]),
    ({**A2, "npuops_npu_ip_base": "10.20.0.300"}, ["not an IPv4 address"]),
    ({**A2, "npuops_npu_ips": ["10.20.0.2"]}, ["both"]),
    ({"npuops_npu_ip_base": "10.20.0.2", "npuops_npu_netmask": "255.255.255.0"}, ["no detect address"]),
    ({**A2, "npuops_npu_family": "910X"}, ["not a chip family", "A1"]),
    ({**A2, "npuops_npu_count": 12}, ["12 NPU port", "A2"]),
    ({**A2, "npuops_npu_detect_ips": ["10.20.0.1", "10.20.0.1"]}, ["2 addresses for 8"]),
    ({**A2, "npuops_npu_detect_ips": "10.20.0.2"}, ["device 0", "its own detect address"]),
    ({"npuops_npu_ips": ["10.20.0.2", "10.20.1.2"], "npuops_npu_netmask": "255.255.255.0",
      "npuops_npu_detect_ips": "10.20.0.1"}, ["span subnets", "one"]),
    ({"npuops_npu_family": "A1", "npuops_npu_ips": [f"10.0.{i}.2" for i in range(8)],
      "npuops_npu_netmask": "255.255.255.0", "npuops_npu_detect_ips": "10.9.0.1"}, ["devices 0 and 4"]),
    ({"npuops_npu_family": "A3", "npuops_npu_ips": [f"10.30.0.{i}" for i in range(2, 18)],
      "npuops_npu_netmask": "255.255.255.0", "npuops_npu_detect_ips": "10.30.0.1"}, ["dies 0 and 1"]),
])
def test_a_plan_that_breaks_a_rule_is_refused_naming_the_host_and_the_fix(hostvars: dict[str, Any],
                                                                          words: list[str]) -> None:
    refused = _refused(hostvars, *words)
    assert refused.fix


def test_no_address_twice_across_the_fleet() -> None:
    with pytest.raises(BadInputError) as refused:
        fleet_npu_network([("h1", A2), ("h2", {**A2, "npuops_npu_ip_base": "10.20.0.9"})])
    assert "10.20.0.9" in refused.value.problem and "h1 device 7" in refused.value.problem
    assert "h2 device 0" in refused.value.problem
    networks = fleet_npu_network([("h1", A2), ("h2", {**A2, "npuops_npu_ip_base": "10.20.0.10"}), ("h3", {})])
    assert sorted(networks) == ["h1", "h2"]


def test_910a_servers_keep_each_device_in_one_subnet_across_the_cluster() -> None:
    a1 = {"npuops_npu_family": "A1", "npuops_npu_netmask": "255.255.255.0", "npuops_npu_detect_ips": "10.9.0.1"}
    fleet_npu_network([("h1", {**a1, "npuops_npu_ip_base": "10.0.0.1"}),
                       ("h2", {**a1, "npuops_npu_ip_base": "10.0.0.3"})])
    with pytest.raises(BadInputError, match=r"device 0 is in 10\.0\.0\.0/24 on h1 but in 10\.0\.4\.0/24 on h2"):
        fleet_npu_network([("h1", {**a1, "npuops_npu_ip_base": "10.0.0.1"}),
                           ("h2", {**a1, "npuops_npu_ip_base": "10.0.4.1"})])


def test_a_port_travels_as_json() -> None:
    port = NpuPort(3, "10.20.0.5", "255.255.255.0", None, "10.20.0.1")
    assert NpuPort.from_json(port.to_json()) == port
    assert HostNpuNetwork("h1", "A2", (port,)).addresses() == {3: "10.20.0.5"}
