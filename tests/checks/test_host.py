"""The host checks, on prepared /proc and /sys trees, real npu-smi captures and model directories."""

from __future__ import annotations

import dataclasses
import os
import resource
from pathlib import Path

import pytest

from npuops.checks import host as host_checks
from npuops.checks.host import (
    CpuGovernor,
    CpusetPerNpu,
    FreeMemory,
    ModelDisk,
    NpuCpuAffinity,
    NumaBalancing,
    OpenFiles,
    ShmSize,
    Swappiness,
    model_weights,
    npu_affinities,
)
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.hardware.node import NPU_SMI_MISSING, discover_node
from npuops.hardware.npu_smi_detail import parse_npu_smi_topo
from npuops.hardware.probe import Probe
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.host_tree import put
from tests.support.paths import REPO

HOST_IDS = ("cpuset-per-npu", "npu-cpu-affinity", "numa-balancing", "cpu-governor", "swappiness", "shm-size",
            "free-memory", "model-disk", "open-files")
GIB = 1024**3


def host_context(root: Path, *, machine: str = "x86_64", npu_smi: str | None = None,
                 options: DoctorOptions | None = None) -> CheckContext:
    answers: dict[tuple[str, ...], tuple[int, str, str]] = {("npu-smi", "info"): (0, npu_smi, "")} if npu_smi else {}
    probe = Probe(Settings(root=root), runner=FakeRunner(answers, passthrough_python=False), machine=lambda: machine)
    return CheckContext(probe, options)


def with_host(ctx: CheckContext, **changes: object) -> CheckContext:
    """The node of ctx with some host facts replaced (facts the tree cannot fake, like a statvfs)."""
    node = discover_node(ctx.probe)
    ctx._node = dataclasses.replace(node, host=dataclasses.replace(node.host, **changes))  # type: ignore[arg-type]
    return ctx


def test_host_checks_are_discovered_with_pages() -> None:
    found = {c.id: c for c in discover_checks()}
    for check_id in HOST_IDS:
        assert found[check_id].area == "host"
        page = (REPO / "checks" / "docs" / f"{check_id}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {check_id}: ")
        for section in ("**What it checks.**", "**Why it matters.**", "**How to fix.**"):
            assert section in page
    assert found["model-disk"].level == 2


# --- cpuset-per-npu ----------------------------------------------------------------------------------------------

EIGHT_910B3 = "npu-smi-info_910b3_1.txt"


def kunpeng(root: Path, allowed: str) -> None:
    put(root, "/sys/devices/system/cpu/online", "0-191\n")
    put(root, "/proc/self/status", f"Name:\tnpuops\nCpus_allowed_list:\t{allowed}\n")


def test_cpuset_fails_when_too_narrow_for_the_npus(fake_root: Path) -> None:
    kunpeng(fake_root, "0-23")
    ctx = host_context(fake_root, machine="aarch64", npu_smi=capture(EIGHT_910B3))
    result = CpusetPerNpu().run(ctx)
    assert result.status is Status.FAIL
    assert result.evidence == {"allowed_cpus": 24, "cpu_count": 192, "npus": 8, "per_npu": 5, "needed": 40}
    # The fix says both ways out, with the numbers: more CPUs, or fewer chips.
    assert "at least 40 CPUs" in (result.remediation or "") and "at most 4 chip(s)" in (result.remediation or "")


def test_cpuset_counts_only_the_devices_the_launch_uses(fake_root: Path) -> None:
    kunpeng(fake_root, "0-23")
    ctx = host_context(fake_root, machine="aarch64", npu_smi=capture(EIGHT_910B3),
                       options=DoctorOptions(devices=(0, 1, 2, 3)))
    result = CpusetPerNpu().run(ctx)
    assert result.status is Status.PASS and result.evidence["needed"] == 20


def test_cpuset_passes_with_enough_cpus(fake_root: Path) -> None:
    kunpeng(fake_root, "0-191")
    result = CpusetPerNpu().run(host_context(fake_root, machine="aarch64", npu_smi=capture(EIGHT_910B3)))
    assert result.status is Status.PASS
    assert (result.evidence["allowed_cpus"], result.evidence["npus"], result.evidence["needed"]) == (192, 8, 40)


def test_cpuset_skips_on_x86(fake_root: Path) -> None:
    kunpeng(fake_root, "0-3")
    result = CpusetPerNpu().run(host_context(fake_root, machine="x86_64", npu_smi=capture(EIGHT_910B3)))
    assert result.status is Status.SKIP and result.evidence == {"arch": "x86_64"}


