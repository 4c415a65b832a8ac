"""`npuops collect` on one node: everything a vendor or a colleague needs to diagnose it, in one bundle.

What it gathers (each part skipped, with why, where it cannot be had; npuops/support/bundle.py caps and lists it):
- node.json: the node model (`npuops node --json`); doctor.json: the level-2 doctor report;
- per instance (all, or the NAMEs): its record and rendered files (the env file too: it passes the redactor like
  everything else), the supervisor's status and engine log, its units' files, `systemctl show` and journal since
  --since;
- CANN's logs (plog and device logs under ascend/log) of root and of the service user, newest first, modified since
  --since; kernel messages about NPUs, OOM kills and segfaults since --since;
- `npu-smi info`, each chip's `npu-smi info -t health`, each NPU port's `hccn_tool -link -g` and `-net_health -g`,
  `msnpureport`'s export where the tool exists; `pip freeze` of the serving venv; uname and os-release.

Secrets never enter it: every file passes one Redactor that knows each instance's API key, Ray token and the env
files' secret variables (npuops/support/redact.py).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from npuops import __version__
from npuops.envfile import parse_env_file
from npuops.hardware.node import Node, discover_node
from npuops.hardware.probe import Probe
from npuops.hardware.python_stack import stack_interpreter
from npuops.instance.record import InstanceRecord, list_records
from npuops.settings import Settings
from npuops.support.bundle import Bundle
from npuops.support.redact import Redactor, secret_values

# launch's service user (npuops/launch/instance_files.py SERVICE_USER; support may not import launch's layer).
DEFAULT_SERVICE_USER = "npuops"

Progress = Callable[[str], None]
# CANN's logs: what `ascend/log` under a user's home holds (plog: the host processes' logs; device-N: the chips').
# vllm_ascend: vllm-ascend's own log files (its logger's default ~/ascend/log/vllm_ascend, from PR #10306).
ASCEND_LOG_PARTS = ("debug/plog", "run/plog", "debug/device-*", "run/device-*", "security/plog", "vllm_ascend")
# An instance may move vllm-ascend's logs elsewhere: --additional-config's ascend_log_path.
# (vllm.yaml holds --additional-config as a JSON string in YAML double quotes: its quotes come escaped.)
ASCEND_LOG_PATH = re.compile(r'ascend_log_path\\?"?\s*:\s*\\?"([^"\\]+)')
MAX_LOG_FILES = 40  # per log directory tree, newest first
# Kernel messages worth a support case: the NPU driver's, OOM kills, crashes.
KERNEL_PATTERN = re.compile(r"(?i)davinci|\bnpu|hisi|ascend|devmm|drv_|hccn|out of memory|oom[-_ ]kill|"
                            r"killed process|segfault|general protection|call trace|pcie bus error")
COMMAND_TIMEOUT_S = 120.0
UNIT_DIRS = (Path("/etc/systemd/system"), Path("/run/systemd/system"))
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


def instance_secrets(records: list[InstanceRecord]) -> list[str]:
    """Every secret value the instances' env files hold (their API keys, Ray tokens, secret variables)."""
    found: list[str] = []
    for record in records:
        try:
            found += secret_values(parse_env_file(record.env_file.read_text(encoding="utf-8", errors="replace")))
        except (OSError, ValueError):
            continue
    return found


def _since_arg(since_s: int) -> str:
    return f"-{since_s}s"


