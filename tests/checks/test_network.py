"""The NPU NIC checks on real `hccn_tool` captures, on a 310P node, without hccn_tool, and on this machine.

States no capture shows (a link DOWN, net health Success or Receive timeout, a NIC without an address) are
derived from a real capture by changing only the value in question.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from npuops.checks.network import (
    HccnIpConfigured,
    HccnLinkUp,
    HccnNetHealthy,
    HostPeerReach,
    NpuPeerPing,
    TcpReach,
    classify_connect_error,
    judge_ping,
    recent_link_downs,
    tcp_reach,
)
from npuops.doctor.context import CheckContext, DoctorOptions, PeerGroup, PeerHost, parse_peers
from npuops.doctor.model import Check, Result, Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.hardware.hccn import parse_hccn_link_stat
from npuops.hardware.host import NetInterface, read_net_interfaces
from npuops.hardware.probe import RC_TIMEOUT, CommandResult, Probe
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.paths import REPO

NETWORK_IDS = ("hccn-link", "hccn-net-health", "hccn-ip")
B2C = "npu-smi-info_910b2c_4dev_proc_1.txt"  # devices 4-7
LINK = "hccn_tool-link_doc_1.txt"  # link status: UP
HEALTH = "hccn_tool-net_health_doc_1.txt"  # net health status: Init
IPS = ("hccn_tool-ip_910b_1.txt", "hccn_tool-ip_910-32g_1.txt", "hccn_tool-ip_doc_1.txt")

Answers = dict[tuple[str, ...], tuple[int, str, str]]


def derived(text: str, old: str, new: str) -> str:
    assert old in text, f"{old!r} not in the capture"
    return text.replace(old, new, 1)


def key(device: int, query: str) -> tuple[str, ...]:
    return ("hccn_tool", "-i", str(device), query, "-g")


def context(root: Path, answers: Answers, smi: str = B2C, options: DoctorOptions | None = None) -> CheckContext:
    table: Answers = {**answers, ("npu-smi", "info"): (0, capture(smi), "")}
    probe = Probe(Settings(root=root), runner=FakeRunner(table, passthrough_python=False), machine=lambda: "aarch64")
    return CheckContext(probe, options)


def run(check: type[Check], ctx: CheckContext) -> Result:
    result = check().run(ctx)
    if result.status is not Status.PASS:
        assert result.remediation
    return result


def test_network_checks_are_discovered_with_pages() -> None:
    found = {c.id: c for c in discover_checks()}
    for check_id in NETWORK_IDS:
        check = found[check_id]
        assert (check.area, check.level, check.requires) == ("network", 2, ("hccn_tool",))
        page = (REPO / "checks" / "docs" / f"{check_id}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {check_id}: ")


# --- hccn-link ----------------------------------------------------------------------------------------------------


def test_link_up_on_every_nic(fake_root: Path) -> None:
    ctx = context(fake_root, {key(d, "-link"): (0, capture(LINK), "") for d in range(4, 8)})
    result = run(HccnLinkUp, ctx)
    assert result.status is Status.PASS
    assert result.evidence["link"] == {4: "UP", 5: "UP", 6: "UP", 7: "UP"}


def test_link_down_fails_naming_the_device(fake_root: Path) -> None:
    down = derived(capture(LINK), "UP", "DOWN")
    answers = {key(d, "-link"): (0, down if d == 6 else capture(LINK), "") for d in range(4, 8)}
    result = run(HccnLinkUp, context(fake_root, answers))
    assert result.status is Status.FAIL
    assert result.evidence["link"] == {4: "UP", 5: "UP", 6: "DOWN", 7: "UP"}
    assert "for i in 6: `hccn_tool -i $i -link_stat -g`" in (result.remediation or "")  # for the failing NIC


def test_link_query_failing_warns(fake_root: Path) -> None:
    answers = {key(d, "-link"): (0, capture(LINK), "") for d in (4, 5, 6)}
    answers[key(7, "-link")] = (1, "", "")
    result = run(HccnLinkUp, context(fake_root, answers))
    assert result.status is Status.WARN and set(result.evidence["unreadable"]) == {7}
    assert result.evidence["link"] == {4: "UP", 5: "UP", 6: "UP"}


STAT = "hccn_tool-link_stat_doc_1.txt"  # one LINK DOWN 17.6 h before its current time
STAT_OLD = "hccn_tool-link_stat_doc_2.txt"  # one LINK DOWN 23 days before its current time
STAT_FLAPPING = "hccn_tool-link_stat_flapping_doc_1.txt"  # two LINK DOWN within 24 h, the newest record DOWN


def link_answers(stats: dict[int, str | tuple[int, str, str]], link: str | None = None) -> Answers:
    """-link UP on devices 4-7 (or `link` for all), and -link_stat per device: a capture name or a raw answer."""
    answers: Answers = {key(d, "-link"): (0, link or capture(LINK), "") for d in range(4, 8)}
    for device, stat in stats.items():
        answers[key(device, "-link_stat")] = (0, capture(stat), "") if isinstance(stat, str) else stat
    return answers


def test_link_stat_counts_the_downs_of_the_window_by_the_nics_clock() -> None:
    flapping = parse_hccn_link_stat(capture(STAT_FLAPPING))
    day = recent_link_downs(flapping, 86400)
    assert (day.downs, day.last_change, day.link_up_count) == (2, "Fri Sep  1 06:34:43 2023 LINK DOWN", 2)
    assert recent_link_downs(flapping, 3600).downs == 1  # the Aug 31 drop is 23 h old
    assert recent_link_downs(parse_hccn_link_stat(capture(STAT_OLD)), 86400).downs == 0
    undated = parse_hccn_link_stat(derived(capture(STAT), "current time        : Wed Jun  7 10:08:28 2023",
                                           "link up count       : 2"))
    assert recent_link_downs(undated, 86400).downs is None


def test_link_flapping_warns_with_the_count_and_the_last_change(fake_root: Path) -> None:
    ctx = context(fake_root, link_answers({4: STAT_OLD, 5: STAT_OLD, 6: STAT_FLAPPING, 7: STAT_OLD}))
    result = run(HccnLinkUp, ctx)
    assert result.status is Status.WARN
    assert result.evidence["link_stat"][6] == {
        "downs_in_window": 2, "last_change": "Fri Sep  1 06:34:43 2023 LINK DOWN", "link_up_count": 2}
    assert {d: e["downs_in_window"] for d, e in result.evidence["link_stat"].items()} == {4: 0, 5: 0, 6: 2, 7: 0}
    assert (result.evidence["flap_window_s"], result.evidence["flap_warn_downs"]) == (86400, 2)


def test_one_recent_drop_is_not_flapping(fake_root: Path) -> None:
    result = run(HccnLinkUp, context(fake_root, link_answers({d: STAT for d in range(4, 8)})))
    assert result.status is Status.PASS
    assert {d: e["downs_in_window"] for d, e in result.evidence["link_stat"].items()} == {4: 1, 5: 1, 6: 1, 7: 1}


def test_link_down_fails_before_flapping_warns(fake_root: Path) -> None:
    down = derived(capture(LINK), "UP", "DOWN")
    result = run(HccnLinkUp, context(fake_root, link_answers({d: STAT_FLAPPING for d in range(4, 8)}, link=down)))
    assert result.status is Status.FAIL
    assert result.evidence["link_stat"][4]["downs_in_window"] == 2  # the history is evidence for the failure


def test_link_stat_a_nic_cannot_answer_is_noted_not_judged(fake_root: Path) -> None:
    stats: dict[int, str | tuple[int, str, str]] = {4: STAT_OLD, 5: STAT_OLD, 6: STAT_OLD, 7: (1, "", "")}
    result = run(HccnLinkUp, context(fake_root, link_answers(stats)))
    assert result.status is Status.PASS
    assert set(result.evidence["link_stat_unreadable"]) == {7}
    assert set(result.evidence["link_stat"]) == {4, 5, 6}


# --- hccn-net-health ----------------------------------------------------------------------------------------------


def test_net_health_init_warns_with_the_netdetect_fix(fake_root: Path) -> None:
    ctx = context(fake_root, {key(d, "-net_health"): (0, capture(HEALTH), "") for d in range(4, 8)})
    result = run(HccnNetHealthy, ctx)
    assert result.status is Status.WARN
    assert result.evidence["net_health"] == {4: "Init", 5: "Init", 6: "Init", 7: "Init"}
    assert "hccn_tool -i 4 -netdetect -s address" in (result.remediation or "")


def test_net_health_success_passes_and_receive_timeout_fails(fake_root: Path) -> None:
    success = derived(capture(HEALTH), "Init", "Success")
    ctx = context(fake_root, {key(d, "-net_health"): (0, success, "") for d in range(4, 8)})
    assert run(HccnNetHealthy, ctx).status is Status.PASS
    timeout = derived(capture(HEALTH), "Init", "Receive timeout")
    answers = {key(d, "-net_health"): (0, timeout if d == 5 else success, "") for d in range(4, 8)}
    result = run(HccnNetHealthy, context(fake_root, answers))
    assert result.status is Status.FAIL
    assert result.evidence["net_health"] == {4: "Success", 5: "Receive timeout", 6: "Success", 7: "Success"}


# --- hccn-ip ------------------------------------------------------------------------------------------------------


def test_ip_configured_on_every_nic(fake_root: Path) -> None:
    # Three real captures (different hosts, distinct addresses, one redacted), one per device of a 3-chip launch.
    answers = {key(d, "-ip"): (0, capture(name), "") for d, name in zip((4, 5, 6), IPS, strict=True)}
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5, 6))))
    assert result.status is Status.PASS
    assert {d: ip for d, (ip, _mask) in result.evidence["ip"].items()} == {
        4: "29.1.112.213", 5: "10.20.11.24", 6: "10.xx.xx.10"}


def test_ip_shared_by_two_nics_fails(fake_root: Path) -> None:
    answers = {key(d, "-ip"): (0, capture(IPS[0]), "") for d in (4, 5)}
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5))))
    assert result.status is Status.FAIL
    assert result.evidence["ip"][4][0] == result.evidence["ip"][5][0] == "29.1.112.213"


def test_ip_redacted_addresses_are_not_called_duplicates(fake_root: Path) -> None:
    answers = {key(d, "-ip"): (0, capture("hccn_tool-ip_doc_1.txt"), "") for d in (4, 5)}
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5))))
    assert result.status is Status.PASS


def test_ip_missing_fails_with_the_command_to_set_it(fake_root: Path) -> None:
    empty = derived(capture(IPS[0]), "ipaddr:29.1.112.213", "ipaddr:")
    answers = {key(4, "-ip"): (0, empty, ""), key(5, "-ip"): (0, capture(IPS[1]), "")}
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5))))
    assert result.status is Status.FAIL and not result.evidence["ip"][4][0] and result.evidence["ip"][5][0]
    assert "`hccn_tool -i N -ip -s address A netmask M`" in (result.remediation or "")


def test_ip_other_than_the_inventorys_fails_naming_the_provisioning_step(fake_root: Path) -> None:
    answers = {key(d, "-ip"): (0, capture(name), "") for d, name in zip((4, 5), IPS[:2], strict=True)}
    group = parse_peers(json.dumps({"npu_ips": {"4": "29.1.112.213", "5": "10.20.11.99"}, "peers": []}))
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5), peers=group)))
    assert result.status is Status.FAIL and result.evidence["inventory"] == {4: "29.1.112.213", 5: "10.20.11.99"}
    assert "has 10.20.11.24, the inventory gives 10.20.11.99" in result.message
    assert "--tags npu-network" in (result.remediation or "")
    matching = parse_peers(json.dumps({"npu_ips": {"4": "29.1.112.213", "5": "10.20.11.24"}, "peers": []}))
    passed = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5), peers=matching)))
    assert passed.status is Status.PASS


# --- when there is nothing to ask -----------------------------------------------------------------------------------


@pytest.mark.parametrize("check", [HccnLinkUp, HccnNetHealthy, HccnIpConfigured])
def test_skip_without_hccn_tool_saying_single_node_does_not_need_it(fake_root: Path, check: type[Check]) -> None:
    result = run(check, context(fake_root, {}))
    assert result.status is Status.SKIP and result.evidence == {"tool": "hccn_tool"}
    assert "nothing to fix for single-node inference" in (result.remediation or "")


@pytest.mark.parametrize("check", [HccnLinkUp, HccnNetHealthy, HccnIpConfigured])
def test_skip_on_310p(fake_root: Path, check: type[Check]) -> None:
    ctx = context(fake_root, {("hccn_tool",): (0, capture(LINK), "")}, smi="npu-smi-info_310p3-300iduo_1.txt")
    result = run(check, ctx)
    assert result.status is Status.SKIP and result.evidence["families"] == ["310P"]
    runner = ctx.probe.runner
    assert isinstance(runner, FakeRunner)
    assert not [c for c in runner.calls if c[0] == "hccn_tool"]  # nothing asked


@pytest.mark.parametrize("check", [HccnLinkUp, HccnNetHealthy, HccnIpConfigured])
def test_skip_on_minus_8005(fake_root: Path, check: type[Check]) -> None:
    result = run(check, context(fake_root, {}, smi="npu-smi-info_error-8005_container_1.txt"))
    assert result.status is Status.SKIP and result.evidence["npu_smi_error"] == "-8005"


def test_network_checks_on_this_machine_never_error() -> None:
    checks = [c for c in discover_checks() if c.id in NETWORK_IDS]
    ctx = CheckContext(Probe(Settings(environ=dict(os.environ))))
    report = run_checks(checks, ctx)
    for outcome in report.outcomes:
        assert outcome.result.status is not Status.ERROR, outcome
    if not ctx.node.has_npus:
        assert {o.result.status for o in report.outcomes} == {Status.SKIP}


# --- npu-peer-ping --------------------------------------------------------------------------------------------------

PING_OK = "hccn_tool-ping_910b1_1.txt"  # 3/3 replies
PING_OK_DOC = "hccn_tool-ping_doc_1.txt"  # 3/3 replies
PING_LOSS = "hccn_tool-ping_loss_doc_1.txt"  # 2/3 replies


def ping_key(device: int, address: str) -> tuple[str, ...]:
    return ("hccn_tool", "-i", str(device), "-ping", "-g", "address", address)


def no_reply() -> str:
    """Derived from a real capture: every probe timed out (the vendor's "recv time out seq" line) and the summary
    counts none back."""
    text = capture(PING_OK)
    for seq, ms in (("0", "1.418000"), ("1", "0.034000"), ("2", "0.040000")):
        text = derived(text, f"recv seq={seq},time={ms}ms", f"recv time out seq={seq}")
    return derived(text, "3 received, 0.00% packet loss", "0 received, 100.00% packet loss")


def peer(name: str, devices: dict[int, str], address: str = "10.213.0.12") -> PeerHost:
    return PeerHost(name=name, address=address, npu_ips=devices)


NODE_B = peer("node-b", {d: f"29.1.112.{210 + d}" for d in range(4, 8)})
NODE_C = peer("node-c", {d: f"29.1.113.{210 + d}" for d in range(4, 8)}, address="10.213.0.13")


def peers_context(root: Path, answers: Answers, group: PeerGroup | None, smi: str = B2C,
                  devices: tuple[int, ...] | None = None) -> CheckContext:
    return context(root, answers, smi=smi, options=DoctorOptions(peers=group, devices=devices))


def ping_calls(ctx: CheckContext) -> list[tuple[str, ...]]:
    runner = ctx.probe.runner
    assert isinstance(runner, FakeRunner)
    return [c for c in runner.calls if c[:1] == ("hccn_tool",) and "-ping" in c]


@pytest.mark.parametrize("check", [NpuPeerPing, HostPeerReach])
@pytest.mark.parametrize("group", [None, PeerGroup(peers=())])
def test_peer_checks_skip_without_peers_saying_how_to_give_them(fake_root: Path, check: type[Check],
                                                                group: PeerGroup | None) -> None:
    ctx = peers_context(fake_root, {("hccn_tool",): (0, capture(PING_OK), "")}, group)
    result = run(check, ctx)
    assert result.status is Status.SKIP and result.evidence == {"peers": None if group is None else []}
    assert "npuops doctor --level 2 --peers" in (result.remediation or "")  # how to give them
    assert not ping_calls(ctx)


def test_peer_ping_every_pair_reachable(fake_root: Path) -> None:
    answers = {ping_key(d, ip): (0, capture(PING_OK if d % 2 else PING_OK_DOC), "")
               for p in (NODE_B, NODE_C) for d, ip in p.npu_ips.items()}
    ctx = peers_context(fake_root, answers, PeerGroup(peers=(NODE_B, NODE_C)))
    result = run(NpuPeerPing, ctx)
    assert result.status is Status.PASS, result
    assert len(result.evidence["pairs"]) == 8 and {p["verdict"] for p in result.evidence["pairs"]} == {"reachable"}
    # Same device index on each side, one ping at a time, in device then peer order.
    assert ping_calls(ctx) == [ping_key(d, p.npu_ips[d]) for d in range(4, 8) for p in (NODE_B, NODE_C)]


def test_peer_ping_unreachable_pair_fails_naming_host_device_and_address(fake_root: Path) -> None:
    answers = {ping_key(d, ip): (0, capture(PING_OK), "") for d, ip in NODE_B.npu_ips.items()}
    answers[ping_key(5, NODE_B.npu_ips[5])] = (100, no_reply(), "")
    answers[ping_key(6, NODE_B.npu_ips[6])] = (100, capture(PING_LOSS), "")
    result = run(NpuPeerPing, peers_context(fake_root, answers, PeerGroup(peers=(NODE_B,))))
    assert result.status is Status.FAIL
    pairs = {p["device"]: p for p in result.evidence["pairs"]}
    assert {d: p["verdict"] for d, p in pairs.items()} == {4: "reachable", 5: "unreachable", 6: "lossy",
                                                           7: "reachable"}
    assert (pairs[5]["peer"], pairs[5]["address"], pairs[5]["received"], pairs[5]["transmitted"]) == (
        "node-b", "29.1.112.215", 0, 3)
    assert (pairs[6]["address"], pairs[6]["received"], pairs[6]["transmitted"]) == ("29.1.112.216", 2, 3)
    assert "`hccn_tool -i 5 -ip -g`" in (result.remediation or "")  # the first command to run, for the failing NIC


def test_peer_ping_loss_alone_warns(fake_root: Path) -> None:
    answers = {ping_key(d, ip): (0, capture(PING_LOSS if d == 7 else PING_OK), "")
               for d, ip in NODE_B.npu_ips.items()}
    result = run(NpuPeerPing, peers_context(fake_root, answers, PeerGroup(peers=(NODE_B,))))
    assert result.status is Status.WARN
    assert {p["device"]: p["verdict"] for p in result.evidence["pairs"] if p["verdict"] != "reachable"} == {7: "lossy"}


@pytest.mark.parametrize(
    ("rc", "output", "verdict"),
    [
        # hccn_tool's own failure text without a summary line (the loss doc's first line): unreachable.
        (100, "device 4 PING 29.1.112.214\nrecv time out seq=0\n", "unreachable"),
        # A failure npuops cannot read: no verdict on the link, a warning.
        (1, "hccn_tool: device 4 is not ready\n", "unreadable"),
        (0, "", "unreadable"),
    ],
)
def test_judge_ping_without_a_summary(rc: int, output: str, verdict: str) -> None:
    judged, detail, ping = judge_ping(CommandResult(ping_key(4, "29.1.112.214"), rc, output, "", 0.0))
    assert (judged, ping) == (verdict, None) and detail


def test_judge_ping_timeout_is_unreadable() -> None:
    result = CommandResult(ping_key(4, "29.1.112.214"), RC_TIMEOUT, "", "", 15.0, "timed out after 15 s")
    assert judge_ping(result)[:2] == ("unreadable", "`hccn_tool -i 4 -ping -g address 29.1.112.214`: timed out "
                                                    "after 15 s")


def test_peer_ping_unreadable_warns(fake_root: Path) -> None:
    answers = {ping_key(d, ip): (0, capture(PING_OK), "") for d, ip in NODE_B.npu_ips.items()}
    answers[ping_key(4, NODE_B.npu_ips[4])] = (1, "hccn_tool: device 4 is not ready\n", "")
    result = run(NpuPeerPing, peers_context(fake_root, answers, PeerGroup(peers=(NODE_B,))))
    assert result.status is Status.WARN
    assert {(p["peer"], p["device"]): p["verdict"] for p in result.evidence["pairs"] if p["verdict"] != "reachable"} \
        == {("node-b", 4): "unreadable"}


def test_peer_without_a_nic_address_for_a_device_is_reported_not_pinged(fake_root: Path) -> None:
    partial = peer("node-d", {4: "29.1.114.214", 5: "29.1.114.215"})
    answers = {ping_key(d, ip): (0, capture(PING_OK), "") for d, ip in partial.npu_ips.items()}
    ctx = peers_context(fake_root, answers, PeerGroup(peers=(partial,)))
    result = run(NpuPeerPing, ctx)
    assert result.status is Status.WARN
    untested = [(p["peer"], p["device"]) for p in result.evidence["pairs"] if p["verdict"] == "no-peer-ip"]
    assert untested == [("node-d", 6), ("node-d", 7)]
    assert "chips[].nic_ip" in (result.remediation or "")  # where the missing addresses come from
    assert ping_calls(ctx) == [ping_key(4, "29.1.114.214"), ping_key(5, "29.1.114.215")]


def test_peer_with_no_nic_addresses_at_all_skips(fake_root: Path) -> None:
    # A peer whose node model had "nic_ip": null everywhere: --peers keeps the peer, without addresses.
    group = parse_peers('[{"name": "node-e", "address": "10.213.0.14", "npu_ips": {"4": null, "5": null}}]')
    ctx = peers_context(fake_root, {("hccn_tool",): (0, capture(PING_OK), "")}, group)
    result = run(NpuPeerPing, ctx)
    assert result.status is Status.SKIP and not ping_calls(ctx)
    assert [(p["peer"], p["device"], p["verdict"]) for p in result.evidence["pairs"]] == [
        ("node-e", 4, "no-peer-ip"), ("node-e", 5, "no-peer-ip"), ("node-e", 6, "no-peer-ip"),
        ("node-e", 7, "no-peer-ip")]


def test_peer_ping_skips_without_hccn_tool_310p_and_npus(fake_root: Path) -> None:
    group = PeerGroup(peers=(NODE_B,))
    missing = run(NpuPeerPing, peers_context(fake_root, {}, group))
    assert missing.status is Status.SKIP and missing.evidence == {"tool": "hccn_tool"}
    ctx = peers_context(fake_root, {("hccn_tool",): (0, capture(PING_OK), "")}, group,
                        smi="npu-smi-info_310p3-300iduo_1.txt")
    duo = run(NpuPeerPing, ctx)
    assert duo.status is Status.SKIP and duo.evidence["families"] == ["310P"] and not ping_calls(ctx)
    no_npu = run(NpuPeerPing, peers_context(fake_root, {}, group, smi="npu-smi-info_error-8005_container_1.txt"))
    assert no_npu.status is Status.SKIP and no_npu.evidence["npu_smi_error"] == "-8005"


def test_peer_ping_only_for_the_devices_the_launch_uses(fake_root: Path) -> None:
    answers = {ping_key(d, ip): (0, capture(PING_OK), "") for d, ip in NODE_B.npu_ips.items()}
    ctx = peers_context(fake_root, answers, PeerGroup(peers=(NODE_B,)), devices=(6,))
    assert run(NpuPeerPing, ctx).status is Status.PASS
    assert ping_calls(ctx) == [ping_key(6, NODE_B.npu_ips[6])]


# --- host-peer-reach ------------------------------------------------------------------------------------------------

Connect = Callable[[str | None, str, int, float], TcpReach]


def with_connect(fake: Connect) -> type[HostPeerReach]:
    class FakeConnect(HostPeerReach):
        connect = staticmethod(fake)

    return FakeConnect


def recording(outcomes: dict[str, TcpReach], calls: list[tuple[str | None, str, int, float]]) -> Connect:
    def fake(source: str | None, address: str, port: int, timeout: float) -> TcpReach:
        calls.append((source, address, port, timeout))
        return outcomes[address]

    return fake


def with_interfaces(ctx: CheckContext, *interfaces: NetInterface) -> CheckContext:
    node = ctx.node
    ctx._node = dataclasses.replace(node, host=dataclasses.replace(node.host, interfaces=interfaces))
    return ctx


def test_host_reach_pass_when_every_peer_answers(fake_root: Path) -> None:
    calls: list[tuple[str | None, str, int, float]] = []
    fake = recording({"10.213.0.12": TcpReach("connected", "connected", "10.213.0.11"),
                      "10.213.0.13": TcpReach("refused", "the host answered (connection refused)", "10.213.0.11")},
                     calls)
    group = PeerGroup(peers=(NODE_B, dataclasses.replace(NODE_C, port=2222)))
    result = run(with_connect(fake), peers_context(fake_root, {}, group))
    assert result.status is Status.PASS
    assert sorted(calls) == [(None, "10.213.0.12", 22, 2.0), (None, "10.213.0.13", 2222, 2.0)]
    assert {name: p["outcome"] for name, p in result.evidence["peers"].items()} == {"node-b": "connected",
                                                                                    "node-c": "refused"}


def test_host_reach_fails_naming_each_peer_that_does_not_answer(fake_root: Path) -> None:
    fake = recording({"10.213.0.12": TcpReach("timeout", "no answer in 2 s", "10.213.0.11"),
                      "10.213.0.13": TcpReach("unreachable", "no route to host", "10.213.0.11")}, [])
    ctx = with_interfaces(peers_context(fake_root, {}, PeerGroup(peers=(NODE_B, NODE_C), ifname="enp189s0f0")),
                          NetInterface("enp189s0f0", ("10.213.0.11/24",), True))
    result = run(with_connect(fake), ctx)
    assert result.status is Status.FAIL
    assert (result.evidence["ifname"], result.evidence["source"]) == ("enp189s0f0", "10.213.0.11")
    assert {name: (p["address"], p["port"], p["outcome"]) for name, p in result.evidence["peers"].items()} == {
        "node-b": ("10.213.0.12", 22, "timeout"), "node-c": ("10.213.0.13", 22, "unreachable")}
    assert "`ip route get 10.213.0.12 from 10.213.0.11`" in (result.remediation or "")  # the command to run first


def test_host_reach_sends_from_the_named_interface(fake_root: Path) -> None:
    calls: list[tuple[str | None, str, int, float]] = []
    fake = recording({"10.213.0.12": TcpReach("connected", "connected", "192.168.7.3")}, calls)
    ctx = with_interfaces(peers_context(fake_root, {}, PeerGroup(peers=(NODE_B,), ifname="bond0")),
                          NetInterface("eth0", ("10.0.0.2/24",), True),
                          NetInterface("bond0", ("192.168.7.3/16", "192.168.8.3/16"), True))
    result = run(with_connect(fake), ctx)
    assert result.status is Status.PASS
    assert (result.evidence["ifname"], result.evidence["source"]) == ("bond0", "192.168.7.3")
    assert calls == [("192.168.7.3", "10.213.0.12", 22, 2.0)]


@pytest.mark.parametrize(
    ("interfaces", "problem"),
    [
        ((NetInterface("eth0", ("10.0.0.2/24",), True),), "missing"),
        ((NetInterface("bond0", ("10.0.0.2/24",), False),), "down"),
        ((NetInterface("bond0", (), True),), "no-ipv4"),
    ],
)
def test_host_reach_fails_when_the_named_interface_cannot_be_used(fake_root: Path,
                                                                  interfaces: tuple[NetInterface, ...],
                                                                  problem: str) -> None:
    calls: list[tuple[str | None, str, int, float]] = []
    ctx = with_interfaces(peers_context(fake_root, {}, PeerGroup(peers=(NODE_B,), ifname="bond0")), *interfaces)
    result = run(with_connect(recording({}, calls)), ctx)
    assert result.status is Status.FAIL and result.evidence == {"ifname": "bond0", "interface_state": problem}
    assert "`ip -br addr`" in (result.remediation or "") and not calls


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (OSError(errno.ECONNREFUSED, "Connection refused"), "refused"),
        (OSError(errno.ECONNRESET, "Connection reset by peer"), "refused"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "unreachable"),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "unreachable"),
        (TimeoutError("timed out"), "timeout"),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), "timeout"),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "error"),
        (OSError(errno.EACCES, "Permission denied"), "error"),
    ],
)
def test_classify_connect_error(exc: OSError, outcome: str) -> None:
    classified, detail = classify_connect_error(exc)
    assert classified == outcome and detail
    assert TcpReach(classified, detail).reachable is (outcome == "refused")


# Real sockets, on this machine only: nothing is sent anywhere else.


def test_tcp_reach_real_sockets_on_loopback() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        connected = tcp_reach(None, "127.0.0.1", port, 2.0)
        assert connected.outcome == "connected" and connected.reachable
        assert connected.local_address == "127.0.0.1"
        from_source = tcp_reach("127.0.0.1", "127.0.0.1", port, 2.0)
        assert from_source.outcome == "connected"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
        closed.bind(("127.0.0.1", 0))
        free_port = closed.getsockname()[1]  # bound, never listening: the kernel answers a connect with a reset
        refused = tcp_reach(None, "127.0.0.1", free_port, 2.0)
    assert refused.outcome == "refused" and refused.reachable


def test_tcp_reach_from_an_address_this_machine_does_not_have() -> None:
    nonlocal_bind = Path("/proc/sys/net/ipv4/ip_nonlocal_bind")
    if nonlocal_bind.exists() and nonlocal_bind.read_text().strip() != "0":
        pytest.skip("net.ipv4.ip_nonlocal_bind is on: binding to a foreign address would succeed")
    foreign = "198.51.100.77"  # TEST-NET-2 (RFC 5737): documentation only
    assert not any(a.split("/")[0] == foreign for i in read_net_interfaces() for a in i.ipv4)
    # The bind fails before any packet exists; the destination is this machine anyway.
    reach = tcp_reach(foreign, "127.0.0.1", 9, 2.0)
    assert reach.outcome == "local-address" and not reach.reachable
    assert foreign in reach.detail


def test_host_reach_end_to_end_with_real_sockets(fake_root: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        group = parse_peers(f'[{{"name": "self", "address": "127.0.0.1", "port": {port}}}]')
        result = run(HostPeerReach, peers_context(fake_root, {}, group))
    assert result.status is Status.PASS and result.evidence["peers"]["self"]["outcome"] == "connected"


def test_peer_checks_are_discovered_with_pages() -> None:
    found = {c.id: c for c in discover_checks()}
    assert (found["npu-peer-ping"].area, found["npu-peer-ping"].level, found["npu-peer-ping"].requires) == (
        "network", 2, ("hccn_tool",))
    assert (found["host-peer-reach"].area, found["host-peer-reach"].level) == ("network", 2)
    for check_id in ("npu-peer-ping", "host-peer-reach"):
        assert found[check_id].severity.value == "high"
        page = (REPO / "checks" / "docs" / f"{check_id}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {check_id}: ")