def test_cpuset_skips_without_npus(fake_root: Path) -> None:
    kunpeng(fake_root, "0-3")
    result = CpusetPerNpu().run(host_context(fake_root, machine="aarch64"))
    assert result.status is Status.SKIP and result.evidence["npu_smi_error"] == NPU_SMI_MISSING
    assert "no `npu-smi` on PATH" in result.evidence["no_npu"]  # said once on top of the text report


# --- npu-cpu-affinity ----------------------------------------------------------------------------------------------

TOPO = "npu-smi-info-t-topo_910b1_8dev_1.txt"  # 8 NPUs: 0,2 -> 144-167; 1,3 -> 0-23; 4,6 -> 96-119; 5,7 -> 48-71
TOPO_KEY = ("npu-smi", "info", "-t", "topo")


def affinity_context(root: Path, allowed: str, *, topo: tuple[int, str, str] | None = None,
                     smi: str = EIGHT_910B3, devices: tuple[int, ...] | None = None,
                     machine: str = "aarch64") -> CheckContext:
    kunpeng(root, allowed)
    answers = {("npu-smi", "info"): (0, capture(smi), ""), TOPO_KEY: topo or (0, capture(TOPO), "")}
    probe = Probe(Settings(root=root), runner=FakeRunner(answers, passthrough_python=False), machine=lambda: machine)
    return CheckContext(probe, DoctorOptions(devices=devices))


def test_affinity_passes_when_the_cpuset_covers_every_numa_node(fake_root: Path) -> None:
    result = NpuCpuAffinity().run(affinity_context(fake_root, "0-191"))
    assert result.status is Status.PASS
    assert result.evidence["outside"] == []
    assert result.evidence["affinity"] == {0: "144-167", 1: "0-23", 2: "144-167", 3: "0-23", 4: "96-119",
                                           5: "48-71", 6: "96-119", 7: "48-71"}
    assert set(result.evidence["allowed_affine"].values()) == {24}


def test_affinity_warns_for_the_npus_a_one_node_cpuset_leaves_out(fake_root: Path) -> None:
    """A container pinned to NUMA node 0's CPUs (0-23): only NPUs 1 and 3 have their CPUs there."""
    result = NpuCpuAffinity().run(affinity_context(fake_root, "0-23"))
    assert result.status is Status.WARN
    assert result.evidence["outside"] == [0, 2, 4, 5, 6, 7]
    assert result.evidence["allowed_affine"] == {0: 0, 1: 24, 2: 0, 3: 24, 4: 0, 5: 0, 6: 0, 7: 0}
    assert result.evidence["devices_with_affine_cpus"] == [1, 3]
    assert result.evidence["allowed_cpus"] == "0-23"


def test_affinity_passes_for_the_npus_of_the_containers_node(fake_root: Path) -> None:
    result = NpuCpuAffinity().run(affinity_context(fake_root, "0-23", devices=(1, 3)))
    assert result.status is Status.PASS
    assert result.evidence["affinity"] == {1: "0-23", 3: "0-23"} and result.evidence["outside"] == []


def test_affinity_counts_a_partly_allowed_node_as_usable(fake_root: Path) -> None:
    # vllm-ascend binds to the allowed part (and widens to the next NUMA node): some affine CPUs are enough.
    result = NpuCpuAffinity().run(affinity_context(fake_root, "100-110", devices=(4, 6)))
    assert result.status is Status.PASS and result.evidence["allowed_affine"] == {4: 11, 6: 11}


@pytest.mark.parametrize(
    ("topo", "why"),
    [
        ((1, "", "npu-smi: unknown option -t topo"), "no-answer"),
        ((0, "hello\nworld\n", ""), "not-understood"),
        ((0, "NPU0 NPU1\nNPU0 X PIX\nNPU1 PIX X\n", ""), "no-affinity"),
    ],
)
def test_affinity_skips_without_a_usable_topology(fake_root: Path, topo: tuple[int, str, str], why: str) -> None:
    result = NpuCpuAffinity().run(affinity_context(fake_root, "0-23", topo=topo))
    assert result.status is Status.SKIP and result.evidence["topology"] == why


