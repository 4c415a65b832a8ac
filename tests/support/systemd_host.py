"""An SSH test host whose init is real systemd: a network namespace joined to this machine by a veth pair, and
systemd booted in it (tests/support/systemd.py) over an overlay of this machine's root, with sshd as one of its
units. A reboot ordered on the host (`shutdown -r`, Ansible's `reboot` module) ends the namespace's systemd; the
harness boots it again over the same disk, as a node's firmware would, and sshd comes back with it.

The kernel's boot id (/proc/sys/kernel/random/boot_id) is this machine's, the same before and after such a reboot,
so each boot writes a boot id of its own to /run/npuops-test-boot-id (/run is a fresh tmpfs at every boot): the
`npuops_boot_id_file` a provisioning run is told to read, as on an LXC host.

Addresses: slot s (an flock on /run/npuops-test-sdhost/slot-s.lock while the hosts live) uses 10.214.s.0/24 on a
bridge of its own, .1 on this machine's side, .11, .12, ... the hosts; a slot whose subnet overlaps an address or
route here is passed over, and a slot's leftovers (a crashed run's links and namespaces) go at the next start.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.ssh_hosts import HOST_BASHRC, _port_open, _routes_and_addresses
from tests.support.systemd import RealSystemd

BOOT_ID_FILE = "/run/npuops-test-boot-id"
LOCK_DIR = Path("/run/npuops-test-sdhost")
MAX_SLOTS = 32
MAX_HOSTS = 8  # a slot's hosts whose leftovers (links, namespaces) a start removes
SSH_WAIT_S = 90.0

_SSHD_UNIT = """[Unit]
Description=sshd of the npuops test host
After=npuops-test-boot-id.service

[Service]
ExecStartPre=/bin/mkdir -p /run/sshd
ExecStart=/usr/sbin/sshd -D -f /etc/npuops-test/sshd_config -E /var/log/npuops-test-sshd.log

[Install]
WantedBy=multi-user.target
"""
_BOOT_ID_UNIT = f"""[Unit]
Description=A boot id of this host's own (the kernel's is the machine's)
DefaultDependencies=no
Before=sysinit.target

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'cat /proc/sys/kernel/random/uuid > {BOOT_ID_FILE}'

