"""The SSH test fleet (tests/support/ssh_hosts.py): real sshd hosts in network namespaces with their own
overlays, reached by ssh and by ansible-runner, broken and mended, and torn down without a trace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from npuops.fleet.events import PlaybookEvent
from npuops.fleet.runner import run_playbook
from tests.support.ssh_hosts import (
    GUARD_ROUTE_METRIC,
    TestFleet,
    cut_off,
    ensure_prerequisites,
    missing_packages,
    require_fleets,
    slot_leftovers,
    start_hosts,
)

REPO = Path(__file__).resolve().parents[2]
NPUOPS = str(Path(sys.executable).parent / "npuops")
DRIVER_VERSION_INFO = REPO / "tests" / "fixtures" / "ascend" / "driver-version-info_24.1.rc2.2_1.txt"

StartFleet = Callable[..., TestFleet]


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def fleet_objects(prefix: str) -> list[str]:
    """Namespaces and links on this machine whose names start with the fleet's prefix."""
    names = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
    names += [line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link", "show").splitlines()]
    return [n for n in names if n.startswith(f"{prefix}-")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie nobody reaped yet is dead for our purpose.
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def driver_version(node: dict[str, object]) -> object:
    driver = node["driver"]
    assert isinstance(driver, dict)
    return driver["version"]


# --- prerequisites -----------------------------------------------------------------------------------------------


def test_prerequisites_without_root_give_a_reason_to_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = ensure_prerequisites.__wrapped__()  # past the cache
    assert reason is not None and "need root" in reason


def test_missing_packages_names_debian_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.support.ssh_hosts.SSHD", "/nonexistent/sshd")
    monkeypatch.setattr("tests.support.ssh_hosts.PACKAGES", {"/nonexistent/sshd": "openssh-server",
                                                               "no-such-ip-tool": "iproute2", "sh": "dash"})
    assert missing_packages() == ["openssh-server", "iproute2"]


# --- hosts up ----------------------------------------------------------------------------------------------------


def test_three_hosts_answer_ssh_with_their_own_names(ssh_fleet: StartFleet) -> None:
    fleet = ssh_fleet(3)
    assert fleet.setup_s is not None and fleet.setup_s < 10
    assert fleet.names == ["npuops-test-h1", "npuops-test-h2", "npuops-test-h3"]
    assert len({h.address for h in fleet.hosts}) == 3 and all(h.port == 22 for h in fleet.hosts)
    for host in fleet.hosts:
        answer = fleet.ssh(host.name, "hostname; id -un; cat /etc/hostname")
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.split() == [host.name, "root", host.name]
        # Traffic to a host goes through the fleet's bridge, and a host can reach nothing but the fleet's subnet.
        assert f"dev {fleet.bridge} " in ip("route", "get", host.address)
        routes = fleet.run(host.name, ["ip", "-4", "route"], check=True).stdout.splitlines()
        assert routes == [f"{fleet.subnet} dev eth0 proto kernel scope link src {host.address} "]
    assert f"unreachable {fleet.subnet} metric {GUARD_ROUTE_METRIC}" in ip("route")


def test_inventory_has_the_connection_settings(ssh_fleet: StartFleet) -> None:
    fleet = ssh_fleet(2)
    path = fleet.inventory_path(group_vars={"npuops_command": NPUOPS}, host_vars={"npuops-test-h2": {"npuops_x": 1}})
    fleet_group = yaml.safe_load(path.read_text())["all"]["children"]["fleet"]
    assert fleet_group["hosts"] == {
        "npuops-test-h1": {"ansible_host": fleet.hosts[0].address, "ansible_port": 22},
        "npuops-test-h2": {"ansible_host": fleet.hosts[1].address, "ansible_port": 22, "npuops_x": 1},
    }
    settings = fleet_group["vars"]
    assert settings["ansible_user"] == "root" and settings["ansible_python_interpreter"] == "/usr/bin/python3"
    assert Path(settings["ansible_ssh_private_key_file"]).is_file()
    args = settings["ansible_ssh_common_args"].split()
    assert f"ControlPath={fleet.control_dir}/%C" in args and "ControlPersist=60s" in args
    assert "StrictHostKeyChecking=no" in args and "UserKnownHostsFile=/dev/null" in args
    assert len(f"{fleet.control_dir}/") + 40 < 100  # room for the %C hash in a unix socket path
    assert settings["npuops_command"] == NPUOPS


# --- overlays ----------------------------------------------------------------------------------------------------


def test_each_host_has_its_own_filesystem_and_processes(ssh_fleet: StartFleet) -> None:
    fleet = ssh_fleet(3)
    h1, h2, _ = fleet.names
    name = f"npuops-fleet-test-{uuid.uuid4().hex[:8]}"
    written = fleet.ssh(h1, f"mkdir -p /usr/local/Ascend /etc/npuops && echo from-h1 > /usr/local/Ascend/{name} "
                            f"&& echo conf > /etc/npuops/{name}")
    assert written.returncode == 0, written.stderr
    for path in (f"/usr/local/Ascend/{name}", f"/etc/npuops/{name}"):
        assert not Path(path).exists()  # not on this machine
        assert fleet.ssh(h2, ["test", "-e", path]).returncode == 1  # nor on another host
        assert fleet.run(h2, ["test", "-e", path]).returncode == 1
    assert fleet.ssh(h1, ["cat", f"/usr/local/Ascend/{name}"]).stdout == "from-h1\n"
    assert fleet.run(h1, ["cat", f"/usr/local/Ascend/{name}"]).stdout == "from-h1\n"
    assert (fleet.upper_dir(h1) / "usr" / "local" / "Ascend" / name).read_text() == "from-h1\n"
    # root's ~/.ssh on a host is clean: only the fleet key, none of this machine's files.
    assert fleet.run(h1, "ls -A /root/.ssh", check=True).stdout.split() == ["authorized_keys"]
    # Its own processes too: pid 1 is the namespace holder, and this machine's processes are out of sight.
    assert fleet.ssh(h1, "cat /proc/1/cmdline").stdout.startswith("/usr/bin/python3\0-c\0")
    seen = fleet.run(h1, "for c in /proc/[0-9]*/comm; do cat $c; done", check=True).stdout.split()
    assert "sshd" in seen and seen.count("python3") == 1 and len(seen) < 20
    # What a host removes stays removed for it alone.
    assert fleet.ssh(h2, "rm /etc/hostname && test ! -e /etc/hostname").returncode == 0
    assert Path("/etc/hostname").exists() and fleet.run(h1, "cat /etc/hostname").stdout == f"{h1}\n"


def test_without_overlay_hosts_share_this_machines_files(ssh_fleet: StartFleet, tmp_path: Path) -> None:
    fleet = ssh_fleet(2, overlay=False)
    target = tmp_path / "shared.txt"
    assert fleet.ssh("npuops-test-h1", f"hostname > {target}").returncode == 0
    assert target.read_text() == "npuops-test-h1\n"
    assert fleet.ssh("npuops-test-h2", ["cat", str(target)]).stdout == "npuops-test-h1\n"
    with pytest.raises(ValueError, match="no overlays"):
        fleet.upper_dir("npuops-test-h1")


# --- Ansible over SSH --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_node_facts_on_three_hosts(ssh_fleet: StartFleet, tmp_path: Path) -> None:
    fleet = ssh_fleet(3)
    h1, h2, h3 = fleet.names
    # Only h2 has an Ascend driver (its own /usr/local/Ascend, in its overlay).
    fleet.run(h2, "mkdir -p /usr/local/Ascend/driver && cat > /usr/local/Ascend/driver/version.info", check=True,
              input_text=DRIVER_VERSION_INFO.read_text().split("\n", 1)[1])
    seen: list[PlaybookEvent] = []
    run = run_playbook("node-facts.yml", inventory=fleet.inventory_path(group_vars={"npuops_command": NPUOPS}),
                       artifacts_dir=tmp_path / "artifacts", forks=3, on_event=seen.append, timeout_s=120)
    assert run.ok, run.to_json()
    assert run.rc == 0 and run.status == "successful" and set(run.hosts) == {h1, h2, h3}
    nodes = {name: result.data["npuops_node"] for name, result in run.hosts.items()}
    assert {name: node["host"]["hostname"] for name, node in nodes.items()} == {h1: h1, h2: h2, h3: h3}
    assert {name: driver_version(node) for name, node in nodes.items()} == {h1: None, h2: "24.1.rc2.2", h3: None}
    assert {e.host for e in seen if e.kind == "ok"} == {h1, h2, h3}
    assert run.duration_s < 60


@pytest.mark.slow
def test_killed_host_is_unreachable_and_comes_back(ssh_fleet: StartFleet, tmp_path: Path) -> None:
    fleet = ssh_fleet(3)
    h1, h2, h3 = fleet.names
    inventory = fleet.inventory_path(group_vars={"npuops_command": NPUOPS})
    artifacts = tmp_path / "artifacts"
    # A first run leaves Ansible's ControlPersist masters open: killing sshd must cut those too.
    assert run_playbook("node-facts.yml", inventory=inventory, artifacts_dir=artifacts, forks=3, timeout_s=120).ok

    fleet.kill_sshd(h2)
    assert not fleet.sshd_running(h2)
    run = run_playbook("node-facts.yml", inventory=inventory, artifacts_dir=artifacts, forks=3, timeout_s=120)
    assert not run.ok and run.rc == 4 and run.status == "failed"
    assert {name: r.status for name, r in run.hosts.items()} == {h1: "ok", h2: "unreachable", h3: "ok"}
    dead = run.hosts[h2]
    assert dead.stats.unreachable == 1 and dead.failures[-1].unreachable
    assert cut_off(dead.message) and fleet.hosts[1].address in dead.message  # refused at once, no ssh timeout
    assert run.hosts[h1].data["npuops_node"]["host"]["hostname"] == h1

    fleet.restart_sshd(h2)
    back = run_playbook("node-facts.yml", inventory=inventory, artifacts_dir=artifacts, limit=h2, timeout_s=120)
    assert back.ok and back.hosts[h2].data["npuops_node"]["host"]["hostname"] == h2


# --- teardown and leftovers --------------------------------------------------------------------------------------


def test_close_leaves_nothing_and_a_new_fleet_starts_at_once(tmp_path: Path) -> None:
    require_fleets()
    fleet = start_hosts(2, tmp_path)
    h1 = fleet.hosts[0]
    # An ssh ControlPersist master on the fleet's ControlPath, as Ansible leaves one.
    master = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(fleet.key), "-o", "BatchMode=yes",
                             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                             "-o", "ControlMaster=yes", "-o", "ControlPersist=60s",
                             "-o", f"ControlPath={fleet.control_dir}/%C", "-fN", h1.target],
                            capture_output=True, text=True, timeout=30, check=False)
    assert master.returncode == 0, master.stderr
    assert len(list(fleet.control_dir.iterdir())) == 1
    pids = [int(p) for h in fleet.hosts for p in ip("netns", "pids", h.namespace).split()]
    assert len(pids) >= 8  # per host: unshare, the holder, nsenter, sshd; and the master's session
    dirs = [fleet.fleet_dir, fleet.control_dir]

    fleet.close()
    assert fleet.teardown_s is not None and fleet.teardown_s < 10
    assert slot_leftovers(fleet.slot) in ([], None)  # None: another test process took the slot meanwhile
    assert str(fleet.subnet) not in ip("route")  # the guard route too
    assert not any(alive(pid) for pid in pids)
    assert not any(d.exists() for d in dirs)
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
    fleet.close()  # idempotent

    with start_hosts(2, tmp_path) as again:  # the lowest free slot again, same names: no "File exists"
        assert again.ssh(again.names[1], "hostname").stdout == f"{again.names[1]}\n"
    assert slot_leftovers(again.slot) in ([], None)


