"""`npuops provision --host localhost`-style runs with real Ansible (ansible-runner) on this machine, installing the
vendor-style `.run` packages the tests build with makeself (tests/support/vendor_installers.py) into a temp dir.

Every path the roles touch is an inventory variable pointed into the test's directory (install path, staging, state,
boot id, env and profile files, sysctl/limits files, the install record via the installers' environment), so the
machine's own /usr/local/Ascend, /etc and /var are never written. Users are not managed here (that runs on the
fleet's throwaway hosts).

One sequential story, as an operator lives it:
  --check on a fresh target (nothing on disk, every installer listed) -> install (driver and firmware: the host stops,
  "reboot-required") -> "reboot" (a new boot id) -> the run goes on (CANN, environment, tuning, the doctor) -> one
  package bumped: only it is copied and re-runs, nothing else changes (the converged node's idempotence check) -> an
  installer that fails mid-run: a failed host with the installer's message; fixed, the re-run converges -> a package
  whose checksum differs: refused before anything runs, nothing changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from npuops.provision.run import router_requirement
from tests.support.npuops_cli import npuops, package_dir
from tests.support.paths import REPO
from tests.support.provision_target import CANN, NOT_PYTHON, Target
from tests.support.vendor_installers import build_installer, build_package_set, makeself_available

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not makeself_available():
        pytest.fail("makeself is not installed (apt-get install makeself; scripts/test.sh does it)")
    out = tmp_path_factory.mktemp("built")
    return {kind: path for kind, path in build_package_set(out, cann=CANN).items()}


def test_a_node_from_nothing_to_converged_and_back(built: dict[str, Path], tmp_path: Path) -> None:
    target = Target(tmp_path / "node")
    packages = package_dir(tmp_path, list(built.values()))

    # --check on a fresh target: nothing changes on disk, every installer is listed.
    before = target.snapshot()
    rc, host, _ = target.provision(packages, "--tags", NOT_PYTHON, "--check")
    assert rc == 0 and host["status"] == "ok", host
    pending = " ".join(host["would_run"])
    for path in built.values():
        assert path.name in pending, (path.name, host["would_run"])
    assert target.snapshot() == before
    assert not target.install_path.exists()

    # The first real run installs the driver and the firmware, then stops the host: it must reboot first.
    rc, host, _ = target.provision(packages, "--tags", NOT_PYTHON)
    assert rc == 1 and host["status"] == "reboot-required", host
    assert "reboot" in host["message"].lower()
    assert host["versions"]["driver"] == {"before": None, "after": "25.2.0"}
    assert (target.install_path / "driver/version.info").is_file()
    assert not (target.install_path / "ascend-toolkit").exists()  # nothing after the driver ran

    # Running again without a reboot still stops there.
    rc, host, _ = target.provision(packages, "--tags", NOT_PYTHON)
    assert host["status"] == "reboot-required" and host["changed"] == 0

    # After the reboot the run goes on: CANN, the environment, tuning, the doctor.
    target.reboot()
    rc, host, _ = target.provision(packages, "--tags", NOT_PYTHON)
    assert rc == 0 and host["status"] == "ok", (host["message"], host.get("failed_task"))
    versions = host["versions"]
    assert versions["cann"] == {"before": None, "after": CANN}
    assert versions["kernels"]["after"] == CANN and versions["nnal"]["after"] == CANN
    assert versions["driver"] == {"before": "25.2.0", "after": "25.2.0"}
    env_file = (tmp_path / "node/etc/npuops/ascend.env").read_text()
    assert f'ASCEND_HOME_PATH="{target.install_path}/ascend-toolkit/latest"' in env_file
    assert "ATB_HOME_PATH=" in env_file and 'OMP_NUM_THREADS="1"' in env_file
    assert "export ASCEND_TOOLKIT_HOME=" in (tmp_path / "node/etc/profile.d/npuops-ascend.sh").read_text()
    assert host["doctor"]["ok"] is not None  # the doctor ran on the host and came back
    # ... with the environment the services get (the env file the environment role wrote).
    assert "ascend-env" not in host["doctor"]["failed"] and "nnal-version" not in host["doctor"]["failed"]
    node = json.loads(npuops("--ascend-root", str(target.install_path), "node", "--json").stdout)
    assert node["cann"]["toolkit"]["version"] == CANN and node["cann"]["nnal"]["version"] == CANN

    # One package bumped (NNAL) on the converged node: only it is copied and installed again, nothing else changes.
    # This run is also the idempotence check of the converged node: every task but those two would change here
    # too if it changed on each run. (The copy of unchanged packages changes nothing: the run without a reboot
    # above; the NNAL installer at an unchanged version does not run: test_provision_reboot.py's second run.)
    nnal = build_installer("nnal", "8.2.RC2", tmp_path / "bumped")
    bumped = package_dir(tmp_path, [p for k, p in built.items() if k != "nnal"] + [nnal])
    rc, host, _ = target.provision(bumped, "--tags", NOT_PYTHON)
    assert rc == 0, host
    assert host["versions"]["nnal"] == {"before": CANN, "after": "8.2.RC2"}
    for component in ("driver", "firmware", "cann", "kernels"):
        assert host["versions"][component]["before"] == host["versions"][component]["after"]
    expected = ["Preflight | copy the packages to the host",
                "CANN | run the NNAL installer in the toolkit's environment"]
    assert host["changed_tasks"] == expected, host["changed_tasks"]

    # An installer that fails mid-run: a failed host with the installer's own message; fixed, the re-run converges.
    toolkit = build_installer("toolkit", "8.2.RC2", tmp_path / "next")
    kernels = build_installer("kernels", "8.2.RC2", tmp_path / "next")
    upgrade = package_dir(tmp_path, [built["driver"], built["firmware"], toolkit, kernels, nnal])
    target.write_inventory(npuops_installer_environment={
        **target.host_vars["npuops_installer_environment"], "NPUOPS_TEST_FAIL_TOOLKIT": "1"})
    rc, host, _ = target.provision(upgrade, "--tags", NOT_PYTHON)
    assert rc == 1 and host["status"] == "failed", host
    assert host["failed_task"]["role"] == "cann" and host["message"], host
    # Which installer failed and how: the old check ("8.2.RC2" or "install" anywhere) passed on any message.
    assert "Ascend-cann-toolkit_8.2.RC2_linux-x86_64.run --install" in host["message"], host["message"]
    assert "exited 1" in host["message"], host["message"]
    target.write_inventory()
    rc, host, _ = target.provision(upgrade, "--tags", NOT_PYTHON)
    assert rc == 0 and host["versions"]["cann"]["after"] == "8.2.RC2", host

    # A package whose checksum differs is refused before any host is touched.
    state = target.snapshot()
    with open(upgrade / nnal.name, "ab") as f:
        f.write(b"\0")
    rc, report, _ = target.provision(upgrade, "--tags", NOT_PYTHON)
    assert rc == 3 and "does not match its sha256" in report["error"]["problem"], report
    assert target.snapshot() == state


def test_the_python_role_builds_the_serving_venv_from_a_wheelhouse(tmp_path: Path) -> None:
    """Air-gapped: the wheelhouse (--packages with wheels and SHA256SUMS) holds npuops, the router (vllm-router at
    compat.toml's pin) and everything they need; the role makes the venv, installs with --no-index, runs pip check
    and a smoke import (the router's Rust extension too), and the verify role then runs the freshly installed
    npuops's doctor on the host.

    The row here is empty (npuops_stack_pins: [] in the inventory): a real row (torch, torch_npu, vllm,
    vllm-ascend) cannot be installed on a machine without CANN, where torch_npu does not even import.
    """
    wheelhouse = tmp_path / "wheelhouse"
    router = router_requirement()  # e.g. vllm-router==0.1.17
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w",
                            str(wheelhouse), str(REPO), router], capture_output=True, text=True, timeout=900,
                           check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    assert any(p.name.startswith("npuops-") for p in wheelhouse.glob("*.whl"))
    assert list(wheelhouse.glob("vllm_router-*.whl")), sorted(p.name for p in wheelhouse.iterdir())
    # (Without the router's wheel the run is refused on the controller: test_packages.py, no Ansible needed.)
    assert npuops("packages", "index", str(wheelhouse)).returncode == 0

    target = Target(tmp_path / "node")
    venv = tmp_path / "node/opt/npuops/venv"
    del target.host_vars["npuops_doctor_command"]  # the role's default: the venv's own npuops
    target.write_inventory(npuops_venv=str(venv), npuops_stack_pins=[], npuops_smoke_imports=["npuops"],
                           npuops_venv_python=getattr(sys, "_base_executable", sys.executable))
    rc, host, _ = target.provision(wheelhouse, "--tags", "python,verify")
    assert rc == 0 and host["status"] == "ok", (host["message"], host.get("failed_task"))
    assert (venv / "bin/npuops").exists()
    stack = host["versions"]["python_stack"]
    assert "npuops" in stack["after"]
    assert stack["after"].get("vllm-router") == router.split("==")[1] and "vllm-router" not in stack["before"], stack
    # The router imports from the serving venv, its Rust extension with it (the bare package imports without it).
    imported = subprocess.run([str(venv / "bin/python"), "-c", "from vllm_router import Router; print(Router)"],
                              capture_output=True, text=True, timeout=120, check=False)
    assert imported.returncode == 0 and "Router" in imported.stdout, imported.stderr[-2000:]
    assert host["doctor"]["ok"] is not None and "total" in host["doctor"]  # the venv's npuops answered

    rc, host, _ = target.provision(wheelhouse, "--tags", "python,verify")
    assert rc == 0 and host["changed"] == 0, host["changed_tasks"]


def test_without_a_stack_row_the_python_role_says_how_to_choose_one(tmp_path: Path) -> None:
    target = Target(tmp_path / "node")
    empty = tmp_path / "empty-packages"
    empty.mkdir()
    (empty / "SHA256SUMS").write_text("")
    rc, host, _ = target.provision(empty, "--tags", "python")
    assert rc == 1 and host["status"] == "failed"
    assert "no stack row" in host["message"] and "--stack" in host["message"]
    assert not (tmp_path / "node/opt").exists()
    # A row that does not exist is refused on the controller, before any host is touched.
    proc = npuops("provision", "-i", str(target.inventory), "--stack", "0.0.1", "--tags", "python")
    assert proc.returncode == 3 and "no stack row '0.0.1'" in proc.stderr and proc.stderr.count("\n") == 1


def test_cann_85_installs_in_the_new_layout(tmp_path: Path) -> None:
    """From CANN 8.5 the toolkit lives in <install path>/cann and the kernels are an "ops" package recorded in
    ascend_ops_install.info: the role reads and installs that layout too, and npuops reads the result."""
    built = build_package_set(tmp_path / "built", cann="8.5.0")
    packages = package_dir(tmp_path, [built[k] for k in ("toolkit", "ops", "nnal")])  # type: ignore[index]
    target = Target(tmp_path / "node")
    rc, host, _ = target.provision(packages, "--tags", "cann,environment")
    assert rc == 0 and host["status"] == "ok", (host["message"], host.get("failed_task"))
    assert {k: host["versions"][k]["after"] for k in ("cann", "kernels", "nnal")} == dict.fromkeys(
        ("cann", "kernels", "nnal"), "8.5.0")
    env_file = (tmp_path / "node/etc/npuops/ascend.env").read_text()
    assert f"{target.install_path}/cann" in env_file
    node = json.loads(npuops("--ascend-root", str(target.install_path), "node", "--json").stdout)
    assert node["cann"]["layout"] == "cann" and node["cann"]["kernels"]["version"] == "8.5.0"
    rc, host, _ = target.provision(packages, "--tags", "cann,environment")
    assert rc == 0 and host["changed"] == 0, host["changed_tasks"]
