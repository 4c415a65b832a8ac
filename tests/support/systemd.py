"""Real systemd as PID 1, in a PID + mount (+ UTS, IPC) namespace over an overlay of this machine's root.

The distribution's own systemd, booted as a container's init (systemd.io/CONTAINER_INTERFACE), starts there in a
few seconds, with journald and dbus, and runs units with their whole sandbox (User=, ProtectSystem=, PrivateTmp=,
DevicePolicy=, the syscall filter), the watchdog and the journal; everything it writes lands in a tmpfs, so the
machine stays as it was. `RealSystemd.boot()` starts it, `run()` runs a command inside (nsenter), `reboot()` powers
it off and boots it again over the same overlay (units enabled before come back by themselves), `shutdown()` powers
it off and unmounts everything.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.support.engine import worker_cpu_binding

SYSTEMD = Path("/lib/systemd/systemd")
# Units that make no sense in the namespace (consoles, udev, the host's network and services).
MASKED = ("getty@tty1.service", "serial-getty@ttyS0.service", "console-getty.service", "systemd-udevd.service",
          "systemd-udev-trigger.service", "systemd-networkd.service", "ssh.service", "cron.service")
BOOT_TIMEOUT_S = 90.0
POWEROFF_TIMEOUT_S = 90.0

_INIT = """#!/bin/bash
# PID 1's parent: the namespace's own view of / is made private, the overlay gets /proc, /sys, /dev (with a
# /dev/shm of its own) and a fresh /run, the units named after the root are masked, then systemd takes over as
# PID 1 (exec keeps the PID).
set -e
ROOT="$1"
shift
mount --make-rprivate /
mount -t proc proc "$ROOT/proc"
mount --rbind /sys "$ROOT/sys"
mount --rbind /dev "$ROOT/dev"
# POSIX shared memory of its own: /dev/shm is this machine's otherwise, shared with every other namespace booted
# here, and a unit's RemoveIPC=yes (npuops' hardening) removes every segment of the service user's uid there when
# it stops: one test host stopping its engine would take the shared memory of the engines on another.
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$ROOT/dev/shm"
mount -t tmpfs -o mode=755 tmpfs "$ROOT/run"
for unit in "$@"; do ln -sf /dev/null "$ROOT/etc/systemd/system/$unit"; done
export container=npuops-test
exec chroot "$ROOT" /lib/systemd/systemd --system
"""


def machine_units(etc: Path = Path("/etc/systemd/system")) -> tuple[str, ...]:
    """This machine's own enabled services and timers (a database, apt timers): not the node's, masked inside."""
    found = [p.name for wants in ("multi-user.target.wants", "timers.target.wants", "sysinit.target.wants")
             for p in sorted((etc / wants).glob("*")) if p.suffix in (".service", ".timer")]
    return tuple(name for name in found if name not in MASKED)


def unavailable_reason() -> str | None:
    """Why real systemd cannot be booted here, or None."""
    if os.geteuid() != 0:
        return "booting systemd in a namespace needs root"
    for tool in ("unshare", "nsenter", "pgrep", "mount", "umount", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (util-linux, procps)"
    if not SYSTEMD.exists():
        return f"{SYSTEMD} is missing (Debian's systemd package)"
    return None


@dataclass
class RealSystemd:
    """One booted systemd; `base` holds its overlay (upper layer in a tmpfs) and its console log."""

    base: Path
    # A network namespace (`ip netns`) to boot in: a host of its own on the network (an SSH test host).
    netns: str | None = None
    unshare: subprocess.Popen[bytes] | None = None
    boots: int = 0
    _console: object = field(default=None, repr=False)
    _watcher: threading.Thread | None = field(default=None, repr=False)
    _stopping: bool = field(default=False, repr=False)
    _mounted: bool = field(default=False, repr=False)
    # Directories of this machine bind-mounted into the namespace (path inside -> directory here): one file system
    # several test hosts share, as an NFS mount is on a real group.
    binds: dict[str, Path] = field(default_factory=dict)
    # The manager's DefaultEnvironment= (every unit's, the node's own env files override it): this pytest-xdist
    # worker's engine core (tests/support/engine.py, worker_cpu_binding), so two workers' engines do not share one.
    environment: dict[str, str] = field(default_factory=lambda: worker_cpu_binding())

    @property
    def root(self) -> Path:
        """The namespace's / as this machine sees it: files written here are files inside."""
        return self.base / "root"

    @property
    def console_log(self) -> Path:
        return self.base / "console.log"

    @property
    def pid(self) -> int:
        """The namespace's PID 1 as this machine numbers it (the child of `unshare --fork`)."""
        assert self.unshare is not None, "not booted"
        found = subprocess.run(["pgrep", "-P", str(self.unshare.pid)], capture_output=True, text=True, check=False)
        children = found.stdout.split()
        if not children:
            raise RuntimeError(f"systemd is not running (see {self.console_log})")
        return int(children[0])

    def mount(self) -> None:
        """The overlay of this machine's root (its upper layer in a tmpfs), once: files written under `root` before
        the first boot are there when it boots."""
        if self._mounted:
            return
        self._mounted = True
        upper = self.base / "up"
        upper.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(upper)], check=True)
        (upper / "upper").mkdir()
        (upper / "work").mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir=/,upperdir={upper}/upper,workdir={upper}/work", str(self.root)], check=True)
        for inside, source in self.binds.items():
            target = self.root / inside.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
        if self.environment:
            conf = self.root / "etc/systemd/system.conf.d"
            conf.mkdir(parents=True, exist_ok=True)
            pairs = " ".join(f'"{name}={value}"' for name, value in self.environment.items())
            (conf / "npuops-test-environment.conf").write_text(f"[Manager]\nDefaultEnvironment={pairs}\n")

    def boot(self) -> None:
        """Boot systemd (the overlay is made on the first boot and kept across reboots) and wait until it runs."""
        self.mount()
        init = self.base / "init.sh"
        init.write_text(_INIT, encoding="utf-8")
        init.chmod(0o755)
        console = open(self.console_log, "ab")  # noqa: SIM115 - closed in shutdown()
        self._console = console
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.unshare = subprocess.Popen([*prefix, "unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", str(init),
                                         str(self.root), *MASKED, *machine_units()], stdin=subprocess.DEVNULL,
                                        stdout=console,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.boots += 1
        self.wait_running()

    def wait_running(self, timeout: float = BOOT_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self.unshare is not None and self.unshare.poll() is not None:
                raise RuntimeError(f"the namespace's systemd exited (see {self.console_log})")
            try:
                state = self.run(["systemctl", "is-system-running"], timeout=10).stdout.strip()
            except (RuntimeError, subprocess.TimeoutExpired):
                state = ""
            if state in ("running", "degraded"):
                return state
            time.sleep(0.3)
        raise RuntimeError(f"systemd did not come up within {timeout:.0f} s (state {state!r}; see {self.console_log})")

    def _nsenter(self) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-r", "-w", *(["-n"] if self.netns else [])]

    def follow_reboots(self) -> None:
        """Boot again whenever the namespace reboots itself (`systemctl reboot`, `shutdown -r`, Ansible's reboot):
        systemd's final reboot(2) in a PID namespace ends its init with SIGHUP (a power-off: SIGINT), as the
        machine's firmware would start the node again."""
        def watch() -> None:
            while not self._stopping:
                unshare = self.unshare
                if unshare is None or unshare.poll() is None or unshare.returncode != -signal.SIGHUP:
                    time.sleep(0.2)  # running, or powered off by this harness (reboot(), shutdown())
                    continue
                if not self._stopping:
                    self.boot()

        self._watcher = threading.Thread(target=watch, name="systemd-reboots", daemon=True)
        self._watcher.start()

    def run(self, argv: Sequence[str], *, timeout: float = 120.0, env: Mapping[str, str] | None = None,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """A command inside the namespace (its mounts, PIDs, hostname, IPC; this machine's network)."""
        command = [*self._nsenter(), *argv]
        environment = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
                       "HOME": "/root", **(env or {})}
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment,
                              input=input_text, check=False)

    def popen(self, argv: Sequence[str]) -> Following:
        """A command left running inside the namespace, its output read as it comes."""
        command = [*self._nsenter(), *argv]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        return Following(process)

    def popen_to(self, argv: Sequence[str], out: IO[bytes]) -> subprocess.Popen[bytes]:
        """A command started inside the namespace, its output (stdout and stderr) to `out`."""
        return subprocess.Popen([*self._nsenter(), *argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                                               "LC_ALL": "C.UTF-8", "HOME": "/root"})

    def check(self, argv: Sequence[str], **kwargs: object) -> str:
        done = self.run(argv, **kwargs)  # type: ignore[arg-type]
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed (rc {done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def unit_property(self, unit: str, name: str) -> str:
        return self.check(["systemctl", "show", "--value", f"--property={name}", unit]).strip()

    def _poweroff(self) -> None:
        if self.unshare is None or self.unshare.poll() is not None:
            return
        try:
            # SIGRTMIN+4: systemd's "power off" (systemd(1), SIGNALS).
            os.kill(self.pid, signal.SIGRTMIN + 4)
            self.unshare.wait(timeout=POWEROFF_TIMEOUT_S)
        except (RuntimeError, ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.unshare.pid, signal.SIGKILL)
            self.unshare.wait()

    def reboot(self) -> None:
        """Power the namespace off and boot it again over the same overlay: a node's reboot."""
        self._poweroff()
        self.boot()

    def shutdown(self) -> None:
        """Power off, then unmount the overlay and its tmpfs: nothing of it stays on this machine."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.join(timeout=BOOT_TIMEOUT_S)
        self._poweroff()
        binds = [self.root / inside.lstrip("/") for inside in self.binds]
        for mount in (*binds, self.root, self.base / "up"):
            subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        if self._console is not None:
            self._console.close()  # type: ignore[attr-defined]


SERVICE_USER = "npuops"
# Inside the namespace: where the tests keep their models (outside what the units' sandbox hides).
MODELS = Path("/srv/npuops-test/models")
TINY_FLAGS = ("--hardware", "cpu", "--dtype", "float32", "--max-model-len", "512", "--input-len", "256",
              "--output-len", "64", "--enforce-eager", "--kv-cache-memory-bytes", "268435456")


@dataclass
class ServingNode:
    """A booted systemd with what a provisioned node has: the service user, npuops and vllm in the serving venv
    (the engine venv, with this checkout's npuops installed into it inside the overlay), a model under /srv."""

    systemd: RealSystemd
    venv: Path
    model: Path

    def npuops(self, *args: str, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        return self.systemd.run([str(self.venv / "bin" / "npuops"), *args], timeout=timeout)

    def launch(self, name: str, port: int, *extra: str, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        return self.npuops("launch", str(self.model), *TINY_FLAGS, "--name", name, "--port", str(port),
                           "--vllm", str(self.venv / "bin" / "vllm"), *extra, timeout=timeout)


# Inside the namespace: where this checkout's source is copied to be installed (its own /tmp is a fresh tmpfs,
# so a checkout under /tmp, as CI's clone may be, is not there).
SOURCE_COPY = Path("/srv/npuops-test/src")
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".mypy_cache",
                                     ".ruff_cache", ".pytest_cache")


def install_npuops(systemd: RealSystemd, engine_python: Path, repo: Path) -> None:
    """This checkout's npuops installed (not editable) into the engine venv inside the overlay, from a copy of its
    source there: as a provisioned node has npuops in its serving venv."""
    target = systemd.root / SOURCE_COPY.relative_to("/")
    shutil.copytree(repo, target, ignore=_NOT_SOURCE, dirs_exist_ok=True)
    systemd.check([str(engine_python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                   "--no-index", str(SOURCE_COPY)], timeout=600)


def prepare_serving_node(systemd: RealSystemd, engine_python: Path, repo: Path, model: Path, *,
                         copy_model: bool = True) -> ServingNode:
    """The service user, this checkout's npuops installed (not editable) into the engine venv, the model copied
    under /srv (or, `copy_model=False`, used where it is: it must lie where the sandbox lets the user read it): all
    inside the overlay, none of it on this machine."""
    venv = engine_python.parent.parent
    systemd.check(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER])
    install_npuops(systemd, engine_python, repo)
    if not copy_model:
        return ServingNode(systemd, venv, model)
    inside = MODELS / model.name
    shutil.copytree(model, systemd.root / inside.relative_to("/"))
    return ServingNode(systemd, venv, inside)


@dataclass
class Following:
    """A command kept running inside the namespace (`npuops logs -f`), read as it prints."""

    process: subprocess.Popen[bytes]

    def read_until(self, done: Callable[[str], bool], timeout: float) -> str:
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        os.set_blocking(descriptor, False)
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not done(data.decode(errors="replace")):
            try:
                chunk = os.read(descriptor, 65536)
            except BlockingIOError:
                chunk = b""
            if chunk:
                data += chunk
            else:
                time.sleep(0.2)
        return data.decode(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