def test_leftovers_of_a_crashed_run_are_cleaned_up(tmp_path: Path) -> None:
    require_fleets()
    code = ("import sys, time; from pathlib import Path; from tests.support.ssh_hosts import start_hosts; "
            "f = start_hosts(2, Path(sys.argv[1])); "
            "print(f.slot, f.fleet_dir, *[f.holder_pid(n) for n in f.names], flush=True); time.sleep(120)")
    crashed = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert crashed.stdout is not None and crashed.stderr is not None
        line = crashed.stdout.readline()
        assert line, crashed.stderr.read()
        slot_text, fleet_dir, *holders = line.split()
    finally:
        crashed.send_signal(signal.SIGKILL)  # dies without close(): everything it made stays
        crashed.wait(timeout=10)
    slot = int(slot_text)
    left = slot_leftovers(slot)
    if left is None:
        pytest.skip("another test process took the crashed fleet's slot (and cleaned it) first")
    assert len(left) == 5  # 2 namespaces, 2 veths, the bridge
    assert all(alive(int(pid)) for pid in holders)

    with start_hosts(1, tmp_path) as fleet:
        assert not any(alive(int(pid)) for pid in holders)
        assert not Path(fleet_dir).exists()
        if fleet.slot == slot:  # the lowest free slot: cleaned, then taken again
            assert sorted(fleet_objects(fleet.prefix)) == [f"{fleet.prefix}-br", f"{fleet.prefix}-h1",
                                                           f"{fleet.prefix}-h1"]
        else:
            assert slot_leftovers(slot) in ([], None)
        assert fleet.ssh(fleet.names[0], "hostname").stdout == "npuops-test-h1\n"
    assert slot_leftovers(fleet.slot) in ([], None)
