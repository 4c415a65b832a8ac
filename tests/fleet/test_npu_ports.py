"""Setting and verifying a host's NPU ports (npuops.fleet.npu_ports) against the stateful hccn_tool stand-in
(tests/support/hccn_standin.py), run as a program exactly as the role's module runs the real one; and the pure
decisions on recorded outputs."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from npuops.fleet.npu_network import NpuPort, host_npu_network
from npuops.fleet.npu_ports import (
    Call,
    PortSetting,
    Waiting,
    configure_ports,
    port_setting,
    set_calls,
)
from npuops.fleet.progress import diff_lines
from npuops.provision.text import npu_network_lines
from tests.support.captures import capture
from tests.support.hccn_standin import install_hccn_standin, set_knobs

NETWORK = host_npu_network("h1", {"npuops_npu_ip_base": "10.20.0.2", "npuops_npu_netmask": "255.255.255.0",
                                  "npuops_npu_gateways": "10.20.0.1"})
assert NETWORK is not None
PORTS = list(NETWORK.ports)


class Host:
    """The stand-in hccn_tool in a directory of its own, and the calls npuops made of it."""

    def __init__(self, root: Path, devices: int = 8, down: tuple[int, ...] = ()) -> None:
        self.conf = root / "etc/hccn.conf"
        self.tool = install_hccn_standin(root / "bin/hccn_tool", str(self.conf), devices=devices, down=down)
        self.sleeps: list[float] = []
        self.now = 0.0

    def run_calls(self, calls: Sequence[Sequence[str]]) -> list[Call]:
        out = []
        for args in calls:
            done = subprocess.run([str(self.tool), *args], capture_output=True, text=True, check=False)
            out.append((done.returncode, done.stdout, done.stderr))
        return out

    def calls(self) -> list[str]:
        return self.conf.with_name("hccn.conf.calls").read_text().splitlines()

    def sets(self) -> list[str]:
        return [c for c in self.calls() if " -s " in f" {c} "]

    def waiting(self, timeout_s: float = 6.0) -> Waiting:
        def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)
            self.now += seconds

        return Waiting(timeout_s=timeout_s, poll_s=2.0, sleep=sleep, clock=lambda: self.now)


def test_a_fresh_host_gets_every_port_then_a_rerun_sets_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path)
    first = configure_ports(PORTS, host.run_calls, waiting=host.waiting())
    assert first.ok and first.changed, first.message()
    assert [p.before for p in first.ports] == [PortSetting()] * 8
    assert [p.after for p in first.ports] == [PortSetting.wanted(p) for p in PORTS]
    # ip first (hccn_tool refuses a gateway outside the port's subnet), then the gateway, then the detect address.
    assert host.sets()[:3] == ["-i 0 -ip -s address 10.20.0.2 netmask 255.255.255.0",
                               "-i 0 -gateway -s gateway 10.20.0.1", "-i 0 -netdetect -s address 10.20.0.1"]
    assert len(host.sets()) == 24
    assert all(p.link == "UP" and p.health == "Success" and p.reaches_detect for p in first.ports)
    # hccn_tool keeps what was set in /etc/hccn.conf, as the real one does (tests/fixtures/ascend/hccn.conf_...).
    assert host.conf.read_text().splitlines()[:4] == ["address_0=10.20.0.2", "netmask_0=255.255.255.0",
                                                      "netdetect_0=10.20.0.1", "gateway_0=10.20.0.1"]
    again = configure_ports(PORTS, host.run_calls, waiting=host.waiting())
    assert again.ok and not again.changed and len(host.sets()) == 24
    assert again.to_json()["changed"] == 0 and host.sleeps == []


def test_a_changed_address_changes_that_port_only(tmp_path: Path) -> None:
    host = Host(tmp_path)
    configure_ports(PORTS, host.run_calls, waiting=host.waiting())
    moved = [*PORTS[:3], NpuPort(3, "10.20.0.40", "255.255.255.0", "10.20.0.1", "10.20.0.1"), *PORTS[4:]]
    report = configure_ports(moved, host.run_calls, waiting=host.waiting())
    assert report.ok and [p.device for p in report.ports if p.changed] == [3]
    # A new address re-sets the gateway: hccn_tool ties the gateway to the address's subnet.
    assert host.sets()[24:] == ["-i 3 -ip -s address 10.20.0.40 netmask 255.255.255.0",
                                "-i 3 -gateway -s gateway 10.20.0.1"]
    assert report.ports[3].before.address == "10.20.0.5" and report.ports[3].after.address == "10.20.0.40"
    diff = list(diff_lines([report.diff()]))
    assert "-address_3=10.20.0.5" in diff and "+address_3=10.20.0.40" in diff
    assert diff[0] == "--- /etc/hccn.conf"


def test_check_mode_reads_and_says_what_would_change_without_setting(tmp_path: Path) -> None:
    host = Host(tmp_path)
    report = configure_ports(PORTS, host.run_calls, check=True, waiting=host.waiting())
    assert report.ok and report.check and report.changed and host.sets() == []
    assert not host.conf.exists()
    assert report.ports[0].after == PortSetting.wanted(PORTS[0]) and report.ports[0].before == PortSetting()
    lines = npu_network_lines("h1", report.to_json())
    assert lines[0] == "h1: NPU 0 would set none -> 10.20.0.2/255.255.255.0 gw 10.20.0.1 detect 10.20.0.1"
    assert len(lines) == 8


def test_a_port_that_stays_down_fails_with_its_npu_named_after_waiting(tmp_path: Path) -> None:
    host = Host(tmp_path, down=(5,))
    report = configure_ports(PORTS, host.run_calls, waiting=host.waiting(timeout_s=6))
    assert not report.ok and [p.device for p in report.failed_ports] == [5]
    assert report.ports[5].link == "DOWN" and report.ports[5].health == "Fault"
    assert "NPU 5: link DOWN" in report.message() and "-link_stat" in report.message()
    # It waited (bounded) for the port to come up before judging it.
    assert host.sleeps == [2.0, 2.0, 2.0]
    # The other ports were set and verified.
    assert all(p.problem is None for p in report.ports if p.device != 5)
    # Its link comes back: the next run changes nothing and passes.
    set_knobs(str(host.conf), devices=8)
    assert configure_ports(PORTS, host.run_calls, waiting=host.waiting()).ok


def test_an_npu_the_host_does_not_have_fails_before_anything_is_set(tmp_path: Path) -> None:
    host = Host(tmp_path, devices=4)
    report = configure_ports(PORTS, host.run_calls, waiting=host.waiting())
    assert not report.ok and report.problem and "The device is not exist!" in report.problem
    assert host.sets() == [] and "npu-smi info" in (report.fix or "")


def test_a_value_hccn_tool_refuses_fails_the_host_with_its_message(tmp_path: Path) -> None:
    host = Host(tmp_path)
    # A gateway outside the port's subnet (npuops' own check refuses this earlier; hccn_tool would too).
    wrong = [NpuPort(0, "10.20.0.2", "255.255.255.0", "10.99.0.1", "10.20.0.1")]
    report = configure_ports(wrong, host.run_calls, waiting=host.waiting())
    assert not report.ok and "doesn't match that of the configured ip adress" in (report.problem or "")


# --- the pure decisions, on recorded outputs ---------------------------------------------------------------------


def _ok(text: str) -> Call:
    return (0, text, "")


def test_a_port_is_read_from_the_recorded_answers() -> None:
    ip = capture("hccn_tool-ip_910b_1.txt")
    detect = capture("hccn_tool-netdetect_910b3_1.txt").splitlines()[0] + "\n"
    gateway = capture("hccn_tool-gateway_910b3_1.txt").splitlines()[0] + "\n"
    setting = port_setting(0, [_ok(ip), _ok(detect), _ok(gateway)])
    assert setting == PortSetting("29.1.112.213", "255.255.0.0", "11.12.165.1", "11.12.165.1")


def test_values_never_set_read_as_none() -> None:
    not_preset = [(1, "", "Get ipconf failed, because no ip was preset there!\n"), _ok("netdetect addr: 0.0.0.0\n"),
                  (1, "", "Get gateway failed, because no gateway was preset there!\n")]
    assert port_setting(2, not_preset) == PortSetting()


@pytest.mark.parametrize(("now", "calls"), [
    (PortSetting("10.20.0.2", "255.255.255.0", "10.20.0.1", "10.20.0.1"), []),
    (PortSetting("10.20.0.2", "255.255.0.0", "10.20.0.1", "10.20.0.1"),
     [("-i", "0", "-ip", "-s", "address", "10.20.0.2", "netmask", "255.255.255.0"),
      ("-i", "0", "-gateway", "-s", "gateway", "10.20.0.1")]),
    (PortSetting("10.20.0.2", "255.255.255.0", None, "10.20.0.9"),
     [("-i", "0", "-gateway", "-s", "gateway", "10.20.0.1"), ("-i", "0", "-netdetect", "-s", "address", "10.20.0.1")]),
])
def test_only_what_differs_is_set(now: PortSetting, calls: list[tuple[str, ...]]) -> None:
    assert set_calls(0, now, PortSetting.wanted(PORTS[0])) == calls


def test_a_gateway_the_inventory_does_not_give_is_left_alone() -> None:
    want = PortSetting("10.20.0.2", "255.255.255.0", None, "10.20.0.1")
    assert set_calls(0, PortSetting("10.20.0.2", "255.255.255.0", "10.20.0.254", "10.20.0.1"), want) == []
