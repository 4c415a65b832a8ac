"""The PD preflight of a disaggregated engine's start gate: its KV ports (really bound here), Mooncake in its serving
venv (a real interpreter asked the real question), and the NPU NICs its KV goes over (recorded `hccn_tool` output)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from npuops.checks.pd import PdKvPorts, PdMooncakeInstalled, PdNpuNics
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Result, Status
from npuops.hardware.probe import Probe
from npuops.instance.record import InstanceRecord
from npuops.settings import Settings
from tests.checks.test_network import B2C, HEALTH, LINK, context, derived, key
from tests.support.captures import capture
from tests.support.instance_records import make_record


def _pd_record(tmp_path: Path, **overrides: object) -> InstanceRecord:
    values: dict[str, object] = {"pd_role": "decode", "kv_connector": "MooncakeConnectorV1", "kv_port": 28000,
                                 "kv_port_span": 2, "target_kind": "npu", "devices": (4, 5), "behind": "pd"}
    values.update(overrides)
    return make_record(tmp_path / "state", "pd-d0", **values)


def _run(check: type, record: InstanceRecord, ctx: CheckContext | None = None, root: Path | None = None) -> Result:
    ctx = ctx or CheckContext(Probe(Settings(root=root)), DoctorOptions(instance=record, devices=record.devices))
    result: Result = check().run(ctx)
    if result.status is not Status.PASS:
        assert result.remediation
    return result


def _free_base(span: int) -> int:
    """A port from which `span` ports are free here, above the transport range of 8 NPUs."""
    for base in range(40000, 50000, 97):
        if all(_bindable(base + i) for i in range(span)):
            return base
    raise AssertionError("no free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("check", [PdKvPorts, PdMooncakeInstalled, PdNpuNics])
def test_an_engine_that_is_not_pd_skips(check: type, tmp_path: Path, fake_root: Path) -> None:
    record = make_record(tmp_path / "state")
    result = _run(check, record, root=fake_root)
    assert result.status is Status.SKIP and "not an engine of a disaggregated instance" in result.message


def test_free_ports_outside_the_ranges_pass(tmp_path: Path, fake_root: Path) -> None:
    base = _free_base(2)
    record = _pd_record(tmp_path, kv_port=base, target_kind="cpu", devices=())
    result = _run(PdKvPorts, record, root=fake_root)
    assert result.status is Status.PASS and result.evidence["kv_ports"] == [base, base + 1]


def test_a_taken_port_fails_naming_it(tmp_path: Path, fake_root: Path) -> None:
    base = _free_base(2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 1))
        holder.listen()
        result = _run(PdKvPorts, _pd_record(tmp_path, kv_port=base, target_kind="cpu", devices=()), root=fake_root)
    assert result.status is Status.FAIL and f"ports {base + 1} of pd-d0's KV connector are taken" in result.message
    assert "--kv-port" in (result.remediation or "")


def test_ports_inside_mooncakes_transport_range_fail(tmp_path: Path, fake_root: Path) -> None:
    # The node's 4 chips (the recorded npu-smi of a 910B2C host): AscendDirectTransport takes 20000-23999.
    record = _pd_record(tmp_path, kv_port=20001)
    ctx = context(fake_root, {}, smi=B2C, options=DoctorOptions(instance=record, devices=record.devices))
    result = _run(PdKvPorts, record, ctx)
    assert result.status is Status.FAIL
    assert "overlap Mooncake's AscendDirectTransport range 20000-23999" in result.message


def test_ports_inside_hccls_host_ports_fail(tmp_path: Path, fake_root: Path) -> None:
    record = _pd_record(tmp_path, kv_port=60010, target_kind="cpu", devices=())
    result = _run(PdKvPorts, record, root=fake_root)
    assert result.status is Status.FAIL and "HCCL's host socket ports 60000-60031" in result.message


def test_the_example_connector_opens_no_ports(tmp_path: Path, fake_root: Path) -> None:
    record = _pd_record(tmp_path, kv_connector="ExampleConnector", kv_port=None, kv_port_span=0,
                        kv_shared_path="/var/lib/npuops-pd-kv", target_kind="cpu", devices=())
    assert _run(PdKvPorts, record, root=fake_root).status is Status.SKIP
    skipped = _run(PdMooncakeInstalled, record, root=fake_root)
    assert skipped.status is Status.SKIP and "part of vLLM itself" in skipped.message


def _venv(tmp_path: Path, with_mooncake: bool, mooncake: str = "0.3.11.post1", release: str = "0.23.0") -> Path:
    """A serving venv's bin/ whose python is this interpreter, with a `mooncake` package (and its distribution's
    metadata) on its path or without one."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text("#!/bin/sh\n")
    site = tmp_path / "site"
    site.mkdir()
    if with_mooncake:
        (site / "mooncake").mkdir()
        (site / "mooncake" / "__init__.py").write_text("")
        (site / "mooncake" / "engine.py").write_text("class TransferEngine:\n    pass\n")
        dist = site / "mooncake_transfer_engine_npu-0.3.11.post1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mooncake-transfer-engine-npu\n"
                                       f"Version: {mooncake}\n")
    ascend = site / f"vllm_ascend-{release}.dist-info"
    ascend.mkdir()
    (ascend / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-ascend\nVersion: {release}\n")
    python = bin_dir / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return bin_dir


def test_mooncake_missing_from_the_serving_venv_fails(tmp_path: Path, fake_root: Path) -> None:
    bin_dir = _venv(tmp_path, with_mooncake=False)
    record = _pd_record(tmp_path, vllm_command=(str(bin_dir / "vllm"), "serve"))
    result = _run(PdMooncakeInstalled, record, root=fake_root)
    assert result.status is Status.FAIL and "Mooncake does not import in the serving venv" in result.message
    assert "pip install mooncake-transfer-engine-npu==" in (result.remediation or "")


def test_mooncake_in_the_serving_venv_passes_with_its_version(tmp_path: Path, fake_root: Path) -> None:
    bin_dir = _venv(tmp_path, with_mooncake=True)
    record = _pd_record(tmp_path, vllm_command=(str(bin_dir / "vllm"), "serve"))
    result = _run(PdMooncakeInstalled, record, root=fake_root)
    assert result.status is Status.PASS, result.message
    assert result.evidence["versions"] == {"mooncake-transfer-engine-npu": "0.3.11.post1"}
    assert result.evidence["vllm_ascend"] == "0.23.0" and result.evidence["expected"] == "0.3.11.post1"


def test_mooncake_of_another_version_than_the_releases_row_warns(tmp_path: Path, fake_root: Path) -> None:
    bin_dir = _venv(tmp_path, with_mooncake=True, mooncake="0.3.9")
    record = _pd_record(tmp_path, vllm_command=(str(bin_dir / "vllm"), "serve"))
    result = _run(PdMooncakeInstalled, record, root=fake_root)
    assert result.status is Status.WARN
    assert "has Mooncake 0.3.9; vllm-ascend 0.23.0 is built against 0.3.11.post1" in result.message
    assert "mooncake-transfer-engine-npu==0.3.11.post1" in (result.remediation or "")


def test_no_serving_venv_fails(tmp_path: Path, fake_root: Path) -> None:
    record = _pd_record(tmp_path, vllm_command=(str(tmp_path / "none" / "vllm"), "serve"))
    result = _run(PdMooncakeInstalled, record, root=fake_root)
    assert result.status is Status.FAIL and "no serving venv interpreter" in result.message


def test_the_nics_of_the_engines_devices_up_and_healthy_pass(tmp_path: Path, fake_root: Path) -> None:
    record = _pd_record(tmp_path)
    healthy = derived(capture(HEALTH), "Init", "Success")
    answers = {**{key(d, "-link"): (0, capture(LINK), "") for d in (4, 5)},
               **{key(d, "-net_health"): (0, healthy, "") for d in (4, 5)}}
    ctx = context(fake_root, answers, options=DoctorOptions(instance=record, devices=record.devices))
    result = _run(PdNpuNics, record, ctx)
    assert result.status is Status.PASS, result.message
    assert result.evidence == {"hccn-link": "pass", "hccn-net-health": "pass"}


def test_a_nic_down_fails_and_says_the_kv_goes_over_it(tmp_path: Path, fake_root: Path) -> None:
    record = _pd_record(tmp_path)
    healthy = derived(capture(HEALTH), "Init", "Success")
    down = derived(capture(LINK), "UP", "DOWN")
    answers = {key(4, "-link"): (0, capture(LINK), ""), key(5, "-link"): (0, down, ""),
               **{key(d, "-net_health"): (0, healthy, "") for d in (4, 5)}}
    ctx = context(fake_root, answers, options=DoctorOptions(instance=record, devices=record.devices))
    result = _run(PdNpuNics, record, ctx)
    assert result.status is Status.FAIL
    assert "NPU NIC link not up" in result.message and "Mooncake moves pd-d0's KV over these ports" in result.message


def test_the_cpu_engine_skips_the_nics(tmp_path: Path, fake_root: Path) -> None:
    record = _pd_record(tmp_path, target_kind="cpu", devices=(), kv_connector="ExampleConnector")
    assert _run(PdNpuNics, record, root=fake_root).status is Status.SKIP