def test_affinity_skips_on_x86_and_on_a3(fake_root: Path) -> None:
    x86 = NpuCpuAffinity().run(affinity_context(fake_root, "0-23", machine="x86_64"))
    assert x86.status is Status.SKIP and x86.evidence == {"arch": "x86_64"}
    ctx = affinity_context(fake_root, "0-23", smi="npu-smi-info_a3-ascend910-2chip_1.txt")
    a3 = NpuCpuAffinity().run(ctx)
    assert a3.status is Status.SKIP and a3.evidence["families"] == ["A3"]
    runner = ctx.probe.runner
    assert isinstance(runner, FakeRunner) and TOPO_KEY not in runner.calls  # nothing asked


def test_npu_affinities_match_rows_to_logical_ids(fake_root: Path) -> None:
    ctx = affinity_context(fake_root, "0-23")
    chips = list(ctx.node.chips)
    # Four rows only: devices 4-7 have no row, so no affinity is claimed for them.
    topo = parse_npu_smi_topo("NPU0  NPU1  NPU2  NPU3  CPU Affinity\n" + "".join(
        f"NPU{i}  " + "  ".join("X" if j == i else "HCCS" for j in range(4)) + f"  {cpus}\n"
        for i, cpus in enumerate(("144-167", "0-23", "144-167", "0-23"))))
    found = npu_affinities(topo, chips, ctx.node.host.allowed_cpus)
    assert [(a.chip.device_id, len(a.affine), len(a.allowed)) for a in found] == [
        (0, 24, 0), (1, 24, 24), (2, 24, 0), (3, 24, 24)]


# --- numa-balancing, swappiness, cpu-governor ---------------------------------------------------------------------


def test_numa_balancing(fake_root: Path) -> None:
    assert NumaBalancing().run(host_context(fake_root)).status is Status.SKIP
    put(fake_root, "/proc/sys/kernel/numa_balancing", "0\n")
    assert NumaBalancing().run(host_context(fake_root)).status is Status.PASS
    put(fake_root, "/proc/sys/kernel/numa_balancing", "1\n")
    result = NumaBalancing().run(host_context(fake_root))
    assert result.status is Status.WARN and result.evidence["value"] == 1
    assert result.remediation is not None and "sysctl -w kernel.numa_balancing=0" in result.remediation


def test_swappiness(fake_root: Path) -> None:
    assert Swappiness().run(host_context(fake_root)).status is Status.SKIP
    put(fake_root, "/proc/sys/vm/swappiness", "0\n")
    assert Swappiness().run(host_context(fake_root)).status is Status.PASS
    put(fake_root, "/proc/sys/vm/swappiness", "60\n")
    result = Swappiness().run(host_context(fake_root))
    assert result.status is Status.WARN and (result.evidence["value"], result.evidence["max"]) == (60, 10)
    assert result.remediation is not None and "sysctl -w vm.swappiness=0" in result.remediation


def governors(root: Path, *values: str) -> None:
    for cpu, value in enumerate(values):
        put(root, f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", f"{value}\n")
    (root / "sys/devices/system/cpu/cpufreq").mkdir(parents=True, exist_ok=True)  # not a cpuN dir: ignored


def test_cpu_governor_passes_when_all_performance(fake_root: Path) -> None:
    governors(fake_root, *["performance"] * 4)
    result = CpuGovernor().run(host_context(fake_root))
    assert result.status is Status.PASS and result.evidence["governors"] == {"performance": 4}


def test_cpu_governor_warns_naming_the_others(fake_root: Path) -> None:
    governors(fake_root, "performance", "powersave", "powersave", "ondemand")
    result = CpuGovernor().run(host_context(fake_root))
    assert result.status is Status.WARN
    assert result.evidence["governors"] == {"ondemand": 1, "performance": 1, "powersave": 2}
    assert result.evidence["examples"] == {"powersave": [1, 2], "ondemand": [3]}
    assert result.remediation is not None and "cpupower frequency-set -g performance" in result.remediation


def test_cpu_governor_skips_without_cpufreq(fake_root: Path) -> None:
    (fake_root / "sys/devices/system/cpu/cpu0").mkdir(parents=True)
    result = CpuGovernor().run(host_context(fake_root))
    assert result.status is Status.SKIP and result.evidence == {"governors": {}}


# --- shm-size ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("total", "status"), [(64 * 1024**2, Status.FAIL), (2 * GIB, Status.WARN),
                                               (16 * GIB, Status.PASS), (None, Status.FAIL)])
def test_shm_size(fake_root: Path, total: int | None, status: Status) -> None:
    ctx = with_host(host_context(fake_root), shm_total_bytes=total, shm_free_bytes=total)
    result = ShmSize().run(ctx)
    assert result.status is status
    if status is not Status.PASS:
        assert result.remediation is not None and "--shm-size=8g" in result.remediation
    if total == 64 * 1024**2:
        assert result.evidence["total_bytes"] < result.evidence["min_bytes"] == GIB


