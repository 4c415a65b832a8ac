"""`npuops provision --allow-reboot` on an SSH test host whose init is real systemd (tests/support/systemd_host.py):
the new driver and firmware need a reboot, Ansible's reboot module orders it (`shutdown -r` on the host), the host's
systemd goes down and is booted again by the harness (sshd comes back as one of its units, with a new boot id),
and the same run goes on to install CANN and converge. A second run changes nothing and reboots nothing.

The host is a throwaway overlay of this machine's root, so the roles write their default paths
(/usr/local/Ascend, /etc/npuops, ...); the installers allow real paths through `npuops_installer_environment`.
The kernel build directory and dkms are stand-ins (no kernel headers here), as in test_provision_local.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine import engine_python_or_skip
from tests.support.npuops_cli import npuops, package_dir
from tests.support.paths import REPO
from tests.support.provision_target import CANN, NOT_PYTHON
from tests.support.systemd import install_npuops, unavailable_reason
from tests.support.systemd_host import SystemdFleet, SystemdSshHost
from tests.support.vendor_installers import build_package_set, makeself_available

pytestmark = [pytest.mark.slow, pytest.mark.systemd, pytest.mark.engine]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[SystemdFleet]:
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("NPUOPS_REQUIRE_SYSTEMD") == "1":
            pytest.fail(f"NPUOPS_REQUIRE_SYSTEMD=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    engine_python = engine_python_or_skip()
    booted = SystemdFleet(tmp_path / "fleet").start()
    try:
        # The doctor the verify role runs on the host: npuops in the serving venv (under /opt), as provisioning's
        # python role leaves it; the host's /tmp is its own, so this checkout's venv may not be there.
        install_npuops(booted.hosts[0].systemd, engine_python, REPO)
        yield booted
    finally:
        booted.close()


def provision(inventory: Path, packages: Path, artifacts: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = npuops("provision", "-i", str(inventory), "--packages", str(packages), "--no-hardware-check",
                  "--tags", NOT_PYTHON, "--artifacts", str(artifacts), "--json", *args, timeout=1800)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(
            f"no JSON report (rc {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}") from None
    return proc.returncode, report


def test_allow_reboot_reboots_the_host_and_the_same_run_converges(fleet: SystemdFleet, tmp_path: Path) -> None:
    host: SystemdSshHost = fleet.hosts[0]
    if not makeself_available():
        pytest.fail("makeself is not installed (apt-get install makeself; scripts/test.sh does it)")
    packages = package_dir(tmp_path, list(build_package_set(tmp_path / "built", cann=CANN).values()))
    host.systemd.check(["mkdir", "-p", "/srv/kbuild"])
    host.systemd.check(["sh", "-c", "printf '#!/bin/sh\\n' > /srv/dkms && chmod 755 /srv/dkms"])
    inventory = fleet.inventory(tmp_path / "inventory.yml", {
        "npuops_installer_environment": {"NPUOPS_TEST_ALLOW_REAL_PATHS": "1"},
        "npuops_kernel_build_dir": "/srv/kbuild", "npuops_dkms_path": "/srv/dkms", "npuops_min_free_gb": 1,
        "npuops_sysctl_apply": False, "npuops_tune_governor": False,
        "npuops_doctor_command": str(engine_python_or_skip().parent / "npuops"),
        "npuops_doctor_timer_command": str(engine_python_or_skip().parent / "npuops"),
        "npuops_reboot_timeout_s": 300,
    })
    boot_before, boots_before = host.boot_id(), host.systemd.boots

    rc, report = provision(inventory, packages, tmp_path / "artifacts", "--allow-reboot")
    result = report["hosts"][host.name]
    assert rc == 0 and result["status"] == "ok", (result.get("message"), result.get("failed_task"))
    # The host was rebooted once, by the run: its systemd booted again, with a new boot id.
    assert host.systemd.boots == boots_before + 1
    assert host.boot_id() != boot_before
    assert any("reboot for the new driver or firmware" in task for task in result["changed_tasks"]), result
    # ... and the run went on after it: the driver, then CANN, the environment and the doctor.
    versions = result["versions"]
    assert versions["driver"] == {"before": None, "after": "25.2.0"}
    assert versions["cann"] == {"before": None, "after": CANN}
    assert host.systemd.run(["test", "-e", "/var/lib/npuops/reboot-required"]).returncode != 0
    env_file = host.systemd.check(["cat", "/etc/npuops/ascend.env"])
    assert 'ASCEND_HOME_PATH="/usr/local/Ascend/ascend-toolkit/latest"' in env_file
    assert result["doctor"]["ok"] is not None
    # The monitoring role: npuops-doctor.timer enabled and running; its service writes the doctor's textfile for
    # node_exporter (the hardened oneshot runs under this host's real systemd).
    textfile = "/var/lib/prometheus/node-exporter/npuops-doctor.prom"
    assert result["doctor_timer"] == {"installed": True, "textfile": textfile}, result.get("doctor_timer")
    assert host.systemd.check(["systemctl", "is-enabled", "npuops-doctor.timer"]).strip() == "enabled"
    assert host.systemd.check(["systemctl", "is-active", "npuops-doctor.timer"]).strip() == "active"
    host.systemd.check(["systemctl", "start", "npuops-doctor.service"])
    written = host.systemd.check(["cat", textfile])
    assert 'npuops_check_status{area="' in written and "npuops_doctor_ok" in written
    assert host.systemd.check(["systemctl", "show", "-p", "Result", "npuops-doctor.service"]).strip() == (
        "Result=success")  # the doctor's exit 1 (checks failed: no NPU here) is its verdict, not the unit's failure

    # Converged: a second run changes nothing and does not reboot.
    rc, report = provision(inventory, packages, tmp_path / "artifacts", "--allow-reboot")
    again = report["hosts"][host.name]
    assert rc == 0 and again["changed"] == 0, again["changed_tasks"]
    assert host.systemd.boots == boots_before + 1
