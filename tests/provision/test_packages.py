"""Package files by name (the vendor patterns and their real variants), SHA256SUMS, and the refusal of a package
whose checksum differs — before any host is touched."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuops.datafiles import load_data_toml
from npuops.errors import BadInputError
from npuops.provision.packages import (
    classify_package,
    index_packages,
    missing_wheels,
    parse_sha256sums,
    render_sha256sums,
    verify_packages,
    wheel_distribution,
)
from npuops.provision.run import (
    ProvisionOptions,
    build_extravars,
    choose_row,
    plan_provision,
    router_requirement,
    stack_pins,
)
from tests.support.npuops_cli import npuops
from tests.support.paths import REPO

# Real file names (Huawei's download site as ascend-deployer and the download lists of vllm-ascend's docs for
# 8.0.RC2/8.2.RC1 name them).
NAMES = {
    "Ascend-hdk-910b-npu-driver_25.0.rc1.1_linux-x86-64.run": ("driver", "25.0.rc1.1", "x86_64", "910b"),
    "Ascend-hdk-910b-npu-driver_25.0.rc1.1_linux-aarch64.run": ("driver", "25.0.rc1.1", "aarch64", "910b"),
    "Ascend-hdk-910b-npu-firmware_7.7.0.1.231.run": ("firmware", "7.7.0.1.231", None, "910b"),
    "Ascend-hdk-310p-npu-firmware_7.7.0.1.231.run": ("firmware", "7.7.0.1.231", None, "310p"),
    "Ascend-cann-toolkit_8.2.RC1_linux-x86_64.run": ("toolkit", "8.2.RC1", "x86_64", None),
    "Ascend-cann-kernels-910b_8.2.RC1_linux-aarch64.run": ("kernels", "8.2.RC1", "aarch64", "910b"),
    "Ascend-cann-kernels-310p_8.0.RC2.alpha002_linux.run": ("kernels", "8.0.RC2.alpha002", None, "310p"),
    "Atlas-A3-cann-kernels_8.2.RC1_linux-aarch64.run": ("kernels", "8.2.RC1", "aarch64", "Atlas-A3"),
    "Ascend-cann-910b-ops_8.5.0_linux-x86_64.run": ("kernels", "8.5.0", "x86_64", "910b"),
    "Ascend-cann-nnal_8.2.RC1_linux-x86_64.run": ("nnal", "8.2.RC1", "x86_64", None),
}


@pytest.mark.parametrize(("name", "expected"), sorted(NAMES.items()))
def test_vendor_names(name: str, expected: tuple[str, str, str | None, str | None]) -> None:
    package = classify_package(name)
    assert package is not None
    assert (package.kind, package.version, package.arch, package.chip) == expected


@pytest.mark.parametrize("name", ["Ascend-cann-toolkit_8.2.RC1_linux-x86_64.tar.gz", "driver.run", "README.md",
                                  "Ascend-cann-toolkit.run", "Ascend-hdk-910b-npu-driver_25.0_linux-sparc.run"])
def test_other_names_are_not_packages(name: str) -> None:
    assert classify_package(name) is None


def test_sha256sums_round_trip_and_the_sha256sum_tool_format() -> None:
    sums = {"b.run": "a" * 64, "a.whl": "B" * 64}
    text = render_sha256sums({k: v.lower() for k, v in sums.items()})
    assert text.splitlines()[0] == f"{'b' * 64}  a.whl"
    assert parse_sha256sums(text) == {k: v.lower() for k, v in sums.items()}
    assert parse_sha256sums(f"{'c' * 64} *binary-mode.run\n") == {"binary-mode.run": "c" * 64}
    for bad in ("nothex  x.run", f"{'a' * 63}  x.run", f"{'a' * 64}  ../x.run"):
        with pytest.raises(BadInputError, match="npuops packages index"):
            parse_sha256sums(bad)


@given(st.text(max_size=200))
def test_parse_sha256sums_only_raises_bad_input(text: str) -> None:
    with contextlib.suppress(BadInputError):
        parse_sha256sums(text)


def _package_dir(tmp_path: Path) -> Path:
    d = tmp_path / "packages"
    d.mkdir()
    for name in ("Ascend-cann-toolkit_8.2.RC1_linux-x86_64.run", "Ascend-cann-nnal_8.2.RC1_linux-x86_64.run",
                 "Ascend-cann-toolkit_8.2.RC1_linux-aarch64.run"):
        (d / name).write_bytes(f"#!/bin/sh\n# {name}\n".encode())
    (d / "npuops-0.1.0-py3-none-any.whl").write_bytes(b"PK wheel")
    return d


def test_index_then_verify(tmp_path: Path) -> None:
    d = _package_dir(tmp_path)
    sums = index_packages(d)
    manifest = (d / "SHA256SUMS").read_text()
    assert sums["Ascend-cann-nnal_8.2.RC1_linux-x86_64.run"] == hashlib.sha256(
        (d / "Ascend-cann-nnal_8.2.RC1_linux-x86_64.run").read_bytes()).hexdigest()
    assert len(manifest.splitlines()) == 4
    verified = verify_packages(d, arch="x86_64")
    assert sorted(verified.packages) == ["nnal", "toolkit"]
    assert verified.packages["toolkit"].file.arch == "x86_64"  # the aarch64 one is for other hosts
    assert [w.name for w in verified.wheels] == ["npuops-0.1.0-py3-none-any.whl"]
    assert verified.versions() == {"toolkit": "8.2.RC1", "nnal": "8.2.RC1"}


def test_a_changed_package_is_refused(tmp_path: Path) -> None:
    d = _package_dir(tmp_path)
    index_packages(d)
    with open(d / "Ascend-cann-nnal_8.2.RC1_linux-x86_64.run", "ab") as f:
        f.write(b"tampered")
    with pytest.raises(BadInputError, match="does not match its sha256"):
        verify_packages(d)


def test_unlisted_missing_and_duplicate_packages_are_refused(tmp_path: Path) -> None:
    d = _package_dir(tmp_path)
    with pytest.raises(BadInputError, match="SHA256SUMS is missing"):
        verify_packages(d)
    index_packages(d)
    with pytest.raises(BadInputError, match="--arch"):
        verify_packages(d)  # toolkits for x86_64 and aarch64: which?
    (d / "Ascend-cann-nnal_8.3.RC1_linux-x86_64.run").write_text("new")
    with pytest.raises(BadInputError, match="not listed"):
        verify_packages(d)
    index_packages(d)
    with pytest.raises(BadInputError, match="two nnal packages"):
        verify_packages(d, arch="x86_64")
    (d / "Ascend-cann-nnal_8.3.RC1_linux-x86_64.run").unlink()
    with pytest.raises(BadInputError, match="file is missing"):
        verify_packages(d, arch="x86_64")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match=r"no \.run or \.whl"):
        index_packages(tmp_path / "empty")


def test_stack_rows() -> None:
    row = choose_row("0.9.1", None)
    assert row is not None and stack_pins(row)[:2] == ["torch==2.5.1", "torch-npu==2.5.1.post1"]
    by_cann = choose_row(None, "8.2.RC1")
    assert by_cann is not None and by_cann["cann"] == "8.2.RC1"
    assert choose_row(None, None) is None and choose_row(None, "1.0.0") is None
    with pytest.raises(BadInputError, match="no stack row"):
        choose_row("0.0.1", None)


# --- the wheelhouse: every pinned requirement npuops knows must have its wheel there (--no-index) ----------------

ROUTER_WHEEL = "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize(("name", "expected"), [
    (ROUTER_WHEEL, ("vllm-router", "0.1.17")),
    ("torch_npu-2.5.1.post1-cp311-cp311-manylinux_2_17_aarch64.whl", ("torch-npu", "2.5.1.post1")),
    ("torch-2.5.1+cpu-cp311-cp311-linux_x86_64.whl", ("torch", "2.5.1+cpu")),
    ("npuops-0.1.0-py3-none-any.whl", ("npuops", "0.1.0")),
    ("Vllm_Ascend-0.9.1-1-cp311-cp311-linux_aarch64.whl", ("vllm-ascend", "0.9.1")),  # a build tag
    ("npuops-0.1.0.tar.gz", None), ("README.whl", None),
])
def test_wheel_file_names(name: str, expected: tuple[str, str] | None) -> None:
    assert wheel_distribution(name) == expected


def test_missing_wheels_by_name_and_exact_version() -> None:
    wheels = [ROUTER_WHEEL, "torch-2.5.1+cpu-cp311-cp311-linux_x86_64.whl", "npuops-0.1.0-py3-none-any.whl"]
    assert missing_wheels(["vllm-router==0.1.17", "vllm_router == 0.1.17", "VLLM.Router", "npuops"], wheels) == []
    assert missing_wheels(["vllm-router==0.1.18"], wheels) == ["vllm-router==0.1.18"]
    assert missing_wheels(["torch==2.5.1", "torch==2.5.1+cpu"], wheels) == []  # a local build serves ==2.5.1
    assert missing_wheels(["torch==2.5.1+cu121", "torch-npu==2.5.1", "vllm"], wheels) == [
        "torch==2.5.1+cu121", "torch-npu==2.5.1", "vllm"]
    # What npuops cannot match against file names is pip's to judge on the host.
    assert missing_wheels(["vllm>=0.9", "vllm[audio]==0.9.1", "x; python_version<'3'", "dist/x.whl"], wheels) == []


def test_the_router_pin_is_compat_toml_s_and_reaches_the_role() -> None:
    version = load_data_toml("compat.toml")["router"]["vllm_router"]
    assert router_requirement() == f"vllm-router=={version}"
    options = ProvisionOptions(inventory=["localhost"], artifacts_dir=Path("/nonexistent"))
    assert build_extravars(options, None, None, ["python"])["npuops_router_pin"] == router_requirement()
    assert f"`{router_requirement()}`" in (REPO / "README.md").read_text()  # the provision section says which


def _wheelhouse(tmp_path: Path, *names: str) -> Path:
    d = tmp_path / "wheelhouse"
    d.mkdir()
    for name in names:
        (d / name).write_bytes(b"PK wheel")
    index_packages(d)
    return d


def _plan(packages: Path, **options: object) -> None:
    plan_provision(ProvisionOptions(inventory=["localhost"], artifacts_dir=Path("/nonexistent"),
                                    packages_dir=packages, **options))  # type: ignore[arg-type]


def test_a_wheelhouse_without_the_router_is_refused_before_anything_runs(tmp_path: Path) -> None:
    d = _wheelhouse(tmp_path, "npuops-0.1.0-py3-none-any.whl")
    with pytest.raises(BadInputError) as refused:
        _plan(d)
    assert router_requirement() in refused.value.problem and "--no-index" in refused.value.problem
    assert f"pip download -d {d} {router_requirement()}" in refused.value.fix
    assert f"npuops packages index {d}" in refused.value.fix
    _plan(d, tags=("cann", "environment"))  # the python role does not run: no wheel is wanted
    _plan(d, extravars={"npuops_router_requirement": ""})  # no router wanted (a fleet that serves nothing)


def test_a_wheelhouse_with_the_router_passes_and_the_row_s_pins_are_checked_alike(tmp_path: Path) -> None:
    router = f"vllm_router-{router_requirement().split('==')[1]}-cp38-abi3-manylinux_2_28_x86_64.whl"
    d = _wheelhouse(tmp_path, "npuops-0.1.0-py3-none-any.whl", router)
    _plan(d)
    with pytest.raises(BadInputError, match=r"no wheel for torch==2\.5\.1, torch-npu==2\.5\.1\.post1, vllm==0\.9\.1, "
                                            r"vllm-ascend==0\.9\.1 \("):
        _plan(d, stack="0.9.1")


def test_packages_without_wheels_install_from_the_index(tmp_path: Path) -> None:
    d = _package_dir(tmp_path)
    (d / "npuops-0.1.0-py3-none-any.whl").unlink()
    index_packages(d)
    _plan(d, arch="x86_64", stack="0.9.1")  # no wheelhouse: nothing to check on the controller


def test_the_cli_refuses_a_wheelhouse_without_the_router_in_one_line(tmp_path: Path) -> None:
    d = _wheelhouse(tmp_path, "npuops-0.1.0-py3-none-any.whl")
    proc = npuops("provision", "--host", "localhost", "--packages", str(d), "--tags", "python",
                  "--artifacts", str(tmp_path / "artifacts"))
    assert proc.returncode == 3, proc.stderr
    assert router_requirement() in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "artifacts").exists()  # refused before ansible-runner ran
