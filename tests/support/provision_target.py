"""This machine as a provisioning target whose every path lies under a test's directory (inventory variables point
the roles' install path, staging, state, boot id, env, profile, sysctl and limits files into it)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.support.npuops_cli import npuops

# The CANN of the package set the provisioning tests build, and every role but the python one.
CANN = "8.2.RC1"
NOT_PYTHON = "preflight,driver,cann,environment,tuning,monitoring,verify"


class Target:
    """This machine as a provisioning target whose every path lies under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.install_path = root / "Ascend"
        self.boot_id = root / "boot_id"
        self.inventory = root / "inventory.yml"
        self.artifacts = root / "artifacts"
        (root / "kbuild").mkdir(parents=True)
        (root / "dkms").write_text("#!/bin/sh\n")
        self.reboot()
        host_vars: dict[str, Any] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "npuops_install_path": str(self.install_path),
            "npuops_staging_dir": str(root / "staging"),
            "npuops_state_dir": str(root / "var/lib/npuops"),
            "npuops_boot_id_file": str(self.boot_id),
            "npuops_manage_users": False,
            "npuops_kernel_build_dir": str(root / "kbuild"),
            "npuops_dkms_path": str(root / "dkms"),
            "npuops_min_free_gb": 1,
            "npuops_env_file": str(root / "etc/npuops/ascend.env"),
            "npuops_profile_script": str(root / "etc/profile.d/npuops-ascend.sh"),
            "npuops_installer_environment": {"ASCEND_INSTALL_INFO": str(root / "etc/ascend_install.info"),
                                             "NPUOPS_TEST_ASCEND_LOG_DIR": str(root / "var/log/ascend_seclog")},
            "npuops_sysctl_file": str(root / "etc/sysctl.d/90-npuops.conf"),
            "npuops_sysctl_apply": False,
            "npuops_limits_file": str(root / "etc/security/limits.d/90-npuops.conf"),
            "npuops_tune_governor": False,
            # The doctor of this checkout, run on the target after the install.
            "npuops_doctor_command": str(Path(sys.executable).parent / "npuops"),
        }
        self.host_vars = host_vars
        self.write_inventory()

    def write_inventory(self, **extra: Any) -> None:
        self.inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {**self.host_vars, **extra}}}}))

    def reboot(self) -> None:
        self.boot_id.write_text(f"{uuid.uuid4()}\n")

    def provision(self, packages: Path, *args: str) -> tuple[int, dict[str, Any], str]:
        proc = npuops("provision", "-i", str(self.inventory), "--packages", str(packages), "--no-hardware-check",
                      "--artifacts", str(self.artifacts), "--json", *args)
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            raise AssertionError(
                f"no JSON report (rc {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}") from None
        assert isinstance(report, dict)
        if "hosts" in report:
            return proc.returncode, report["hosts"]["localhost"], proc.stderr
        return proc.returncode, report, proc.stderr

    def snapshot(self) -> dict[str, str]:
        """Every file under the target's root but the artifacts: path -> sha256 (symlinks: their target)."""
        files = {}
        for path in sorted(self.root.rglob("*")):
            if self.artifacts in path.parents or path == self.artifacts:
                continue
            if path.is_symlink():
                files[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        return files
