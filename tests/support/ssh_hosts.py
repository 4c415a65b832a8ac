"""Several real SSH test hosts on this machine, for fleet tests (`npuops provision`, node facts over SSH).

Each host is a network namespace joined to a private bridge by a veth pair, with its own sshd listening on
its own address (port 22, key auth only, root allowed), its own hostname `npuops-test-hN` (UTS namespace) and
its own processes (PID namespace: a playbook's kill or pkill cannot reach this machine's processes). With
`overlay=True` (the default) it also has its own files: in a private mount namespace, overlayfs over /etc, /usr,
/opt, /var, /root, /srv and /home and a tmpfs on /run, so a playbook can write real absolute paths
(/usr/local/Ascend, /etc/npuops, /etc/systemd/system) without touching this machine or the other hosts.
/tmp and /work stay shared (the fleet's own files and the project venv live there). With `overlay=False` the
hosts share this machine's files.

Pytest-independent API::

    fleet = start_hosts(3, workdir)          # or: with start_hosts(3, workdir) as fleet: ...
    fleet.hosts                              # (SshHost(name, address, port, ...), ...)
    fleet.inventory_path()                   # an Ansible YAML inventory, group `fleet`
    fleet.ssh(name, "hostname")              # ssh with the fleet key (CompletedProcess)
    fleet.run(name, "cat /etc/hostname")     # inside the host's namespaces, without ssh
    fleet.kill_sshd(name); fleet.restart_sshd(name)
    fleet.close()                            # everything gone; a new fleet can start at once

and the pytest fixture factory `ssh_fleet` (tests/conftest.py, on `require_fleets` and `start_hosts`)::

    def test_x(ssh_fleet):
        fleet = ssh_fleet(3)

Names, locks and addresses: a fleet takes the first free *slot* s (an flock on /run/npuops-test-fleet/slot-s.lock
held while the fleet lives, so concurrent fleets and pytest processes never collide); its namespaces are
`npft<s>-h<N>`, its root-side veths have the same names, its bridge is `npft<s>-br`, its subnet 10.213.<s>.0/24
(.1 the bridge, .11, .12, ... the hosts; a slot whose subnet overlaps any address or route here is passed
over). The hosts have no default route, and an `unreachable` route for the subnet sits behind the bridge's
own, so nothing a test does can send traffic past the namespaces the fleet created. Whatever a crashed run
left behind (namespaces, links, the route, ssh masters, its files) is removed when its slot's lock is free,
at the next `start_hosts`.

Needs root, iproute2, util-linux (unshare, nsenter), openssh-server and /usr/bin/python3 (the hosts' Ansible
interpreter and pid 1); `ensure_prerequisites()` installs missing packages with apt-get when run as root.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PREFIX = "npft"  # npuops fleet test: every namespace, link and control dir of these fleets starts with it
SUBNET_FIRST_OCTETS = "10.213"  # slot s uses 10.213.s.0/24
HOST_OFFSET = 10  # host N has the address 10.213.s.(10 + N)
MAX_SLOTS = 64
MAX_HOSTS = 200
SSH_PORT = 22
SSHD = "/usr/sbin/sshd"
STATE_DIR = Path("/run/npuops-test-fleet")
CONTROL_ROOT = Path("/tmp")  # ssh ControlPath sockets need a short path (108 bytes with the 40-char %C hash)
OVERLAID_DIRS = ("/etc", "/usr", "/opt", "/var", "/root", "/srv", "/home")
GUARD_ROUTE_METRIC = 4242
# Debian packages that provide each command the fleet runs.
PACKAGES = {SSHD: "openssh-server", "ssh": "openssh-server", "ssh-keygen": "openssh-server", "ip": "iproute2",
            "unshare": "util-linux", "nsenter": "util-linux", "/usr/bin/python3": "python3"}
REQUIRE_ENV = "NPUOPS_REQUIRE_FLEET"  # "1": the fixture fails instead of skipping when fleets cannot start
# What ssh says of a host whose sshd was killed: refused, or, on a ControlPersist connection left from the run
# before, a broken pipe (runs J and K). Either is at once; a host that does not answer would say "timed out".
CUT_OFF_CAUSES = ("Connection refused", "Broken pipe")

# A test host's root runs no shell start-up of this machine's: its ~/.bashrc (which bash reads for every ssh command)
# inits pyenv, whose `pyenv rehash` takes a lock file in the host's overlay; a session killed mid-rehash (an
# Ansible timeout, a cut connection) leaves the lock behind, and every later ssh command then waited 60 s for it.
HOST_BASHRC = "# npuops test host: no pyenv init here (tests/support/ssh_hosts.py, HOST_BASHRC)\n"


def cut_off(message: str) -> bool:
    """ssh's message says the host's sshd is gone (not that it timed out)."""
    return any(cause in message for cause in CUT_OFF_CAUSES) and "timed out" not in message

# Pid 1 of each host: reaps whatever is orphaned on the host (a daemon a playbook started, a killed sshd's
# sessions) as an init does, and keeps the host's namespaces alive.
_INIT = """import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)
"""
_SLOT_NAME = re.compile(rf"^{PREFIX}(\d+)-")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+-]+$")  # what overlay mount options and sshd_config take unquoted


class FleetSetupError(RuntimeError):
    """A fleet could not be started or torn down; the message says which command failed and why."""


@dataclass(frozen=True)
class SshHost:
    name: str  # the inventory name and the host's own hostname: npuops-test-hN
    address: str
    port: int
    namespace: str  # the network namespace (`ip netns exec <namespace> ...`)
    index: int  # N, from 1

    @property
    def target(self) -> str:
        return f"root@{self.address}"


# --- small helpers around commands -------------------------------------------------------------------------------


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 30,
         input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False,
                              input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise FleetSetupError(f"`{shlex.join(argv)}`: {argv[0]} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise FleetSetupError(f"`{shlex.join(argv)}` did not finish within {timeout} s") from exc
    if check and proc.returncode != 0:
        raise FleetSetupError(f"`{shlex.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def _delete(kind: str, name: str) -> None:
    """`ip link delete` / `ip netns delete`; one that is already gone is fine."""
    proc = _ip(kind, "delete", name, check=False)
    if proc.returncode != 0 and not re.search(r"Cannot find device|No such file", proc.stderr):
        raise FleetSetupError(f"`ip {kind} delete {name}` exited {proc.returncode}: {proc.stderr.strip()}")


def _netns_names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    names = []
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _netns_pids(namespace: str) -> list[int]:
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _kill_namespace_processes(namespace: str, *, keep: Sequence[int] = (), timeout: float = 5) -> None:
    """SIGKILL every process in the network namespace except `keep`, and wait until they are gone.

    Those inside a host's own PID namespace go first, and the rest (the nsenter and unshare parents outside it)
    only once those are reaped: killed in the other order, the children would be left to this machine's init,
    which reaps them only every few seconds."""
    own = _pid_ns(os.getpid())
    deadline = time.monotonic() + timeout
    killed_inside: set[int] = set()
    while True:
        left = [p for p in _netns_pids(namespace) if p not in keep]
        inside = [p for p in left if _pid_ns(p) not in (own, None)]
        if inside:
            for pid in inside:
                _kill(pid)
            killed_inside.update(inside)
        elif not any(Path(f"/proc/{p}").exists() for p in killed_inside):  # reaped, not merely dead
            if not left:
                return
            for pid in left:
                _kill(pid)
        if time.monotonic() > deadline:
            raise FleetSetupError(f"processes {left or sorted(killed_inside)} in namespace {namespace} "
                                  f"outlived SIGKILL for {timeout} s")
        time.sleep(0.01)


def _port_open(address: str, port: int, timeout: float = 0.5) -> bool | None:
    """True: accepting; False: refused; None: no answer in time."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return False
    except OSError:
        return None