class NodeCollector:
    """Gathers one node's parts into a Bundle."""

    def __init__(self, settings: Settings, request: CollectRequest, progress: Progress | None = None) -> None:
        self.settings = settings
        self.request = request
        self.probe = Probe(settings)
        self.progress = progress or (lambda _text: None)
        # A name takes its router's replicas along (their records name the router in `behind`).
        self.records = [r for r in list_records(settings.state_dir)
                        if not request.names or r.name in request.names or r.behind in request.names]
        missing = sorted(set(request.names) - {r.name for r in self.records})
        self.bundle = Bundle(Redactor(instance_secrets(self.records)), bundle_cap=request.bundle_cap)
        for name in missing:
            self.bundle.skip(f"instance {name}", "no such instance on this node (`npuops list` names them)")

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

    def _file(self, path: str, source: Path) -> None:
        try:
            data = source.read_bytes()
        except FileNotFoundError:
            self.bundle.skip(path, f"{source} does not exist")
            return
        except OSError as exc:
            self.bundle.skip(path, f"cannot read {source}: {exc.strerror}")
            return
        self.bundle.add(path, data, str(source))

    # --- the parts ----------------------------------------------------------------------------------------------
    def collect(self) -> Bundle:
        host = socket.gethostname()
        self.bundle.meta.update({"npuops_version": __version__, "host": host, "collected_at": time.time(),
                                 "since_s": self.request.since_s,
                                 "instances": [r.name for r in self.records]})
        node = self._node()
        self._doctor()
        for record in self.records:
            self.progress(f"{host}: instance {record.name}")
            self._instance(record)
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

    def _status(self, record: InstanceRecord, base: str) -> None:
        """`npuops status NAME --json`: the unit's state, the supervisor's stage and the diagnosis of a failure."""
        from npuops.instance.manager import service_manager
        from npuops.instance.status import instance_status

        try:
            report = instance_status(record, service_manager(self.settings), metrics_interval_s=0.2)
        except Exception as exc:  # noqa: BLE001 - a bundle is wanted most when the instance is broken
            self.bundle.skip(f"{base}/status-report.json", f"its status failed: {exc}")
            return
        self.bundle.add(f"{base}/status-report.json", json.dumps(report.to_json(), indent=2),
                        f"npuops status {record.name} --json")

    def _instance(self, record: InstanceRecord) -> None:
        base = f"instances/{record.name}"
        self._status(record, base)
        if record.directory.is_dir():
            for path in sorted(p for p in record.directory.rglob("*") if p.is_file()):
                self._file(f"{base}/files/{path.relative_to(record.directory)}", path)
        self._file(f"{base}/status.json", Path(record.status_file))
        self._file(f"{base}/engine.log", record.engine_log)
        since = _since_arg(self.request.since_s)
        for unit in record.units:
            for directory in UNIT_DIRS:
                unit_file = directory / unit
                if unit_file.exists():
                    self._file(f"{base}/units/{unit}", unit_file)
            self._command(f"{base}/systemctl-show-{unit}.txt", "systemctl", "show", "--no-pager", unit)
            self._command(f"{base}/journal-{unit}.log", "journalctl", "--unit", unit, "--since", since,
                          "--no-pager", "--output", "short-iso")

    def _service_users(self) -> list[str]:
        """The users the instances run as (launch's default where a record names none)."""
        users = {r.service_user or DEFAULT_SERVICE_USER for r in self.records}
        return sorted(users or {DEFAULT_SERVICE_USER})

    def _log_homes(self) -> Iterator[tuple[str, Path, tuple[str, ...]]]:
        """(label, directory, its parts to read): CANN's and vllm-ascend's logs of root and of the service users,
        and the vllm-ascend log directories the instances name."""
        seen: set[Path] = set()
        homes = [("root", Path("/root"))]
        for user in self._service_users():
            try:
                homes.append((user, Path(pwd.getpwnam(user).pw_dir)))
            except KeyError:
                self.bundle.skip(f"ascend-logs/{user}", f"no user {user} on this node")
        for who, home in homes:
            for root in {home / "ascend" / "log", *([Path(os.environ["ASCEND_PROCESS_LOG_PATH"])]
                                                    if os.environ.get("ASCEND_PROCESS_LOG_PATH") else [])}:
                if root not in seen:
                    seen.add(root)
                    yield who, root, ASCEND_LOG_PARTS
        for record in self.records:
            try:
                config = record.config_file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for found in ASCEND_LOG_PATH.findall(config):
                if Path(found) not in seen and Path(found).is_absolute():
                    seen.add(Path(found))
                    yield f"{record.name}-vllm-ascend", Path(found), ("",)

    def _ascend_logs(self) -> None:
        cutoff = time.time() - self.request.since_s
        for who, root, parts in self._log_homes():
            host_root = self.settings.host_path(root)
            if not host_root.is_dir():
                self.bundle.skip(f"ascend-logs/{who}", f"{root} does not exist (no CANN process logged as {who})")
                continue
            files: list[tuple[float, Path]] = []
            for part in parts:
                for directory in (host_root.glob(part) if part else [host_root]):
                    for path in directory.rglob("*"):
                        try:
                            mtime = path.stat().st_mtime
                        except OSError:
                            continue
                        if path.is_file() and mtime >= cutoff:
                            files.append((mtime, path))
            files.sort(reverse=True)
            if len(files) > MAX_LOG_FILES:
                self.bundle.skip(f"ascend-logs/{who}", f"{len(files) - MAX_LOG_FILES} older log files left out "
                                                       f"(the newest {MAX_LOG_FILES} are in)")
            for _mtime, path in files[:MAX_LOG_FILES]:
                self._file(f"ascend-logs/{who}/{path.relative_to(host_root)}", path)

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
            for path in sorted(Path(out).rglob("*")):
                if path.is_file():
                    self._file(f"msnpureport/{path.relative_to(out)}", path)

    def _system(self) -> None:
        # Every npuops unit of the node in one journal (the doctor timer's, Ray nodes', routers', instances'
        # of other names): what the instances' own journals above leave out.
        self._command("system/journal-npuops-units.log", "journalctl", "--unit", "npuops-*", "--since",
                      _since_arg(self.request.since_s), "--no-pager", "--output", "short-iso")
        self._command("system/uname.txt", "uname", "-a")
        self._file("system/os-release", Path("/etc/os-release"))
        python = stack_interpreter(self.probe)
        self._command("system/pip-freeze.txt", python, "-m", "pip", "freeze")


def collect_node(settings: Settings, request: CollectRequest, progress: Progress | None = None) -> Bundle:
    return NodeCollector(settings, request, progress).collect()
