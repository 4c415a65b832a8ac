"""The NPU NIC checks on real `hccn_tool` captures, on a 310P node, without hccn_tool, and on this machine.

States no capture shows (a link DOWN, net health Success or Receive timeout, a NIC without an address) are
derived from a real capture by changing only the value in question.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npuops.checks.network import HccnIpConfigured, HccnLinkUp, HccnNetHealthy
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Check, Result, Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.hardware.probe import Probe
from npuops.settings import Settings
from tests.conftest import REPO, FakeRunner, capture

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
    assert result.status is Status.PASS and result.message == "4 NPU NIC(s) link UP"
    assert result.evidence["link"] == {4: "UP", 5: "UP", 6: "UP", 7: "UP"}


def test_link_down_fails_naming_the_device(fake_root: Path) -> None:
    down = derived(capture(LINK), "UP", "DOWN")
    answers = {key(d, "-link"): (0, down if d == 6 else capture(LINK), "") for d in range(4, 8)}
    result = run(HccnLinkUp, context(fake_root, answers))
    assert result.status is Status.FAIL
    assert "device 6 (NPU 6 chip 0) DOWN" in result.message
    assert "-link_stat -g" in (result.remediation or "")


def test_link_query_failing_warns(fake_root: Path) -> None:
    answers = {key(d, "-link"): (0, capture(LINK), "") for d in (4, 5, 6)}
    answers[key(7, "-link")] = (1, "", "")
    result = run(HccnLinkUp, context(fake_root, answers))
    assert result.status is Status.WARN and "device 7" in result.message


# --- hccn-net-health ----------------------------------------------------------------------------------------------


def test_net_health_init_warns_with_the_netdetect_fix(fake_root: Path) -> None:
    ctx = context(fake_root, {key(d, "-net_health"): (0, capture(HEALTH), "") for d in range(4, 8)})
    result = run(HccnNetHealthy, ctx)
    assert result.status is Status.WARN and "'Init'" in result.message
    assert "hccn_tool -i 4 -netdetect -s address" in (result.remediation or "")


def test_net_health_success_passes_and_receive_timeout_fails(fake_root: Path) -> None:
    success = derived(capture(HEALTH), "Init", "Success")
    ctx = context(fake_root, {key(d, "-net_health"): (0, success, "") for d in range(4, 8)})
    assert run(HccnNetHealthy, ctx).status is Status.PASS
    timeout = derived(capture(HEALTH), "Init", "Receive timeout")
    answers = {key(d, "-net_health"): (0, timeout if d == 5 else success, "") for d in range(4, 8)}
    result = run(HccnNetHealthy, context(fake_root, answers))
    assert result.status is Status.FAIL and "device 5 (NPU 5 chip 0) 'Receive timeout'" in result.message


# --- hccn-ip ------------------------------------------------------------------------------------------------------


def test_ip_configured_on_every_nic(fake_root: Path) -> None:
    # Three real captures (different hosts, distinct addresses, one redacted), one per device of a 3-chip launch.
    answers = {key(d, "-ip"): (0, capture(name), "") for d, name in zip((4, 5, 6), IPS, strict=True)}
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5, 6))))
    assert result.status is Status.PASS
    assert "4=29.1.112.213" in result.message and "6=10.xx.xx.10" in result.message


def test_ip_shared_by_two_nics_fails(fake_root: Path) -> None:
    answers = {key(d, "-ip"): (0, capture(IPS[0]), "") for d in (4, 5)}
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5))))
    assert result.status is Status.FAIL
    assert "29.1.112.213 is set on device 4" in result.message and "device 5" in result.message


def test_ip_redacted_addresses_are_not_called_duplicates(fake_root: Path) -> None:
    answers = {key(d, "-ip"): (0, capture("hccn_tool-ip_doc_1.txt"), "") for d in (4, 5)}
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5))))
    assert result.status is Status.PASS


def test_ip_missing_fails_with_the_command_to_set_it(fake_root: Path) -> None:
    empty = derived(capture(IPS[0]), "ipaddr:29.1.112.213", "ipaddr:")
    answers = {key(4, "-ip"): (0, empty, ""), key(5, "-ip"): (0, capture(IPS[1]), "")}
    result = run(HccnIpConfigured, context(fake_root, answers, options=DoctorOptions(devices=(4, 5))))
    assert result.status is Status.FAIL and "no IP address on device 4" in result.message
    assert "-ip -s address" in (result.remediation or "")


# --- when there is nothing to ask -----------------------------------------------------------------------------------


@pytest.mark.parametrize("check", [HccnLinkUp, HccnNetHealthy, HccnIpConfigured])
def test_skip_without_hccn_tool_saying_single_node_does_not_need_it(fake_root: Path, check: type[Check]) -> None:
    result = run(check, context(fake_root, {}))
    assert result.status is Status.SKIP
    assert "multi-node" in result.message and "single-node" in (result.remediation or "")


@pytest.mark.parametrize("check", [HccnLinkUp, HccnNetHealthy, HccnIpConfigured])
def test_skip_on_310p(fake_root: Path, check: type[Check]) -> None:
    ctx = context(fake_root, {("hccn_tool",): (0, capture(LINK), "")}, smi="npu-smi-info_310p3-300iduo_1.txt")
    result = run(check, ctx)
    assert result.status is Status.SKIP and "310P" in result.message
    runner = ctx.probe.runner
    assert isinstance(runner, FakeRunner)
    assert not [c for c in runner.calls if c[0] == "hccn_tool"]  # nothing asked


@pytest.mark.parametrize("check", [HccnLinkUp, HccnNetHealthy, HccnIpConfigured])
def test_skip_on_minus_8005(fake_root: Path, check: type[Check]) -> None:
    result = run(check, context(fake_root, {}, smi="npu-smi-info_error-8005_container_1.txt"))
    assert result.status is Status.SKIP and "-8005" in result.message


def test_network_checks_on_this_machine_never_error() -> None:
    checks = [c for c in discover_checks() if c.id in NETWORK_IDS]
    ctx = CheckContext(Probe(Settings(environ=dict(os.environ))))
    report = run_checks(checks, ctx)
    for outcome in report.outcomes:
        assert outcome.result.status is not Status.ERROR, outcome
    if not ctx.node.has_npus:
        assert {o.result.status for o in report.outcomes} == {Status.SKIP}