[Install]
WantedBy=sysinit.target
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _take_slot() -> tuple[int, int, ipaddress.IPv4Network]:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    taken = _routes_and_addresses()
    for slot in range(MAX_SLOTS):
        subnet = ipaddress.IPv4Network(f"10.214.{slot}.0/24")
        if any(subnet.overlaps(net) for net in taken):
            continue
        fd = os.open(LOCK_DIR / f"slot-{slot}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd, subnet
    raise RuntimeError("no free 10.214.s.0/24 slot for systemd test hosts")


@dataclass
class SystemdSshHost:
    """One booted host: `ssh()` as root with the fleet's key, `systemd.run()` inside without ssh."""

    base: Path
    name: str
    address: str
    namespace: str  # the network namespace; its veth to the fleet's bridge has the same name on this side
    key: Path
    binds: dict[str, Path] = field(default_factory=dict)  # shared directories (RealSystemd.binds)
    systemd: RealSystemd = field(init=False)

    def boot(self) -> None:
        self.systemd = RealSystemd(self.base / "systemd", netns=self.namespace, binds=dict(self.binds))
        self.systemd.mount()
        self._install_sshd()
        self.systemd.boot()
        self.systemd.follow_reboots()

    def _install_sshd(self) -> None:
        root = self.systemd.root
        conf = root / "etc/npuops-test"
        conf.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(conf / "ssh_host_ed25519_key")],
                       check=True)
        (conf / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        (conf / "sshd_config").write_text("\n".join([
            f"ListenAddress {self.address}:22", "HostKey /etc/npuops-test/ssh_host_ed25519_key",
            "PidFile /run/npuops-test-sshd.pid", "AuthorizedKeysFile /etc/npuops-test/authorized_keys",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no", "UseDNS no", "PrintMotd no",
            "MaxStartups 50:30:100", "MaxSessions 50", "Subsystem sftp internal-sftp", ""]))
        (root / "etc/hostname").write_text(f"{self.name}\n")
        (root / "root/.bashrc").write_text(HOST_BASHRC)
        units = root / "etc/systemd/system"
        for unit, text, target in (("npuops-test-sshd.service", _SSHD_UNIT, "multi-user.target"),
                                   ("npuops-test-boot-id.service", _BOOT_ID_UNIT, "sysinit.target")):
            (units / unit).write_text(text)
            wants = units / f"{target}.wants"
            wants.mkdir(exist_ok=True)
            (wants / unit).symlink_to(f"/etc/systemd/system/{unit}")

    def wait_ssh(self, timeout: float = SSH_WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not _port_open(self.address, 22):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: sshd not answering on {self.address}:22 after {timeout:.0f} s "
                                   f"(console: {self.systemd.console_log})")
            time.sleep(0.2)

    def ssh(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        args = ["-F", "/dev/null", "-i", str(self.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "ConnectTimeout=5"]
        return subprocess.run(["ssh", *args, f"root@{self.address}", command], capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)

    def boot_id(self) -> str:
        return self.systemd.check(["cat", BOOT_ID_FILE]).strip()


@dataclass
class SystemdFleet:
    """`size` hosts on a bridge of their own (10.214.s.1 on this machine's side, .11, .12, ... the hosts), each
    with real systemd as its init. `inventory()` writes the Ansible inventory (group `fleet`); `close()` powers
    them off and removes their namespaces, links, files and the slot's lock."""

    base: Path
    size: int = 1
    hosts: list[SystemdSshHost] = field(default_factory=list)
    # Directories every host mounts at the same path (path inside -> directory here), as a group shares NFS.
    shared: dict[str, Path] = field(default_factory=dict)
    slot: int = -1
    _lock_fd: int | None = None

    @property
    def key(self) -> Path:
        return self.base / "id_ed25519"

    @property
    def bridge(self) -> str:
        return f"npsd{self.slot}-br"

    def start(self) -> SystemdFleet:
        self.base.mkdir(parents=True, exist_ok=True)
        self.slot, self._lock_fd, subnet = _take_slot()
        self._remove_links()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet.network_address + 1}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index in range(1, self.size + 1):
            namespace = f"npsd{self.slot}-h{index}"
            host = SystemdSshHost(self.base / f"h{index}", f"npuops-test-sd{index}",
                                  str(subnet.network_address + 10 + index), namespace, self.key,
                                  binds=dict(self.shared))
            self.hosts.append(host)
            _ip("netns", "add", namespace)
            _ip("link", "add", namespace, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("link", "set", namespace, "master", self.bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            host.boot()
        for host in self.hosts:
            host.wait_ssh()
        return self

    def inventory(self, path: Path, group_vars: dict[str, Any] | None = None) -> Path:
        connection = {"ansible_user": "root", "ansible_ssh_private_key_file": str(self.key),
                      "ansible_python_interpreter": "/usr/bin/python3",
                      "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                      "npuops_boot_id_file": BOOT_ID_FILE}
        hosts = {h.name: {"ansible_host": h.address} for h in self.hosts}
        path.write_text(yaml.safe_dump({"all": {"children": {"fleet": {
            "hosts": hosts, "vars": {**connection, **(group_vars or {})}}}}}, sort_keys=False))
        return path

    def _remove_links(self) -> None:
        for index in range(1, MAX_HOSTS + 1):
            subprocess.run(["ip", "link", "delete", f"npsd{self.slot}-h{index}"], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "delete", f"npsd{self.slot}-h{index}"], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)

    def close(self) -> None:
        try:
            for host in self.hosts:
                if hasattr(host, "systemd"):
                    host.systemd.shutdown()
        finally:
            self._remove_links()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
