"""`npuops collect` on one node: everything a vendor or a colleague needs to diagnose it, in one bundle.

What it gathers (each part skipped, with why, where it cannot be had; npuops/support/bundle.py caps and lists it):
- node.json: the node model (`npuops node --json`); doctor.json: the level-2 doctor report;
- per instance (all, or the NAMEs): its record and rendered files (the env file too: it passes the redactor like
  everything else), the supervisor's status and engine log, its units' files, `systemctl show` and journal since
  --since;
- CANN's logs (plog and device logs under ascend/log) of root and of the service user, each tree its user's files
  only, each part ranked on its own, newest first, modified since --since, and vllm-ascend's where an instance's
  ascend_log_path moved them below its service user's places (npuops/support/log_trees.py); kernel messages about
  NPUs, OOM kills and segfaults since --since;
- `npu-smi info`, each chip's `npu-smi info -t health`, each NPU port's `hccn_tool -link -g` and `-net_health -g`,
  `msnpureport`'s export where the tool exists; `pip freeze` of the serving venv; uname and os-release.

What the engine's service user can write is read as hostile input (npuops/safefiles.py): every path is derived by
npuops from the state dir, the instance's name and the settings (npuops/support/instance_paths.py), never taken from
a record; only regular files are read, no link is followed, a FIFO is never opened, and a file's tail is read from
its end, so a 512 MiB log costs its last 8 MiB. What is left out is listed in the manifest with why.

Secrets never enter it: every file, and the manifest, pass one Redactor that knows the secrets of every instance of
the node (each env file, kept revision and record: npuops/support/node_instances.py, npuops/support/redact.py).
"""

from __future__ import annotations

import json
import pwd
import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from npuops import __version__
from npuops.hardware.node import Node, discover_node
from npuops.hardware.probe import Probe
from npuops.hardware.python_stack import stack_interpreter
from npuops.instance.record import MANAGER_FOREGROUND
from npuops.safefiles import ConfinedPath, NotRead, directory_entries, printable, read_tail, walk_regular_files
from npuops.settings import Settings
from npuops.support.bundle import Bundle
from npuops.support.instance_paths import InstancePaths, confined_record
from npuops.support.log_trees import (
    ASCEND_LOG_PARTS,
    CONFIG_READ_CAP,
    MAX_REFUSED_LISTED,
    LogTree,
    ascend_log_path,
    choose_part,
    confine_log_path,
)
from npuops.support.node_instances import NodeInstance, learn_secrets, node_instances
from npuops.support.redact import Redactor

# launch's service user (npuops/launch/instance_files.py SERVICE_USER; support may not import launch's layer).
DEFAULT_SERVICE_USER = "npuops"
# A user name as useradd takes it: nothing that could climb out of ascend-logs/<user>/ in the bundle.
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")

Progress = Callable[[str], None]
# Kernel messages worth a support case: the NPU driver's, OOM kills, crashes.
KERNEL_PATTERN = re.compile(r"(?i)davinci|\bnpu|hisi|ascend|devmm|drv_|hccn|out of memory|oom[-_ ]kill|"
                            r"killed process|segfault|general protection|call trace|pcie bus error")