def _routes_and_addresses() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has an address in or a route to (default routes aside)."""
    nets: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        match = re.search(r"\binet (\S+)", line)
        if match:
            nets.append(ipaddress.IPv4Interface(match.group(1)).network)
    route_types = {"unicast", "local", "broadcast", "multicast", "unreachable", "blackhole", "prohibit", "throw", "nat",
                   "anycast"}
    for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        tokens = line.split()
        if not tokens:
            continue
        dest = tokens[1] if tokens[0] in route_types and len(tokens) > 1 else tokens[0]
        if dest == "default":
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.IPv4Network(dest, strict=False))
    return nets


def _subnet(slot: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{SUBNET_FIRST_OCTETS}.{slot}.0/24")


# --- prerequisites -----------------------------------------------------------------------------------------------


def missing_packages() -> list[str]:
    """Debian packages whose commands the fleet needs and cannot find."""
    missing: list[str] = []
    for command, package in PACKAGES.items():
        found = os.access(command, os.X_OK) if command.startswith("/") else shutil.which(command) is not None
        if not found and package not in missing:
            missing.append(package)
    return missing


def apt_install(packages: Sequence[str]) -> None:
    """apt-get install the packages (root only). A policy-rc.d that refuses service starts is put in place while
    it runs, so the package's own sshd is not started on port 22 of this machine (Docker-style images have one)."""
    policy = Path("/usr/sbin/policy-rc.d")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    lock = os.open(STATE_DIR / "apt.lock", os.O_RDWR | os.O_CREAT, 0o600)
    added_policy = False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not policy.exists():
            policy.write_text("#!/bin/sh\n# npuops test fleet: no service starts during apt-get\nexit 101\n")
            policy.chmod(0o755)
            added_policy = True
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, env=env, timeout=300, check=False)
        proc = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                               "-o", "DPkg::Lock::Timeout=120", *packages],
                              capture_output=True, text=True, env=env, timeout=600, check=False)
        if proc.returncode != 0:
            raise FleetSetupError(f"apt-get install {' '.join(packages)} exited {proc.returncode}: "
                                  f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    finally:
        if added_policy:
            policy.unlink(missing_ok=True)
        os.close(lock)


@functools.lru_cache(maxsize=1)
def ensure_prerequisites(install: bool = True) -> str | None:
    """None when fleets can start here, else why not (the reason to skip with). As root, missing packages are
    installed with apt-get when `install` is true."""
    if os.geteuid() != 0:
        return "SSH test fleets need root (network namespaces, veth links, mounts)"
    missing = missing_packages()
    if missing and install and shutil.which("apt-get"):
        try:
            apt_install(missing)
        except FleetSetupError as exc:
            return f"SSH test fleets need {' '.join(missing)}; installing failed: {exc}"
        missing = missing_packages()
    if missing:
        return f"SSH test fleets need the Debian packages {' '.join(missing)} (apt-get install -y {' '.join(missing)})"
    probe = subprocess.run(["unshare", "--net", "--mount", "--uts", "true"], capture_output=True, text=True,
                           timeout=30, check=False)
    if probe.returncode != 0:
        return f"cannot create network/mount/UTS namespaces here: {probe.stderr.strip()}"
    return None


# --- slots: locks, state and leftovers ----------------------------------------------------------------------------


def _try_lock(slot: int) -> int | None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(STATE_DIR / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _state_file(slot: int) -> Path:
    return STATE_DIR / f"slot-{slot}.json"


def _close_masters(control_dir: Path) -> None:
    """Ask every ssh ControlPersist master with a socket in control_dir to exit (over the socket: no traffic)."""
    if not control_dir.is_dir():
        return
    for sock in control_dir.iterdir():
        _run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "fleet-master"], check=False,
             timeout=10)