def test_shm_size_reads_the_tree(fake_root: Path) -> None:
    # /dev/shm under the root is a directory of the test's filesystem: its statvfs is what the check sees.
    (fake_root / "dev/shm").mkdir()
    result = ShmSize().run(host_context(fake_root))
    assert result.status is not Status.ERROR and result.evidence["total_bytes"] is not None


# --- free-memory and model-disk -----------------------------------------------------------------------------------


def meminfo(root: Path, total: int, available: int | None) -> None:
    text = f"MemTotal:       {total // 1024} kB\nMemFree:        {total // 2048} kB\n"
    if available is not None:
        text += f"MemAvailable:   {available // 1024} kB\n"
    put(root, "/proc/meminfo", text)


def model(directory: Path, shards: int, shard_bytes: int, suffix: str = "safetensors") -> Path:
    """A model directory with sparse weight shards (their size without the disk)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text("{}", encoding="utf-8")
    for i in range(shards):
        with (directory / f"model-{i + 1:05d}-of-{shards:05d}.{suffix}").open("wb") as f:
            f.truncate(shard_bytes)
    return directory


def test_free_memory_passes(fake_root: Path) -> None:
    meminfo(fake_root, 1536 * GIB, 1400 * GIB)
    result = FreeMemory().run(host_context(fake_root))
    assert result.status is Status.PASS
    assert (result.evidence["available_bytes"], result.evidence["total_bytes"]) == (1400 * GIB, 1536 * GIB)


def test_free_memory_fails_below_the_floor(fake_root: Path) -> None:
    meminfo(fake_root, 16 * GIB, 4 * GIB)
    result = FreeMemory().run(host_context(fake_root))
    assert result.status is Status.FAIL
    assert (result.evidence["available_bytes"], result.evidence["min_bytes"]) == (4 * GIB, 8 * GIB)
    assert "`ps aux --sort=-rss | head`" in (result.remediation or "")


def test_free_memory_warns_below_the_fraction(fake_root: Path) -> None:
    meminfo(fake_root, 1024 * GIB, 50 * GIB)
    result = FreeMemory().run(host_context(fake_root))
    assert result.status is Status.WARN and result.evidence["warn_fraction"] == 0.1
    assert "weights_bytes" not in result.evidence  # the fraction warned, not a model


def test_free_memory_warns_when_the_weights_do_not_fit(fake_root: Path, tmp_path: Path) -> None:
    meminfo(fake_root, 64 * GIB, 60 * GIB)
    model(fake_root / "models/qwen", 4, 20 * GIB)
    ctx = host_context(fake_root, options=DoctorOptions(model_dir=Path("/models/qwen")))
    result = FreeMemory().run(ctx)
    assert result.status is Status.WARN and result.evidence["available_bytes"] == 60 * GIB
    assert result.evidence["weights_bytes"] == 80 * GIB and result.evidence["model_dir"] == "/models/qwen"


def test_free_memory_skips_without_memavailable(fake_root: Path) -> None:
    meminfo(fake_root, 64 * GIB, None)
    result = FreeMemory().run(host_context(fake_root))
    assert result.status is Status.SKIP and result.evidence["available_bytes"] is None


def test_model_weights_prefers_safetensors_and_follows_links(tmp_path: Path) -> None:
    directory = model(tmp_path / "m", 2, 1000)
    (directory / "pytorch_model.bin").write_bytes(b"x" * 5000)  # both formats: vLLM loads the safetensors
    (directory / ".cache").mkdir()
    (directory / ".cache" / "partial.safetensors").write_bytes(b"x" * 7)
    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 300)
    (directory / "extra.safetensors").symlink_to(blob)
    weights = model_weights(directory)
    assert (weights.files, weights.bytes, weights.kind) == (3, 2300, "safetensors")
    only_bin = model(tmp_path / "b", 1, 4096, "bin")
    assert model_weights(only_bin).kind == "bin"


def test_model_disk_skips_without_a_model_dir(fake_root: Path) -> None:
    result = ModelDisk().run(host_context(fake_root))
    assert result.status is Status.SKIP
    assert result.remediation is not None and "--model-dir" in result.remediation


def test_model_disk_fails_on_a_missing_dir_naming_it(fake_root: Path) -> None:
    ctx = host_context(fake_root, options=DoctorOptions(model_dir=Path("/models/missing")))
    result = ModelDisk().run(ctx)
    assert result.status is Status.FAIL and result.evidence == {"model_dir": "/models/missing", "exists": False}
    assert "download the model to /models/missing" in (result.remediation or "")


def test_model_disk_fails_on_a_file(fake_root: Path) -> None:
    put(fake_root, "/models/model.safetensors", "")
    options = DoctorOptions(model_dir=Path("/models/model.safetensors"))
    result = ModelDisk().run(host_context(fake_root, options=options))
    assert result.status is Status.FAIL
    assert result.evidence == {"model_dir": "/models/model.safetensors", "is_dir": False}


def test_model_disk_passes_with_weights_and_room(fake_root: Path) -> None:
    model(fake_root / "models/qwen", 2, 3 * GIB)
    ctx = host_context(fake_root, options=DoctorOptions(model_dir=Path("/models/qwen")))
    ctx._thresholds = {"model_disk_min_free_bytes": 1}
    result = ModelDisk().run(ctx)
    assert result.status is Status.PASS
    assert {k: result.evidence[k] for k in ("model_dir", "weight_files", "weights_bytes", "weight_format")} == {
        "model_dir": "/models/qwen", "weight_files": 2, "weights_bytes": 6 * GIB, "weight_format": "safetensors"}


def test_model_disk_warns_on_little_free_space(fake_root: Path) -> None:
    model(fake_root / "models/qwen", 1, 1024)
    ctx = host_context(fake_root, options=DoctorOptions(model_dir=Path("/models/qwen")))
    ctx._thresholds = {"model_disk_min_free_bytes": 1 << 60}
    result = ModelDisk().run(ctx)
    assert result.status is Status.WARN and result.evidence["weight_files"] == 1
    assert result.evidence["free_bytes"] < result.evidence["min_free_bytes"] == 1 << 60


def test_model_disk_warns_on_a_dir_without_weights(fake_root: Path) -> None:
    put(fake_root, "/models/empty/config.json", "{}")
    result = ModelDisk().run(host_context(fake_root, options=DoctorOptions(model_dir=Path("/models/empty"))))
    assert result.status is Status.WARN and result.evidence["weight_files"] == 0


def test_model_disk_resolves_a_relative_dir_against_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model(tmp_path / "work/qwen", 1, 1024)
    monkeypatch.chdir(tmp_path / "work")
    ctx = host_context(Path("/"), options=DoctorOptions(model_dir=Path("qwen")))
    ctx._thresholds = {"model_disk_min_free_bytes": 1}
    result = ModelDisk().run(ctx)
    assert result.status is Status.PASS and result.evidence["model_dir"] == "qwen"


# --- open-files --------------------------------------------------------------------------------------------------


def test_open_files_warns_on_a_low_soft_limit(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_checks.resource, "getrlimit", lambda which: (1024, 4096))
    result = OpenFiles().run(host_context(fake_root))
    assert result.status is Status.WARN
    assert (result.evidence["soft"], result.evidence["hard"], result.evidence["min"]) == (1024, 4096, 65535)
    assert "LimitNOFILE=65535" in (result.remediation or "")  # the unit setting to add
    assert "(the hard limit 4096 too)" in (result.remediation or "")  # a soft limit cannot pass the hard one


def test_open_files_passes(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_checks.resource, "getrlimit", lambda which: (1048576, 1048576))
    assert OpenFiles().run(host_context(fake_root)).status is Status.PASS
    monkeypatch.setattr(host_checks.resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    result = OpenFiles().run(host_context(fake_root))
    assert result.status is Status.PASS and result.evidence["soft"] == "unlimited"


# --- on this machine, as it is ----------------------------------------------------------------------------------


def test_host_checks_on_this_machine_never_error(tmp_path: Path) -> None:
    checks = [c for c in discover_checks() if c.id in HOST_IDS]
    model(tmp_path / "model", 1, 4096)
    ctx = CheckContext(Probe(Settings(environ=dict(os.environ))), DoctorOptions(model_dir=tmp_path / "model"))
    report = run_checks(checks, ctx)
    by_id = {o.check_id: o.result for o in report.outcomes}
    assert all(r.status is not Status.ERROR for r in by_id.values()), by_id
    if not ctx.node.has_npus:
        assert by_id["cpuset-per-npu"].status is Status.SKIP
    # Every host has /proc/meminfo and a /dev/shm: these answer for real.
    assert by_id["free-memory"].status is not Status.SKIP
    assert by_id["shm-size"].evidence["total_bytes"] is not None
