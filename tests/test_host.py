from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections import namedtuple
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuops.hardware.host import (
    NetInterface,
    interfaces_from_psutil,
    parse_cpu_list,
    parse_cpu_model,
    parse_meminfo,
    parse_os_release,
    read_host_facts,
    read_net_interfaces,
)
from npuops.hardware.probe import Probe
from npuops.parsing import ParseError
from npuops.settings import Settings
from tests.support.host_tree import put


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3", (0, 1, 2, 3)), ("0-1,4,6-7\n", (0, 1, 4, 6, 7)), ("5", (5,)), ("", ()), ("0-191", tuple(range(192)))],
)
def test_parse_cpu_list(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("bad", ["a-b", "3-1", "1,,2", "0-"])
def test_parse_cpu_list_rejects_garbage_with_parse_error(bad: str) -> None:
    with pytest.raises(ParseError):
        parse_cpu_list(bad)


@given(st.text(max_size=40))
def test_parse_cpu_list_only_raises_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse_cpu_list(text)


def test_parse_meminfo_in_bytes() -> None:
    info = parse_meminfo("MemTotal:       24576000 kB\nMemAvailable:   1000 kB\nHugePages_Total:       0\n")
    assert info["MemTotal"] == 24576000 * 1024
    assert info["HugePages_Total"] == 0


def test_parse_os_release() -> None:
    data = parse_os_release('NAME="openEuler"\nVERSION_ID="22.03"\nID="openEuler"\n')
    assert data["ID"] == "openEuler" and data["VERSION_ID"] == "22.03"


def test_cpu_model_x86_and_kunpeng() -> None:
    assert parse_cpu_model("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Gold 6248\n") == "Intel(R) Xeon(R) Gold 6248"
    kunpeng = "processor\t: 0\nBogoMIPS\t: 200.00\nCPU implementer\t: 0x48\nCPU part\t: 0xd01\n"
    assert parse_cpu_model(kunpeng) == "HiSilicon Kunpeng-920"
    assert parse_cpu_model("") is None


def test_read_host_facts_from_a_prepared_tree(fake_root: Path) -> None:
    put(fake_root, "/proc/cpuinfo", "processor\t: 0\nCPU implementer\t: 0x48\nCPU part\t: 0xd01\n" * 4)
    put(fake_root, "/sys/devices/system/cpu/online", "0-191\n")
    put(fake_root, "/sys/devices/system/node/node0/cpulist", "0-95\n")
    put(fake_root, "/sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:       1000 kB\n")
    put(fake_root, "/sys/devices/system/node/node1/cpulist", "96-191\n")
    put(fake_root, "/proc/self/status", "Name:\tpython\nCpus_allowed_list:\t0-23\n")
    put(fake_root, "/proc/meminfo", "MemTotal: 1048576 kB\nMemAvailable: 524288 kB\n")
    put(fake_root, "/etc/os-release", 'ID="openEuler"\nVERSION_ID="22.03"\n')
    put(fake_root, "/proc/sys/kernel/osrelease", "5.10.0-60.18.0.50.oe2203.aarch64\n")
    for n in range(8):
        put(fake_root, f"/dev/davinci{n}", "")
    put(fake_root, "/dev/davinci_manager", "")
    put(fake_root, "/dev/hisi_hdc", "")
    put(fake_root, "/sys/bus/pci/devices/0000:c1:00.0/vendor", "0x19e5\n")
    put(fake_root, "/sys/bus/pci/devices/0000:c1:00.0/device", "0xd802\n")
    # A Huawei NIC (same vendor, not an NPU) and an Intel device: neither is an NPU.
    put(fake_root, "/sys/bus/pci/devices/0000:7d:00.0/vendor", "0x19e5\n")
    put(fake_root, "/sys/bus/pci/devices/0000:7d:00.0/device", "0xa222\n")
    put(fake_root, "/sys/bus/pci/devices/0000:00:01.0/vendor", "0x8086\n")
    put(fake_root, "/sys/bus/pci/devices/0000:00:01.0/device", "0xd802\n")

    facts = read_host_facts(Probe(Settings(root=fake_root), machine=lambda: "aarch64"))
    assert facts.cpu_model == "HiSilicon Kunpeng-920"
    assert facts.cpu_count == 192
    assert [n.node_id for n in facts.numa_nodes] == [0, 1]
    assert facts.numa_nodes[1].cpus == tuple(range(96, 192))
    assert facts.numa_nodes[0].memory_bytes == 1000 * 1024
    assert facts.allowed_cpus == tuple(range(24))
    assert facts.memory_total_bytes == 1048576 * 1024
    assert (facts.os_name, facts.os_version, facts.arch) == ("openEuler", "22.03", "aarch64")
    assert facts.davinci_chips == tuple(range(8))
    assert facts.missing_control_nodes == ("devmm_svm",)
    assert [p.address for p in facts.npu_pci_devices] == ["0000:c1:00.0"]


def test_read_host_facts_on_this_machine() -> None:
    facts = read_host_facts(Probe(Settings()))
    assert facts.cpu_count >= 1
    assert facts.allowed_cpus and set(facts.allowed_cpus) <= set(range(4096))
    assert len(facts.allowed_cpus) == len(os.sched_getaffinity(0))
    assert facts.memory_total_bytes and facts.memory_total_bytes > 0
    assert facts.shm_total_bytes is not None


# The shapes psutil.net_if_addrs() / net_if_stats() return (psutil._common.snicaddr / snicstats; `flags` since 5.9.3).
Addr = namedtuple("Addr", "family address netmask broadcast ptp")
Stats = namedtuple("Stats", "isup duplex speed mtu flags")
OldStats = namedtuple("OldStats", "isup duplex speed mtu")
AF_PACKET = getattr(socket, "AF_PACKET", 17)


def test_interfaces_from_psutil_structures() -> None:
    addrs = {
        "lo": [Addr(socket.AF_INET, "127.0.0.1", "255.0.0.0", None, None)],
        "enp189s0f0": [Addr(socket.AF_INET, "10.213.0.11", "255.255.255.0", "10.213.0.255", None),
                       Addr(socket.AF_INET6, "fe80::1%enp189s0f0", "ffff:ffff:ffff:ffff::", None, None),
                       Addr(AF_PACKET, "00:11:22:33:44:55", None, "ff:ff:ff:ff:ff:ff", None),
                       Addr(socket.AF_INET, "192.168.7.3", "255.255.0.0", None, None)],
        "bond1": [Addr(socket.AF_INET, "172.16.0.5", None, None, None)],
        "docker0": [Addr(socket.AF_INET, "172.17.0.1", "255.255.0.0", None, None)],
    }
    stats = {
        "lo": Stats(True, 0, 0, 65536, "up,loopback,running"),
        "enp189s0f0": Stats(True, 2, 100000, 1500, "up,broadcast,running,multicast"),
        "docker0": Stats(False, 0, 0, 1500, "broadcast,multicast"),
        "ib0": Stats(True, 2, 200000, 2044, "up,running"),  # stats but no address
    }
    assert interfaces_from_psutil(addrs, stats) == (
        NetInterface("bond1", ("172.16.0.5",), False),  # no netmask: the bare address; no stats: down
        NetInterface("docker0", ("172.17.0.1/16",), False),
        NetInterface("enp189s0f0", ("10.213.0.11/24", "192.168.7.3/16"), True),
        NetInterface("ib0", (), True),
    )


def test_interfaces_loopback_is_left_out_without_the_flags_field() -> None:
    """psutil before 5.9.3 has no `flags`: loopback is known by its name or its 127.0.0.0/8-only addresses."""
    addrs = {"lo": [], "lo0": [Addr(socket.AF_INET, "127.0.0.2", "255.0.0.0", None, None)],
             "eth0": [Addr(socket.AF_INET, "10.0.0.2", "255.255.255.0", None, None)]}
    stats = {"lo": OldStats(True, 0, 0, 65536), "lo0": OldStats(True, 0, 0, 65536), "eth0": OldStats(True, 2, 0, 1500)}
    assert interfaces_from_psutil(addrs, stats) == (NetInterface("eth0", ("10.0.0.2/24",), True),)


def test_interfaces_on_this_machine() -> None:
    import psutil

    interfaces = read_net_interfaces()
    assert {i.name for i in interfaces} <= set(psutil.net_if_addrs()) | set(psutil.net_if_stats())
    assert "lo" not in {i.name for i in interfaces}
    for interface in interfaces:
        for address in interface.ipv4:
            assert not ipaddress.IPv4Interface(address).ip.is_loopback