def _slot_objects(slot: int) -> tuple[list[str], list[str]]:
    prefix = f"{PREFIX}{slot}-"
    return ([n for n in _netns_names() if n.startswith(prefix)], [n for n in _link_names() if n.startswith(prefix)])


def _remove_slot_objects(slot: int) -> None:
    """Remove every namespace, link and route of the slot (its lock must be held)."""
    state: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(_state_file(slot).read_text())
    if state.get("control_dir"):
        _close_masters(Path(state["control_dir"]))
    namespaces, links = _slot_objects(slot)
    for namespace in namespaces:
        _kill_namespace_processes(namespace)
    bridge = f"{PREFIX}{slot}-br"
    for link in sorted(links, key=lambda n: n == bridge):  # veths first (see TestFleet.close), the bridge last
        _ip("link", "delete", link, check=False)
    for namespace in namespaces:
        _ip("netns", "delete", namespace, check=False)
    _ip("route", "delete", "unreachable", str(_subnet(slot)), "metric", str(GUARD_ROUTE_METRIC), check=False)
    for key in ("control_dir", "fleet_dir"):
        path = state.get(key)
        # Only directories a fleet made itself (their names say so).
        if path and Path(path).name.startswith((f"{PREFIX}{slot}-", "ssh-fleet-")):
            shutil.rmtree(path, ignore_errors=True)
    _state_file(slot).unlink(missing_ok=True)
    namespaces, links = _slot_objects(slot)
    if namespaces or links:
        raise FleetSetupError(f"could not remove {namespaces + links} of a test fleet")


