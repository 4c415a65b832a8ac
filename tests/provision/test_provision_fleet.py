"""`npuops provision -i INVENTORY` on a fleet: three real SSH test hosts (sshd in network namespaces, each with its
own overlay over /etc, /usr, /var, ...; tests/support/ssh_hosts.py), provisioned in parallel with --forks 3 with
the vendor-style CANN `.run` packages the tests build (tests/support/vendor_installers.py).

The hosts are throwaway roots, so the roles run with their defaults: /usr/local/Ascend, /etc/npuops, /etc/sysctl.d,
/var/tmp/npuops-packages, the HwHiAiUser group and the npuops user are each host's own. The installers refuse real
paths unless NPUOPS_TEST_ALLOW_REAL_PATHS=1, which the inventory passes through `npuops_installer_environment`.
Only the CANN packages (toolkit, kernels, NNAL) are installed: no driver, so no reboot and no dkms/kernel headers.
Kernel parameters are written but never applied (sysctl is not namespaced) and CPU governors are left alone.

One story:
  h3's sshd is killed -> the run reports h3 "unreachable" (with the connection's message) while h1 and h2 converge
  (CANN none -> 8.2.RC1, users, environment, tuning files, the doctor) and nothing lands on this machine or on h3
  -> h3 is back: all three "ok", h1 and h2 change nothing, h3 is installed -> `--limit npuops-test-h1`: only h1.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.npuops_cli import npuops, package_dir
from tests.support.ssh_hosts import TestFleet, cut_off
from tests.support.vendor_installers import build_package_set, makeself_available

pytestmark = pytest.mark.slow

CANN = "8.2.RC1"
TAGS = "preflight,users,cann,environment,tuning,verify"
ARCH = platform.machine()
# The npuops of this checkout's venv. /work (the venv) and /root/.pyenv (its interpreter, under the hosts' /root
# overlay's lower layer) are visible inside the hosts, so the verify role runs the real doctor there; the test
# checks that first, so a doctor that cannot start is not mistaken for the role's "npuops is not installed".
NPUOPS = Path(sys.executable).parent / "npuops"
TOOLKIT_INFO = f"/usr/local/Ascend/ascend-toolkit/latest/{ARCH}-linux/ascend_toolkit_install.info"
# What a provisioning run may write on a host; none of it may appear on this machine.
HOST_PATHS = ("/usr/local/Ascend", "/etc/npuops/ascend.env", "/etc/profile.d/npuops-ascend.sh",
              "/etc/sysctl.d/90-npuops.conf", "/etc/security/limits.d/90-npuops.conf", "/var/tmp/npuops-packages",
              "/var/lib/npuops", "/var/log/ascend_seclog", "/etc/ascend_install.info")

StartFleet = Callable[..., TestFleet]


def provision(inventory: Path, packages: Path, artifacts: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = npuops("provision", "-i", str(inventory), "--packages", str(packages), "--no-hardware-check",
                  "--tags", TAGS, "--artifacts", str(artifacts), "--json", *args)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(
            f"no JSON report (rc {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}") from None
    assert isinstance(report, dict) and "hosts" in report, report
    return proc.returncode, report


def on_host(fleet: TestFleet, name: str, command: str) -> subprocess.CompletedProcess[str]:
    return fleet.run(name, command, timeout=30)


def exists_on_host(fleet: TestFleet, name: str, path: str) -> bool:
    return on_host(fleet, name, f"test -e {path}").returncode == 0


def local_state() -> dict[str, bool]:
    return {path: Path(path).exists() for path in HOST_PATHS}


def host_state(fleet: TestFleet, name: str) -> dict[str, bool]:
    """Which of the paths a run writes exist on the host (a fresh host sees this machine's files below its overlay)."""
    return {path: exists_on_host(fleet, name, path) for path in HOST_PATHS}


def local_user(name: str) -> bool:
    return subprocess.run(["getent", "passwd", name], capture_output=True, check=False).returncode == 0


def local_group(name: str) -> bool:
    return subprocess.run(["getent", "group", name], capture_output=True, check=False).returncode == 0


# Sourced (BASH_ENV) by every bash the installer tasks start: the installers' embedded install.sh are bash scripts.
# The first time on a host it leaves a mark in a directory all hosts share (/tmp is not overlaid), waits (bounded)
# until every host in NPUOPS_TEST_MEET has left one, and writes down whom it met. Hosts that ran their installers
# at the same time met each other; with one fork the first host would wait alone and record only itself.
MEET_HOOK = """\
if [ -n "${NPUOPS_TEST_MEET_DIR:-}" ] && [ ! -e "$NPUOPS_TEST_MEET_DIR/$(hostname).met" ]; then
    _npuops_me=$(hostname)
    : > "$NPUOPS_TEST_MEET_DIR/$_npuops_me"
    _npuops_tries=0
    while [ "$_npuops_tries" -lt 600 ]; do
        _npuops_all=1
        for _npuops_h in $NPUOPS_TEST_MEET; do [ -e "$NPUOPS_TEST_MEET_DIR/$_npuops_h" ] || _npuops_all=0; done
        [ "$_npuops_all" = 1 ] && break
        _npuops_tries=$((_npuops_tries + 1)); sleep 0.1
    done
    for _npuops_h in $NPUOPS_TEST_MEET; do
        [ -e "$NPUOPS_TEST_MEET_DIR/$_npuops_h" ] && echo "$_npuops_h"
    done > "$NPUOPS_TEST_MEET_DIR/$_npuops_me.met"
    unset _npuops_me _npuops_tries _npuops_all _npuops_h
fi
"""


def assert_converged(fleet: TestFleet, name: str, host: dict[str, Any], *, fresh: bool) -> None:
    """The host is "ok" with CANN installed (fresh: by this run) and everything the roles leave behind."""
    assert host["status"] == "ok" and host["failed"] == 0 and host["message"] == "", (name, host)
    before = None if fresh else CANN
    assert host["versions"]["cann"] == {"before": before, "after": CANN}, (name, host["versions"])
    assert host["versions"]["kernels"] == {"before": before, "after": CANN}, (name, host["versions"])
    assert host["versions"]["nnal"] == {"before": before, "after": CANN}, (name, host["versions"])
    info = on_host(fleet, name, f"cat {TOOLKIT_INFO}")
    assert info.returncode == 0 and f"version={CANN}" in info.stdout.splitlines(), (name, info.stderr)
    assert exists_on_host(fleet, name, "/usr/local/Ascend/nnal/atb/latest/atb/set_env.sh"), name
    # Installed as the vendors' packages are, by the installers themselves (their log is in the host's /var/log).
    log = on_host(fleet, name, "cat /var/log/ascend_seclog/ascend_toolkit_install.log")
    assert "install path: /usr/local/Ascend" in log.stdout, (name, log.stdout, log.stderr)
    env = on_host(fleet, name, "cat /etc/npuops/ascend.env")
    assert 'ASCEND_HOME_PATH="/usr/local/Ascend/ascend-toolkit/latest"' in env.stdout, (name, env.stdout)
    assert "ATB_HOME_PATH=" in env.stdout and 'OMP_NUM_THREADS="1"' in env.stdout, (name, env.stdout)
    profile = on_host(fleet, name, "cat /etc/profile.d/npuops-ascend.sh").stdout
    assert "export ASCEND_TOOLKIT_HOME=" in profile, (name, profile)
    sysctl = on_host(fleet, name, "cat /etc/sysctl.d/90-npuops.conf").stdout
    assert "vm.swappiness = 0" in sysctl, (name, sysctl)
    assert "nofile 1048576" in on_host(fleet, name, "cat /etc/security/limits.d/90-npuops.conf").stdout, name
    # The users role: the driver's group and user, and the service user in that group.
    assert on_host(fleet, name, "getent group HwHiAiUser").returncode == 0, name
    assert on_host(fleet, name, "getent passwd HwHiAiUser").returncode == 0, name
    npuops_user = on_host(fleet, name, "getent passwd npuops")
    assert npuops_user.returncode == 0 and npuops_user.stdout.rstrip().endswith(":/usr/sbin/nologin"), npuops_user
    assert "HwHiAiUser" in on_host(fleet, name, "id -nG npuops").stdout.split(), name
    # The doctor ran on the host (from this checkout's venv) and its verdict came back. It read the host's own
    # /usr/local/Ascend: CANN, its kernels and NNAL pass there; the NPU checks fail (no driver, no NPUs), which the
    # role reports without failing the host.
    doctor = host["doctor"]
    assert doctor["ok"] is not None and "skipped" not in doctor, (name, doctor)
    assert {"driver-installed", "device-nodes"} <= set(doctor["failed"]), (name, doctor)
    assert not {"cann-toolkit", "cann-kernels", "nnal-version"} & set(doctor["failed"]), (name, doctor)


def test_three_hosts_in_parallel_one_unreachable_then_all_converge(ssh_fleet: StartFleet,
                                                                   tmp_path: Path) -> None:
    if not makeself_available():
        pytest.fail("makeself is not installed (apt-get install makeself; scripts/test.sh does it)")
    built = build_package_set(tmp_path / "built", cann=CANN, arch=ARCH)
    packages = package_dir(tmp_path, [built["toolkit"], built["kernels"], built["nnal"]])
    artifacts = tmp_path / "artifacts"
    this_machine = local_state()
    users_here = (local_user("npuops"), local_user("HwHiAiUser"), local_group("HwHiAiUser"))

    fleet = ssh_fleet(3)
    h1, h2, h3 = fleet.names
    # The doctor the verify role runs is reachable and starts inside a host.
    doctor_here = on_host(fleet, h1, f"{NPUOPS} --version")
    assert doctor_here.returncode == 0 and "npuops" in doctor_here.stdout, doctor_here
    for name in fleet.names:
        assert not exists_on_host(fleet, name, "/usr/local/Ascend"), name
    h3_fresh = host_state(fleet, h3)
    # Each host's /usr/local/Ascend, /etc and /var/log are its own overlay: let the installers write them, with the
    # install record (which only driver and firmware packages write) and the logs where the real packages keep them.
    # The test hosts share this machine's /tmp but have PID namespaces of their own: makeself's extraction directory
    # ($TMPDIR/selfgz<pid><$RANDOM>, and dash has no $RANDOM) could collide between hosts. Each host's /var is its own.
    installer_env = {"NPUOPS_TEST_ALLOW_REAL_PATHS": "1", "ASCEND_INSTALL_INFO": "/etc/ascend_install.info",
                     "NPUOPS_TEST_ASCEND_LOG_DIR": "/var/log/ascend_seclog", "TMPDIR": "/var/tmp"}
    group_vars = {
        "npuops_installer_environment": installer_env,
        # sysctl is not namespaced: write the file, never apply it from a test. No cpufreq governors either.
        "npuops_sysctl_apply": False,
        "npuops_tune_governor": False,
        "npuops_doctor_command": str(NPUOPS),
    }
    meet = tmp_path / "meet"
    meet.mkdir()
    (tmp_path / "meet.sh").write_text(MEET_HOOK)
    inventory = fleet.inventory_path(group_vars={**group_vars, "npuops_installer_environment": {
        **installer_env, "BASH_ENV": str(tmp_path / "meet.sh"), "NPUOPS_TEST_MEET_DIR": str(meet),
        "NPUOPS_TEST_MEET": f"{h1} {h2}"}})

    # h3 is down: it is reported unreachable, and h1 and h2 converge all the same.
    fleet.kill_sshd(h3)
    rc, report = provision(inventory, packages, artifacts, "--forks", "3")
    hosts = report["hosts"]
    assert rc == 1 and report["ok"] is False, report  # exit 1: not every host converged
    assert set(hosts) == {h1, h2, h3}, hosts
    assert {name: h["status"] for name, h in hosts.items()} == {h1: "ok", h2: "ok", h3: "unreachable"}, hosts
    dead = hosts[h3]
    assert dead["message"] and fleet.host(h3).address in dead["message"], dead
    # ssh's own cause: refused, or (when a connection multiplexed from the step before outlived the killed sshd,
    # as a CI run saw) a broken pipe on it.
    assert cut_off(dead["message"]), dead
    assert dead["versions"] == {} and dead["changed"] == 0, dead
    for name in (h1, h2):
        assert_converged(fleet, name, hosts[name], fresh=True)
        assert hosts[name]["changed"] > 0, hosts[name]
        assert "CANN | run the NNAL installer in the toolkit's environment" in hosts[name]["changed_tasks"]
    # Nothing on h3, and nothing on this machine: the hosts' paths were their own.
    assert host_state(fleet, h3) == h3_fresh
    assert on_host(fleet, h3, "getent passwd npuops").returncode != 0
    assert local_state() == this_machine
    assert (local_user("npuops"), local_user("HwHiAiUser"), local_group("HwHiAiUser")) == users_here
    # In parallel: ansible-playbook ran with --forks 3, and h1's and h2's installers met while both were running.
    command = json.loads((Path(report["artifacts"]) / "command").read_text())["command"]
    assert "--forks" in command and command[command.index("--forks") + 1] == "3", command
    for name in (h1, h2):
        assert (meet / f"{name}.met").read_text().split() == [h1, h2], name

    # h3 is back: all three converge; h1 and h2 change nothing, h3 gets CANN.
    fleet.restart_sshd(h3)
    inventory = fleet.inventory_path(group_vars=group_vars)  # without the meeting
    rc, report = provision(inventory, packages, artifacts, "--forks", "3")
    hosts = report["hosts"]
    assert rc == 0 and report["ok"] is True, {n: (h["status"], h["message"]) for n, h in hosts.items()}
    assert {name: h["status"] for name, h in hosts.items()} == {h1: "ok", h2: "ok", h3: "ok"}, hosts
    for name in (h1, h2):
        assert_converged(fleet, name, hosts[name], fresh=False)
        assert hosts[name]["changed"] == 0, (name, hosts[name]["changed_tasks"])
    assert_converged(fleet, h3, hosts[h3], fresh=True)
    assert local_state() == this_machine

    # --limit: only h1 is touched and reported.
    rc, report = provision(inventory, packages, artifacts, "--forks", "3", "--limit", h1)
    assert rc == 0 and report["ok"] is True, report
    assert set(report["hosts"]) == {h1}, report["hosts"]
    assert_converged(fleet, h1, report["hosts"][h1], fresh=False)
    assert report["hosts"][h1]["changed"] == 0, report["hosts"][h1]["changed_tasks"]
    assert local_state() == this_machine