COMMAND_TIMEOUT_S = 120.0
RUNTIME_UNIT_DIR = Path("/run/systemd/system")
SINCE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> int:
    """--since as seconds: 90s, 30m, 2h, 1d."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", text)
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"--since {text!r} is not a duration such as 30m, 2h or 1d")
    return int(match.group(1)) * SINCE_UNITS[match.group(2)]


@dataclass(frozen=True)
class CollectRequest:
    names: tuple[str, ...] = ()  # instances to include (empty: every one on the node)
    since_s: int = 7200
    bundle_cap: int = 256 * 2**20


def _since_arg(since_s: int) -> str:
    return f"-{since_s}s"


class NodeCollector:
    """Gathers one node's parts into a Bundle. Every file is read through npuops.safefiles (regular files only, no
    link followed, the tail from the end), from paths npuops derives itself."""

    def __init__(self, settings: Settings, request: CollectRequest, progress: Progress | None = None) -> None:
        self.settings = settings
        self.request = request
        self.probe = Probe(settings)
        self.progress = progress or (lambda _text: None)
        every = node_instances(settings)
        # A name takes its router's replicas along (their records name the router in `behind`).
        self.instances = [i for i in every if not request.names or i.name in request.names
                          or (i.record is not None and i.record.behind in request.names)]
        missing = sorted(set(request.names) - {i.name for i in self.instances})
        # The secrets of every instance of the node (not only those asked for: the node's journal names them all).
        self.bundle = Bundle(Redactor(learn_secrets(every)), bundle_cap=request.bundle_cap)
        for name in missing:
            self.bundle.skip(f"instance {printable(name)}", "no such instance on this node (`npuops list` names them)")

    # --- helpers ------------------------------------------------------------------------------------------------
    def _command(self, path: str, *argv: str, timeout: float = COMMAND_TIMEOUT_S) -> None:
        """Run a command and add its output (a failure's too, with its exit); a missing tool is skipped with why."""
        result = self.probe.run(*argv, timeout=timeout)
        if result.missing:
            self.bundle.skip(path, f"{argv[0]} is not installed here")
            return
        text = result.output
        if not result.ok:
            text += f"\n[exit {result.returncode}{': ' + result.error if result.error else ''}]\n"
        self.bundle.add(path, text, " ".join(argv))

    def _file(self, path: str, source: ConfinedPath, *, quiet_if_missing: bool = False,
              owner: int | None = None) -> None:
        """A file's tail (the file cap's worth, from the end); anything but a regular file (or, with `owner`, one
        that uid does not own) is skipped with why."""
        try:
            tail = read_tail(source, cap=self.bundle.file_cap, whole_lines=True, owner=owner)
        except NotRead as exc:
            if not (quiet_if_missing and exc.missing):
                self.bundle.skip(path, exc.reason)
            return
        self.bundle.add(path, tail.data, str(source), left_out=tail.left_out)

    def _tree(self, base: str, top: ConfinedPath) -> None:
        """The regular files of a directory tree under base/, every link, FIFO or device in it listed as skipped."""
        walk = walk_regular_files(top)
        for relative, why in walk.refused[:MAX_REFUSED_LISTED]:
            self.bundle.skip(f"{base}/{printable(str(relative))}", f"{top / relative} {why}")
        if len(walk.refused) > MAX_REFUSED_LISTED:
            self.bundle.skip(base, f"{len(walk.refused) - MAX_REFUSED_LISTED} more entries of {top} that are not "
                                   "regular files were left out")
        if walk.incomplete:
            self.bundle.skip(base, f"{top} has {walk.incomplete}")
        for found in sorted(walk.files, key=lambda f: f.relative):
            self._file(f"{base}/{printable(str(found.relative))}", top / found.relative)

    # --- the parts ----------------------------------------------------------------------------------------------
    def collect(self) -> Bundle:
        host = socket.gethostname()
        self.bundle.meta.update({"npuops_version": __version__, "host": host, "collected_at": time.time(),
                                 "since_s": self.request.since_s,
                                 "instances": [i.name for i in self.instances]})
        node = self._node()
        self._doctor()
        for instance in self.instances:
            self.progress(f"{host}: instance {instance.name}")
            self._instance(instance)
        self.progress(f"{host}: CANN logs and kernel messages")
        self._ascend_logs()
        self._kernel()
        self.progress(f"{host}: npu-smi, hccn_tool, msnpureport")
        self._vendor_tools(node)
        self._system()
        return self.bundle

    def _node(self) -> Node | None:
        self.progress(f"{socket.gethostname()}: node model")
        try:
            node = discover_node(self.probe)
        except Exception as exc:  # noqa: BLE001 - a bundle is wanted most when the node is broken
            self.bundle.skip("node.json", f"the node model failed: {exc}")
            return None
        self.bundle.add("node.json", json.dumps(node.to_json(), indent=2), "npuops node --json")
        return node

    def _doctor(self) -> None:
        self.progress(f"{socket.gethostname()}: doctor --level 2")
        from npuops.doctor.context import CheckContext, DoctorOptions
        from npuops.doctor.registry import discover_checks, select_checks
        from npuops.doctor.runner import run_checks

        try:
            checks = select_checks(discover_checks(), 2, None, None, None)
            report = run_checks(checks, CheckContext(self.probe, DoctorOptions()))
        except Exception as exc:  # noqa: BLE001
            self.bundle.skip("doctor.json", f"the doctor failed: {exc}")
            return
        self.bundle.add("doctor.json", json.dumps(report.to_json(), indent=2), "npuops doctor --level 2 --json")

    def _status(self, instance: NodeInstance, base: str) -> None:
        """`npuops status NAME --json`: the unit's state, the supervisor's stage and the diagnosis of a failure."""
        from npuops.instance.manager import service_manager
        from npuops.instance.status import instance_status

        if instance.record is None:
            self.bundle.skip(f"{base}/status-report.json", instance.problem)
            return
        try:
            # status reads the supervisor's file by name: only when it is a regular file (a FIFO would block it).
            read_tail(instance.paths.status_file, cap=1)
        except NotRead as exc:
            if not exc.missing:
                self.bundle.skip(f"{base}/status-report.json", f"not asked: {exc.reason}")
                return
        try:
            report = instance_status(confined_record(instance.record, instance.paths), service_manager(self.settings),
                                     metrics_interval_s=0.2)
        except Exception as exc:  # noqa: BLE001 - a bundle is wanted most when the instance is broken
            self.bundle.skip(f"{base}/status-report.json", f"its status failed: {exc}")
            return
        self.bundle.add(f"{base}/status-report.json", json.dumps(report.to_json(), indent=2),
                        f"npuops status {instance.name} --json")

    def _instance(self, instance: NodeInstance) -> None:
        base, paths = f"instances/{instance.name}", instance.paths
        if instance.problem:
            self.bundle.skip(f"{base}/instance.json", instance.problem)
        self._status(instance, base)
        try:
            self._tree(f"{base}/files", paths.instance_dir)
        except NotRead as exc:
            self.bundle.skip(f"{base}/files", exc.reason)
        self._file(f"{base}/status.json", paths.status_file)
        self._file(f"{base}/engine.log", paths.engine_log)
        self._units(base, paths)

    def _units(self, base: str, paths: InstancePaths) -> None:
        since = _since_arg(self.request.since_s)
        for unit in paths.units:
            for directory in dict.fromkeys((self.settings.unit_dir, RUNTIME_UNIT_DIR)):
                self._file(f"{base}/units/{unit}", ConfinedPath(directory, PurePosixPath(unit)), quiet_if_missing=True)
            self._command(f"{base}/systemctl-show-{unit}.txt", "systemctl", "show", "--no-pager", unit)
            self._command(f"{base}/journal-{unit}.log", "journalctl", "--unit", unit, "--since", since,
                          "--no-pager", "--output", "short-iso")

    def _service_users(self) -> list[str]:
        """The users the instances run as (launch's default where a record names none)."""
        users = {i.record.service_user or DEFAULT_SERVICE_USER for i in self.instances if i.record is not None}
        return sorted(users or {DEFAULT_SERVICE_USER})

    def _user(self, user: str, what: str | None = None) -> pwd.struct_passwd | None:
        """A service user's passwd entry; None, with why in the manifest (of `what`, its logs by default), where it
        has none."""
        if not USER_NAME.fullmatch(user):
            self.bundle.skip(what or f"ascend-logs/{printable(user)}", f"{printable(user)} is not a user name: its "
                                                                       "logs are not looked for")
            return None
        try:
            return pwd.getpwnam(user)
        except KeyError:
            self.bundle.skip(what or f"ascend-logs/{user}", f"no user {user} on this node: its logs are not looked for")
            return None

    def _log_trees(self) -> Iterator[LogTree]:
        """CANN's and vllm-ascend's logs of root and of the service users, each taking only its user's files, and
        the vllm-ascend log directories the instances name (npuops/support/log_trees.py)."""
        host = self.settings.host_path
        yield LogTree("root", ConfinedPath(host("/root"), PurePosixPath("ascend/log")), ASCEND_LOG_PARTS, "root", 0)
        for user in self._service_users():
            entry = self._user(user)
            if entry is not None:
                yield LogTree(user, ConfinedPath(host(entry.pw_dir), PurePosixPath("ascend/log")), ASCEND_LOG_PARTS,
                              user, entry.pw_uid)
        process_log = self.settings.environ.get("ASCEND_PROCESS_LOG_PATH")
        if process_log:  # root's own environment: its path is trusted as given, its files are root's
            yield LogTree("ascend-process-log-path", ConfinedPath(host(process_log)), ASCEND_LOG_PARTS,
                          "root (ASCEND_PROCESS_LOG_PATH)", 0)
        for instance in self.instances:
            tree = self._instance_log_tree(instance)
            if tree is not None:
                yield tree

    def _instance_log_tree(self, instance: NodeInstance) -> LogTree | None:
        """vllm-ascend's logs where an instance's vllm.yaml moved them (ascend_log_path): followed only below its
        service user's home or its status directory, a directory that user owns, taking that user's files."""
        label = f"{instance.name}-vllm-ascend"
        try:
            config = read_tail(instance.paths.instance_dir / "vllm.yaml", cap=CONFIG_READ_CAP + 1)
            if len(config.data) > CONFIG_READ_CAP:
                raise ValueError(f"its vllm.yaml is larger than {CONFIG_READ_CAP // 2**20} MiB")
            text = ascend_log_path(config.data)
        except NotRead:
            return None  # the instance's files are listed, or said missing, with them
        except ValueError as exc:
            self.bundle.skip(f"ascend-logs/{label}", f"no ascend_log_path looked for: {exc}")
            return None
        if text is None:
            return None
        record = instance.record
        if record is None:
            self.bundle.skip(f"ascend-logs/{label}", f"not followed: {instance.problem} (whose logs are unknown)")
            return None
        # A foreground run's engine runs as whoever started it: only its status directory (the instance's) counts.
        user = (record.service_user or DEFAULT_SERVICE_USER) if record.manager != MANAGER_FOREGROUND else None
        entry = self._user(user, f"ascend-logs/{label}") if user is not None else None
        if user is not None and entry is None:
            return None
        home = PurePosixPath(entry.pw_dir) if entry is not None else None
        try:
            top = confine_log_path(text, home=home, host_home=self.settings.host_path(str(home)) if home else None,
                                   status_dir=instance.paths.status_dir)
        except NotRead as exc:
            self.bundle.skip(f"ascend-logs/{label}", f"ascend_log_path in its vllm.yaml: {exc.reason}")
            return None
        return LogTree(label, top, (), f"{instance.name}'s service user {user or 'root'} (its ascend_log_path)",
                       entry.pw_uid if entry is not None else 0, top_owned=True)

    def _ascend_logs(self) -> None:
        """Each part of each log tree walked and ranked on its own; its user's log files, newest first."""
        cutoff = time.time() - self.request.since_s
        seen: set[str] = set()
        for tree in self._log_trees():
            if str(tree.top) in seen:
                continue
            seen.add(str(tree.top))
            try:
                directory_entries(tree.top, max_entries=1)
            except NotRead as exc:
                self.bundle.skip(f"ascend-logs/{tree.label}", f"{exc.reason} (no CANN process logged as "
                                 f"{tree.origin})" if exc.missing else exc.reason)
                continue
            for part in tree.parts or ("",):
                choice = choose_part(tree, part, since=cutoff)
                for what, why in choice.notes:
                    self.bundle.skip(what, why)
                for relative in choice.files:
                    self._file(f"ascend-logs/{tree.label}/{printable(str(relative))}", tree.top / relative,
                               owner=tree.owner)

    def _kernel(self) -> None:
        result = self.probe.run("journalctl", "--dmesg", "--since", _since_arg(self.request.since_s), "--no-pager",
                                "--output", "short-iso", timeout=COMMAND_TIMEOUT_S)
        source = "journalctl --dmesg"
        if not result.ok or not result.stdout.strip():
            result, source = self.probe.run("dmesg", "--time-format", "iso", timeout=COMMAND_TIMEOUT_S), "dmesg"
        if not result.ok:
            self.bundle.skip("kernel.log", f"neither the journal nor dmesg gave kernel messages "
                                           f"({result.error or result.stderr.strip()[:120] or result.returncode})")
            return
        lines = [line for line in result.stdout.splitlines() if KERNEL_PATTERN.search(line)]
        self.bundle.add("kernel.log", "\n".join(lines) + ("\n" if lines else ""),
                        f"{source}, lines about NPUs, OOM kills and crashes")

    def _vendor_tools(self, node: Node | None) -> None:
        self._command("npu-smi/info.txt", "npu-smi", "info")
        chips = [c.smi.npu_id for c in node.chips] if node is not None and node.chips else []
        for npu in sorted(set(chips)):
            self._command(f"npu-smi/health-{npu}.txt", "npu-smi", "info", "-t", "health", "-i", str(npu))
        devices = sorted({c.device_id for c in node.chips if c.has_nic}) if node is not None else []
        hccn = self.settings.hccn_tool
        if not devices:
            self.bundle.skip("hccn_tool", "the node model names no NPU: no port to ask")
        for device in devices:
            self._command(f"hccn_tool/link-{device}.txt", hccn, "-i", str(device), "-link", "-g")
            self._command(f"hccn_tool/net-health-{device}.txt", hccn, "-i", str(device), "-net_health", "-g")
        self._msnpureport()

    def _msnpureport(self) -> None:
        with tempfile.TemporaryDirectory(prefix="npuops-msnpureport-") as out:
            # msnpureport exports into its working directory: coreutils' env -C runs it in a private one (and
            # exits 127 where the tool is not installed).
            result = self.probe.run("env", "-C", out, "msnpureport", "-f", timeout=COMMAND_TIMEOUT_S)
            if result.missing:
                self.bundle.skip("msnpureport", "msnpureport is not installed here (CANN's toolkit ships it)")
                return
            self.bundle.add("msnpureport/output.txt", result.output, "msnpureport -f")
            self._tree("msnpureport", ConfinedPath(Path(out)))

    def _system(self) -> None:
        # Every npuops unit of the node in one journal (the doctor timer's, Ray nodes', routers', instances'
        # of other names): what the instances' own journals above leave out.
        self._command("system/journal-npuops-units.log", "journalctl", "--unit", "npuops-*", "--since",
                      _since_arg(self.request.since_s), "--no-pager", "--output", "short-iso")
        self._command("system/uname.txt", "uname", "-a")
        # /etc/os-release is root's (often a link to /usr/lib/os-release): followed.
        self._file("system/os-release", ConfinedPath(Path("/etc/os-release")))
        python = stack_interpreter(self.probe)
        self._command("system/pip-freeze.txt", python, "-m", "pip", "freeze")


def collect_node(settings: Settings, request: CollectRequest, progress: Progress | None = None) -> Bundle:
    return NodeCollector(settings, request, progress).collect()