def slot_leftovers(slot: int) -> list[str] | None:
    """The namespaces and links named for the slot, or None while a live fleet holds the slot (they are its own
    then). A fleet that closed cleanly leaves none, and nobody can add any while this looks (it holds the lock)."""
    fd = _try_lock(slot)
    if fd is None:
        return None
    try:
        namespaces, links = _slot_objects(slot)
        return namespaces + links
    finally:
        os.close(fd)


def cleanup_leftovers() -> list[int]:
    """Remove what fleets that died without close() left behind: every slot with namespaces, links or state
    but whose lock no live process holds. Returns the slots cleaned."""
    slots: set[int] = set()
    for name in _netns_names() + _link_names():
        match = _SLOT_NAME.match(name)
        if match:
            slots.add(int(match.group(1)))
    if STATE_DIR.is_dir():
        for state in STATE_DIR.glob("slot-*.json"):
            with contextlib.suppress(ValueError):
                slots.add(int(state.stem.removeprefix("slot-")))
    cleaned = []
    for slot in sorted(slots):
        fd = _try_lock(slot)
        if fd is None:
            continue  # a live fleet
        try:
            _remove_slot_objects(slot)
            cleaned.append(slot)
        finally:
            os.close(fd)
    return cleaned


# --- the fleet ---------------------------------------------------------------------------------------------------


class TestFleet:
    """Hosts started by `start_hosts`. Close it (or use it as a context manager) to remove everything."""

    __test__ = False  # not a pytest test class

    def __init__(self, *, slot: int, lock_fd: int, fleet_dir: Path, control_dir: Path, overlay: bool) -> None:
        self.slot = slot
        self.prefix = f"{PREFIX}{slot}"
        self.subnet = _subnet(slot)
        self.bridge = f"{self.prefix}-br"
        self.gateway = str(self.subnet.network_address + 1)
        self.overlay = overlay
        self.fleet_dir = fleet_dir
        self.control_dir = control_dir
        self.key = fleet_dir / "id_ed25519"
        self.hosts: tuple[SshHost, ...] = ()
        self.setup_s: float | None = None
        self.teardown_s: float | None = None
        self._lock_fd: int | None = lock_fd
        self._holders: dict[str, subprocess.Popen[bytes]] = {}  # unshare, parent of the holder
        self._holder_pids: dict[str, int] = {}  # pid 1 of each host's PID namespace (as seen from here)
        self._sshd: dict[str, subprocess.Popen[bytes]] = {}
        self._guard_route = False
        self._closed = False

    # -- lookups

    def host(self, name: str) -> SshHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in this fleet (hosts: {', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def host_dir(self, name: str) -> Path:
        """The host's own files on this machine: sshd_config, host key, pid file, sshd.log."""
        return self.fleet_dir / name

    def upper_dir(self, name: str) -> Path:
        """The overlay upper layer of the host: what it changed, by top directory (`upper_dir(n) / "usr/local/..."`).
        Read files through `run` instead where unchanged files matter."""
        if not self.overlay:
            raise ValueError("this fleet has no overlays (overlay=False)")
        return self.host_dir(name) / "layers" / "upper"

    def holder_pid(self, name: str) -> int:
        """The process that keeps the host's namespaces alive, pid 1 of its PID namespace (`nsenter -t <pid>`)."""
        return self._holder_pids[self.host(name).name]

    def _nsenter(self, name: str) -> list[str]:
        # --pid makes nsenter fork: the command runs as a child of nsenter, inside the host's PID namespace.
        return ["nsenter", "--target", str(self.holder_pid(name)), "--mount", "--uts", "--net", "--pid", "--"]

    # -- talking to hosts

    def ssh_args(self) -> list[str]:
        """ssh options for this fleet's hosts: the fleet key, no known_hosts, no user config, no multiplexing."""
        return ["-F", "/dev/null", "-i", str(self.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "ConnectTimeout=5", "-o", "ControlMaster=no", "-o", "ControlPath=none"]

    def ssh_command(self, name: str, command: str | Sequence[str]) -> list[str]:
        host = self.host(name)
        remote = command if isinstance(command, str) else shlex.join(command)
        return ["ssh", *self.ssh_args(), "-p", str(host.port), host.target, remote]

    def ssh(self, name: str, command: str | Sequence[str], *, timeout: float = 60,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a command on the host over ssh as root with the fleet key."""
        argv = self.ssh_command(name, command)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def run(self, name: str, command: str | Sequence[str], *, timeout: float = 60, check: bool = False,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command inside the host's network, mount and UTS namespaces, without ssh (for assertions and
        for setting a host up). A string goes to /bin/sh -c."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        full = [*self._nsenter(name), *argv]
        proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=False, cwd="/",
                              input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, full, proc.stdout, proc.stderr)
        return proc

    # -- Ansible

    def ssh_common_args(self) -> str:
        return ("-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                f"-o ControlPath={self.control_dir}/%C -o ControlMaster=auto -o ControlPersist=60s")

    def inventory(self, *, group_vars: Mapping[str, Any] | None = None,
                  host_vars: Mapping[str, Mapping[str, Any]] | None = None, pipelining: bool = True) -> dict[str, Any]:
        """The inventory as data: group `fleet` with every host, connection settings as group vars."""
        self._check_open()
        connection = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": self.ssh_common_args(),
            "ansible_pipelining": pipelining,
        }
        hosts = {h.name: {"ansible_host": h.address, "ansible_port": h.port, **dict((host_vars or {}).get(h.name, {}))}
                 for h in self.hosts}
        unknown = set(host_vars or {}) - set(hosts)
        if unknown:
            raise KeyError(f"host_vars for hosts not in the fleet: {sorted(unknown)}")
        return {"all": {"children": {"fleet": {"hosts": hosts, "vars": {**connection, **dict(group_vars or {})}}}}}

    def inventory_path(self, path: Path | None = None, **kwargs: Any) -> Path:
        """Write the inventory (YAML) and return its path; kwargs as for `inventory`."""
        target = path if path is not None else self.fleet_dir / "inventory.yml"
        target.write_text(yaml.safe_dump(self.inventory(**kwargs), sort_keys=False), encoding="utf-8")
        return target

    # -- breaking and mending hosts

    def close_master(self, name: str) -> None:
        """Close the ssh ControlPersist master Ansible keeps to the host (if any)."""
        host = self.host(name)
        _run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={self.control_dir}/%C", "-o", "User=root",
              "-p", str(host.port), "-O", "exit", host.address], check=False, timeout=10)

    def kill_sshd(self, name: str) -> None:
        """Make the host unreachable: its sshd and every ssh session on it are killed, Ansible's master to it is
        closed, and connections to it are refused (at once, from inside the namespace) until `restart_sshd`."""
        host = self.host(name)
        self.close_master(name)
        _kill_namespace_processes(host.namespace, keep=[self.holder_pid(name), self._holders[host.name].pid])
        proc = self._sshd.pop(host.name, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while _port_open(host.address, host.port) is not False:
            if time.monotonic() > deadline:
                raise FleetSetupError(f"{name}: port {host.port} still answers after killing sshd")
            time.sleep(0.02)

    def restart_sshd(self, name: str) -> None:
        """Start the host's sshd again (killing a running one first) and wait until it accepts connections."""
        host = self.host(name)
        if host.name in self._sshd:
            self.kill_sshd(name)
        self._start_sshd(host)
        self._wait_sshd(host)

    def sshd_running(self, name: str) -> bool:
        proc = self._sshd.get(self.host(name).name)
        return proc is not None and proc.poll() is None

    # -- setup (called by start_hosts)

    def _check_open(self) -> None:
        if self._closed:
            raise FleetSetupError("this fleet is closed")

    def _write_state(self) -> None:
        _state_file(self.slot).write_text(json.dumps({
            "pid": os.getpid(), "fleet_dir": str(self.fleet_dir), "control_dir": str(self.control_dir),
        }))

    def _setup_network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "addrgenmode", "none")  # no IPv6 link-local chatter
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        # Behind the bridge's own route (metric 0): if the bridge is gone, the subnet is unreachable instead of
        # going out through the default route.
        _ip("route", "add", "unreachable", str(self.subnet), "metric", str(GUARD_ROUTE_METRIC))
        self._guard_route = True

    def _add_host(self, index: int) -> SshHost:
        name = f"npuops-test-h{index}"
        namespace = f"{self.prefix}-h{index}"
        host = SshHost(name, str(self.subnet.network_address + HOST_OFFSET + index), SSH_PORT, namespace, index)
        self.hosts = (*self.hosts, host)
        _ip("netns", "add", namespace)
        _ip("link", "add", namespace, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", namespace, "addrgenmode", "none")
        _ip("link", "set", namespace, "master", self.bridge, "up")
        _ip("-n", namespace, "link", "set", "eth0", "addrgenmode", "none")
        _ip("-n", namespace, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        self._prepare_files(host)
        self._start_holder(host)
        self._start_sshd(host)
        return host

    def _prepare_files(self, host: SshHost) -> None:
        hdir = self.host_dir(host.name)
        hdir.mkdir()
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(hdir / "ssh_host_ed25519_key")])
        key_files = [str(self.fleet_dir / "authorized_keys")]
        if self.overlay:
            layers = hdir / "layers"
            for top in OVERLAID_DIRS:
                if Path(top).is_dir():
                    (layers / "upper" / top.lstrip("/")).mkdir(parents=True)
                    (layers / "work" / top.lstrip("/")).mkdir(parents=True)
            upper = layers / "upper"
            # A clean /root/.ssh (opaque: the machine's own keys and known_hosts do not show through) holding the
            # fleet key, as on a provisioned node. sshd also reads the fleet's own copy, so a playbook that rewrites
            # root's authorized_keys cannot lock the tests out.
            dot_ssh = upper / "root" / ".ssh"
            dot_ssh.mkdir(mode=0o700)
            os.setxattr(dot_ssh, "trusted.overlay.opaque", b"y")
            shutil.copyfile(self.fleet_dir / "authorized_keys", dot_ssh / "authorized_keys")
            (dot_ssh / "authorized_keys").chmod(0o600)
            (upper / "etc" / "hostname").write_text(f"{host.name}\n")
            (upper / "root" / ".bashrc").write_text(HOST_BASHRC)
            key_files.insert(0, ".ssh/authorized_keys")
        config = "\n".join([
            f"ListenAddress {host.address}:{host.port}",
            f"HostKey {hdir / 'ssh_host_ed25519_key'}",
            f"PidFile {hdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {' '.join(key_files)}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "LogLevel VERBOSE",
            "MaxStartups 50:30:100",
            "MaxSessions 50",
            "AcceptEnv LANG LC_*",
            "Subsystem sftp internal-sftp",
            "",
        ])
        (hdir / "sshd_config").write_text(config)

    def _holder_script(self, host: SshHost) -> str:
        lines = ["set -eu",
                 # Copies of /run/netns/* would keep other namespaces alive after `ip netns delete`.
                 "umount -R -l /run/netns 2>/dev/null || true"]
        if self.overlay:
            layers = self.host_dir(host.name) / "layers"
            for top in OVERLAID_DIRS:
                if Path(top).is_dir():
                    rel = top.lstrip("/")
                    options = f"lowerdir={top},upperdir={layers / 'upper' / rel},workdir={layers / 'work' / rel}"
                    lines.append(f"mount -t overlay {PREFIX}-overlay -o {options} {top}")
            lines += [f"mount -t tmpfs -o mode=0755,size=64m {PREFIX}-run /run", "mkdir -p /run/sshd /run/lock"]
        lines += [f"hostname {host.name}", "echo ready",
                  f"exec /usr/bin/python3 -c {shlex.quote(_INIT)} </dev/null >/dev/null 2>&1"]
        return "\n".join(lines)

    def _start_holder(self, host: SshHost) -> None:
        # ip netns exec execs unshare, which forks the holder as pid 1 of a new PID namespace (with its own /proc):
        # processes on a host see only the host's, so a playbook's kill or pkill cannot reach this machine's.
        argv = ["ip", "netns", "exec", host.namespace, "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child",
                "--mount-proc", "--propagation", "private", "--", "/bin/sh", "-c", self._holder_script(host)]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        self._holders[host.name] = proc
        assert proc.stdout is not None and proc.stderr is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        if line.strip() != b"ready":
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            err = proc.stderr.read().decode(errors="replace").strip() if proc.poll() is not None else ""
            raise FleetSetupError(f"{host.name}: setting up its namespaces failed: {err or 'no answer in 15 s'}")
        proc.stderr.close()
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        if len(children) != 1:
            raise FleetSetupError(f"{host.name}: expected one child of unshare ({proc.pid}), found {children}")
        self._holder_pids[host.name] = int(children[0])

    def _start_sshd(self, host: SshHost) -> None:
        hdir = self.host_dir(host.name)
        argv = [*self._nsenter(host.name), SSHD, "-D", "-f", str(hdir / "sshd_config"), "-E", str(hdir / "sshd.log")]
        self._sshd[host.name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")

    def _wait_sshd(self, host: SshHost, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        proc = self._sshd[host.name]
        while not _port_open(host.address, host.port):
            if proc.poll() is not None:
                log = (self.host_dir(host.name) / "sshd.log").read_text(errors="replace").strip()
                raise FleetSetupError(f"{host.name}: sshd exited {proc.returncode}: {log[-800:]}")
            if time.monotonic() > deadline:
                raise FleetSetupError(f"{host.name}: sshd not accepting on {host.address}:{host.port} "
                                      f"after {timeout} s")
            time.sleep(0.01)

    # -- teardown

    def close(self) -> None:
        """Remove everything: ssh masters, every process in the namespaces (sshd, sessions, the namespace holders;
        the overlays and /run tmpfs live only in their private mount namespaces and go with them), the namespaces,
        veths, bridge and guard route, the fleet's files, its state and lock. Idempotent."""
        if self._closed:
            return
        started = time.monotonic()
        errors: list[str] = []

        def attempt(what: str, action: Callable[[], object]) -> None:
            try:
                action()
            except Exception as exc:
                errors.append(f"{what}: {exc}")

        attempt("closing ssh masters", lambda: _close_masters(self.control_dir))
        for host in self.hosts:
            attempt(f"killing processes in {host.namespace}", lambda h=host: _kill_namespace_processes(h.namespace))
        for proc in [*self._sshd.values(), *self._holders.values()]:
            if proc.poll() is None:
                _kill(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)  # reap
        self._sshd.clear()
        # Veths before namespaces: deleting a veth removes both ends at once, while a deleted namespace takes its
        # end (and so the pair) with it only later, in the kernel's own time.
        links = _link_names()
        for host in self.hosts:
            if host.namespace in links:
                attempt(f"deleting link {host.namespace}", lambda h=host: _delete("link", h.namespace))
        if self.bridge in links:
            attempt(f"deleting bridge {self.bridge}", lambda: _delete("link", self.bridge))
        namespaces = _netns_names()
        for host in self.hosts:
            if host.namespace in namespaces:
                attempt(f"deleting namespace {host.namespace}", lambda h=host: _delete("netns", h.namespace))
        if self._guard_route:
            attempt("deleting the guard route", lambda: _ip("route", "delete", "unreachable", str(self.subnet),
                                                            "metric", str(GUARD_ROUTE_METRIC)))
        shutil.rmtree(self.control_dir, ignore_errors=True)
        shutil.rmtree(self.fleet_dir, ignore_errors=True)
        namespaces, links_left = _slot_objects(self.slot)
        if namespaces or links_left:
            errors.append(f"left behind: {namespaces + links_left}")
        if not errors:
            _state_file(self.slot).unlink(missing_ok=True)
        # Release the slot even after an error: the next start_hosts cleans what is left (the lock is free then).
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._closed = True
        self.teardown_s = time.monotonic() - started
        if errors:
            raise FleetSetupError("tearing the test fleet down: " + "; ".join(errors))

    def __enter__(self) -> TestFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.hosts)} hosts"
        return f"<TestFleet {self.prefix} {self.subnet} {state}>"


def _check_workdir(workdir: Path, overlay: bool) -> Path:
    path = workdir.resolve()
    if not _SAFE_PATH.match(str(path)):
        raise ValueError(f"workdir {path} has characters sshd_config and overlay options cannot take: "
                         "use letters, digits and ._+-/ only")
    if overlay:
        for top in OVERLAID_DIRS:
            if path == Path(top) or Path(top) in path.parents:
                raise ValueError(f"workdir {path} is under {top}, which each host overlays (the layers would "
                                 "overlap): use a directory under /tmp, e.g. pytest's tmp_path")
    return path


def start_hosts(n: int, workdir: Path, *, overlay: bool = True) -> TestFleet:
    """Start n SSH hosts (see the module docstring); their files go in a new directory under workdir.
    Raises FleetSetupError (after removing whatever was made) if a step fails."""
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"n must be 1..{MAX_HOSTS}, not {n}")
    started = time.monotonic()
    workdir = _check_workdir(Path(workdir), overlay)
    if os.geteuid() != 0:
        raise FleetSetupError("SSH test fleets need root")
    cleanup_leftovers()
    used = _routes_and_addresses()
    slot, lock_fd = -1, None
    for candidate in range(MAX_SLOTS):
        fd = _try_lock(candidate)
        if fd is None:
            continue
        if any(net.overlaps(_subnet(candidate)) for net in used):
            os.close(fd)
            continue
        slot, lock_fd = candidate, fd
        break
    if lock_fd is None:
        raise FleetSetupError(f"no free slot: all {MAX_SLOTS} test subnets "
                              f"{SUBNET_FIRST_OCTETS}.0-{MAX_SLOTS - 1}.0/24 are taken or overlap networks "
                              "of this machine")
    fleet_dir = Path(tempfile.mkdtemp(prefix="ssh-fleet-", dir=workdir))
    control_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{slot}-", dir=CONTROL_ROOT))
    fleet = TestFleet(slot=slot, lock_fd=lock_fd, fleet_dir=fleet_dir, control_dir=control_dir, overlay=overlay)
    try:
        fleet._write_state()
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "npuops-test-fleet", "-f", str(fleet.key)])
        shutil.copyfile(fleet.key.with_suffix(".pub"), fleet_dir / "authorized_keys")
        if not overlay:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        fleet._setup_network()
        for index in range(1, n + 1):
            fleet._add_host(index)
        for host in fleet.hosts:
            fleet._wait_sshd(host)
    except BaseException:
        with contextlib.suppress(FleetSetupError):
            fleet.close()
        raise
    fleet.setup_s = time.monotonic() - started
    return fleet


@contextlib.contextmanager
def running_fleet(n: int, workdir: Path, *, overlay: bool = True) -> Iterator[TestFleet]:
    """`with running_fleet(3, workdir) as fleet:` (same as `with start_hosts(...) as fleet:`)."""
    with start_hosts(n, workdir, overlay=overlay) as fleet:
        yield fleet


# --- pytest ------------------------------------------------------------------------------------------------------


def require_fleets() -> None:
    """Skip the calling test when fleets cannot start here (not root, packages missing and not installable);
    with NPUOPS_REQUIRE_FLEET=1 fail it instead. Installs missing packages first when root."""
    import pytest  # only here: the rest of the module runs without pytest (benchmarks/)

    reason = ensure_prerequisites()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason} ({REQUIRE_ENV}=1)")
        pytest.skip(reason)
