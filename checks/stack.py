"""Python stack: torch, torch_npu, vllm, vllm-ascend and triton-ascend form one compatible row, and torch_npu imports.

The rows and tables are npuops/data/compat.toml (ascend-deployer, Ascend/pytorch, vllm-ascend
versioning_policy.md; docs/sources.md). Versions come from distribution metadata
(`node.python_stack`); only `torch-npu-import` actually imports anything, in a subprocess of the stack's
interpreter with the service's environment, because a failed torch_npu import can take the importing process
down with it ("Failed to load the backend extension: torch_npu", vllm-ascend #1440).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity
from npuops.failures import (
    DEVICE_TYPE_FIX,
    DEVICE_TYPE_MESSAGE,
    PROVISION_CANN,
    PROVISION_PYTHON,
    classify_import_failure,
)
from npuops.hardware.probe import RC_NOT_EXECUTABLE, RC_NOT_FOUND, RC_TIMEOUT
from npuops.hardware.python_stack import PythonStack, stack_interpreter
from npuops.hardware.versions import parse_ascend_version
from npuops.parsing import ParseError

# The components of a row, in the order the release matrix lists them, with their PyPI names.
COMPONENTS = ("torch", "torch_npu", "vllm", "vllm_ascend", "triton_ascend")
PIP_NAMES = {
    "torch": "torch",
    "torch_npu": "torch-npu",
    "vllm": "vllm",
    "vllm_ascend": "vllm-ascend",
    "triton_ascend": "triton-ascend",
}


# --- the compat data --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackRow:
    """One row of the vllm-ascend release matrix: installed and checked as a unit."""

    name: str
    pins: Mapping[str, str]  # component -> exact version; a component the row does not pin is absent
    python: tuple[str, str]  # inclusive "3.10", "3.12"
    cann: str


@dataclass(frozen=True)
class Compat:
    rows: tuple[StackRow, ...]  # newest first, as in the file
    torch_npu_cann: Mapping[str, str]


def parse_compat(data: Mapping[str, Any]) -> Compat:
    """The stack rows and the torch_npu -> CANN table out of compat.toml's parsed TOML."""
    rows: list[StackRow] = []
    for raw in data.get("stack", []):
        pins = {c: str(raw[c]) for c in COMPONENTS if raw.get(c)}
        low, high = (str(v) for v in raw["python"])
        rows.append(StackRow(str(raw["name"]), pins, (low, high), str(raw["cann"])))
    table = {str(k): str(v) for k, v in data.get("torch_npu_cann", {}).items()}
    return Compat(tuple(rows), table)


@lru_cache(maxsize=1)
def load_compat() -> Compat:
    return parse_compat(load_data_toml("compat.toml"))


# --- pip versions -----------------------------------------------------------------------------------------------


def public_version(version: str) -> str:
    """A pip version without its local label, normalised: torch "2.5.1+cpu" and vllm "0.9.1+empty" (the builds
    the Ascend install guides use) are the releases 2.5.1 and 0.9.1."""
    text = version.strip().lower().split("+", 1)[0]
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging comes with ansible-core
        return text
    try:
        return str(Version(text))
    except InvalidVersion:
        return text


def same_release(installed: str | None, pinned: str) -> bool:
    return installed is not None and public_version(installed) == public_version(pinned)


def _release_key(version: str) -> Any:
    """An ordering key for pip versions (None when it cannot be ordered)."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover
        return None
    try:
        return Version(public_version(version))
    except InvalidVersion:
        return None


# --- matching the installed stack against the rows --------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    component: str
    installed: str | None
    wanted: str

    def describe(self) -> str:
        name = PIP_NAMES[self.component]
        have = self.installed if self.installed is not None else "not installed"
        return f"{name} {have} (row wants {self.wanted})"


@dataclass(frozen=True)
class RowMatch:
    row: StackRow
    differences: tuple[Difference, ...]

    @property
    def exact(self) -> bool:
        return not self.differences


def match_row(versions: Mapping[str, str | None], row: StackRow) -> RowMatch:
    diffs = tuple(Difference(c, versions.get(c), pin) for c, pin in row.pins.items()
                  if not same_release(versions.get(c), pin))
    return RowMatch(row, diffs)


def closest_row(versions: Mapping[str, str | None], rows: Sequence[StackRow]) -> RowMatch | None:
    """The row sharing the most pins with what is installed; on a tie the one with the installed vllm-ascend,
    then the newest (rows are listed newest first)."""
    best: tuple[tuple[int, int, int], RowMatch] | None = None
    for index, row in enumerate(rows):
        match = match_row(versions, row)
        agree = len(row.pins) - len(match.differences)
        same_plugin = int(same_release(versions.get("vllm_ascend"), row.pins.get("vllm_ascend", "")))
        key = (agree, same_plugin, -index)
        if best is None or key > best[0]:
            best = (key, match)
    return best[1] if best else None


def row_for_stack(versions: Mapping[str, str | None], rows: Sequence[StackRow]) -> StackRow | None:
    """The row the installed stack belongs to: the exact match, else the row of its vllm-ascend, else the closest."""
    for row in rows:
        if match_row(versions, row).exact:
            return row
    plugin = versions.get("vllm_ascend")
    for row in rows:
        if plugin is not None and same_release(plugin, row.pins.get("vllm_ascend", "")):
            return row
    closest = closest_row(versions, rows)
    return closest.row if closest else None


def install_command(differences: Sequence[Difference]) -> str:
    return "pip install " + " ".join(f"'{PIP_NAMES[d.component]}=={d.wanted}'" for d in differences)


def _no_stack(stack: PythonStack) -> Result | None:
    """Skip when the lookup failed or nothing of the NPU stack is installed (a CPU-only machine), else None."""
    where = stack.executable or "the stack interpreter"
    if stack.error:
        return Result.skip(f"cannot read the Python stack of {where}: {stack.error}",
                           "see `npuops doctor --only stack-row`", executable=stack.executable, error=stack.error)
    if stack.version("torch_npu") is None and stack.version("vllm_ascend") is None:
        return Result.skip(f"no NPU Python stack in {where} (neither torch_npu nor vllm-ascend is installed)",
                           f"install the serving stack: {PROVISION_PYTHON}, or point npuops at its interpreter "
                           "(NPUOPS_STACK_PYTHON=/path/to/venv/bin/python)", executable=stack.executable)
    return None


def _installed(stack: PythonStack) -> dict[str, str | None]:
    return {c: stack.version(c) for c in COMPONENTS}


class StackRowCheck(Check):
    """torch, torch_npu, vllm, vllm-ascend and triton-ascend are one row of the vllm-ascend release matrix."""

    id = "stack-row"
    area = "stack"
    severity = Severity.HIGH
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        stack = ctx.node.python_stack
        if stack.error:
            # The interpreter itself is broken or missing: nothing else in this family can answer.
            return Result.fail(f"cannot read the Python stack: {stack.error}",
                               "check the serving interpreter (NPUOPS_STACK_PYTHON, or the venv "
                               f"{ctx.settings.venv}/bin/python) runs; recreate it with {PROVISION_PYTHON}",
                               executable=stack.executable, error=stack.error)
        skipped = _no_stack(stack)
        if skipped is not None:
            return skipped
        compat = load_compat()
        versions = _installed(stack)
        installed = {PIP_NAMES[c]: v for c, v in versions.items() if v is not None}
        for row in compat.rows:
            if match_row(versions, row).exact:
                return Result.passed(f"row {row.name}: " + ", ".join(f"{PIP_NAMES[c]} {versions[c]}" for c in row.pins),
                                     row=row.name, installed=installed, executable=stack.executable)
        closest = closest_row(versions, compat.rows)
        assert closest is not None, "compat.toml has no stack rows"
        plugin = versions["vllm_ascend"]
        known_plugin = plugin is not None and any(same_release(plugin, r.pins.get("vllm_ascend", ""))
                                                  for r in compat.rows)
        evidence: dict[str, Any] = {
            "installed": installed,
            "closest_row": closest.row.name,
            "row_pins": {PIP_NAMES[c]: v for c, v in closest.row.pins.items()},
            "differences": [{"component": PIP_NAMES[d.component], "installed": d.installed, "wanted": d.wanted}
                            for d in closest.differences],
            "executable": stack.executable,
        }
        fix = (f"install row {closest.row.name} as one unit: {install_command(closest.differences)} "
               f"(then `pip check`), or {PROVISION_PYTHON}")
        torch_ok = self._torch_pair_ok(versions)
        evidence["torch_pair_ok"] = torch_ok
        if plugin is not None and not known_plugin and torch_ok and self._newer_than(plugin, compat.rows[0]):
            # A release after npuops' table was written: npuops cannot judge it, the operator can.
            return Result.warn(f"vllm-ascend {plugin} is newer than every row of npuops' compat table; the closest "
                               f"known row is {closest.row.name}", "check the pins of your vllm-ascend release in its "
                               "versioning policy (docs/source/community/versioning_policy.md), or install a "
                               f"known row: {fix}", **evidence)
        differing = "; ".join(d.describe() for d in closest.differences)
        if not torch_ok:
            differing += f"; torch_npu {versions['torch_npu']} needs torch of the same release, not {versions['torch']}"
        return Result.fail(f"not a compatible row: closest is {closest.row.name}, which differs in {differing}", fix,
                           **evidence)

    @staticmethod
    def _torch_pair_ok(versions: Mapping[str, str | None]) -> bool:
        """torch_npu X.Y.Z requires torch X.Y.Z exactly (the Ascend/pytorch README)."""
        torch, npu = versions.get("torch"), versions.get("torch_npu")
        if npu is None:
            return True
        if torch is None:
            return False
        base = re.match(r"\d+\.\d+\.\d+", public_version(npu))
        return base is not None and public_version(torch) == base.group(0)

    @staticmethod
    def _newer_than(version: str, row: StackRow) -> bool:
        mine, theirs = _release_key(version), _release_key(row.pins.get("vllm_ascend", ""))
        return mine is not None and theirs is not None and bool(mine > theirs)


def _python_minor(text: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


class PythonVersion(Check):
    """The serving interpreter's Python version is inside the range of the stack's row."""

    id = "python-version"
    area = "stack"
    severity = Severity.HIGH
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        stack = ctx.node.python_stack
        skipped = _no_stack(stack)
        if skipped is not None:
            return skipped
        versions = _installed(stack)
        row = row_for_stack(versions, load_compat().rows)
        python = _python_minor(stack.python or "")
        if row is None or python is None:
            return Result.skip(f"cannot tell the Python version of {stack.executable} ({stack.python!r})",
                               f"run `{stack.executable} --version`; recreate the venv with {PROVISION_PYTHON}")
        low, high = (_python_minor(v) for v in row.python)
        assert low is not None and high is not None, f"bad python range in compat.toml row {row.name}"
        exact = match_row(versions, row).exact
        evidence = {"python": stack.python, "row": row.name, "row_is_exact": exact,
                    "range": f"{row.python[0]}-{row.python[1]}", "executable": stack.executable}
        which = f"row {row.name}" if exact else f"row {row.name}, the nearest to what is installed"
        if low <= python <= high:
            return Result.passed(f"Python {stack.python} is inside {row.python[0]}-{row.python[1]} ({which})",
                                 **evidence)
        return Result.fail(f"Python {stack.python} is outside {row.python[0]}-{row.python[1]}, the range of row "
                           f"{row.name}", f"create the serving venv with python{row.python[1]} (or any "
                           f"{row.python[0]}-{row.python[1]}) and reinstall the row: {PROVISION_PYTHON}", **evidence)


def cann_for_torch_npu(torch_npu: str, compat: Compat) -> tuple[set[str], str]:
    """The CANN releases a torch_npu version is built for, and where the answer came from.

    The torch_npu -> CANN table and the stack rows are separate sources that sometimes name different patch
    releases for one torch_npu (2.9.0: table 8.5.0, row 0.19.1rc1 8.5.1); either is accepted. A version in
    neither (a .postN or dev build) falls back to its base release's entry, and says so.
    """
    wanted: set[str] = set()
    sources: list[str] = []
    for key, cann in compat.torch_npu_cann.items():
        if same_release(torch_npu, key):
            wanted.add(cann)
            sources.append("compat.toml torch_npu_cann")
    for row in compat.rows:
        if same_release(torch_npu, row.pins.get("torch_npu", "")):
            wanted.add(row.cann)
            sources.append(f"row {row.name}")
    if wanted:
        return wanted, ", ".join(dict.fromkeys(sources))
    base = re.match(r"\d+\.\d+\.\d+", public_version(torch_npu))
    if base and base.group(0) in compat.torch_npu_cann:
        release = base.group(0)
        return {compat.torch_npu_cann[release]}, f"compat.toml torch_npu_cann for its base release {release}"
    return set(), ""


def same_ascend_version(a: str, b: str) -> bool:
    try:
        return parse_ascend_version(a) == parse_ascend_version(b)
    except ParseError:
        return a.strip().lower() == b.strip().lower()


class TorchNpuCann(Check):
    """The CANN torch_npu was built for is the CANN installed."""

    id = "torch-npu-cann"
    area = "stack"
    severity = Severity.HIGH
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        node = ctx.node
        stack = node.python_stack
        torch_npu = stack.version("torch_npu")
        if stack.error or torch_npu is None:
            why = stack.error or f"torch_npu is not installed in {stack.executable}"
            return Result.skip(f"no torch_npu to compare ({why})", f"install the serving stack: {PROVISION_PYTHON}",
                               torch_npu=torch_npu, error=stack.error)
        toolkit = node.cann.toolkit
        if not toolkit.installed or toolkit.version is None:
            return Result.skip(f"CANN is not installed (no {toolkit.path})", f"install CANN: {PROVISION_CANN}",
                               torch_npu=torch_npu, cann_path=toolkit.path)
        wanted, source = cann_for_torch_npu(torch_npu, load_compat())
        evidence = {"torch_npu": torch_npu, "cann": toolkit.version, "cann_path": toolkit.path,
                    "wanted": sorted(wanted), "source": source}
        if not wanted:
            return Result.warn(f"torch_npu {torch_npu} is not in npuops' compat table: cannot tell its CANN",
                               "check the Ascend/pytorch README for the CANN it needs, or install a known row "
                               f"({PROVISION_PYTHON})", **evidence)
        if any(same_ascend_version(toolkit.version, w) for w in wanted):
            return Result.passed(f"torch_npu {torch_npu} is built for CANN {toolkit.version} ({source})", **evidence)
        want = " or ".join(sorted(wanted))
        return Result.fail(f"torch_npu {torch_npu} is built for CANN {want}, but CANN {toolkit.version} is installed",
                           f"install CANN {want} with its kernels and NNAL ({PROVISION_CANN}), or the torch_npu of "
                           f"CANN {toolkit.version}'s row ({PROVISION_PYTHON}); a mismatch shows up as "
                           "`undefined symbol` at import", **evidence)


# --- torch-npu-import ------------------------------------------------------------------------------------------

# Runs in the stack's interpreter. `import torch` first: with torch_npu installed, torch autoloads it and fails
# the same way the engine would. The cwd entry is dropped so a torch_npu source checkout in npuops' working
# directory cannot shadow the installed one (Ascend/pytorch#24).
IMPORT_SCRIPT = """
import json, sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import torch
import torch_npu
out = {"torch": torch.__version__, "torch_npu": getattr(torch_npu, "__version__", None)}
try:
    out["device_count"] = int(torch.npu.device_count())
except Exception as exc:
    out["device_error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    out["soc_version"] = int(torch_npu.npu.get_soc_version())
except Exception as exc:
    out["soc_error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    from vllm_ascend import _build_info
    out["vllm_ascend_device_type"] = str(getattr(_build_info, "__device_type__", "") or "") or None
except Exception:
    out["vllm_ascend_device_type"] = None
print(json.dumps(out))
"""

# systemd starts a unit with this PATH when the unit's environment does not set one.
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# vllm-ascend's soc-version ranges (vllm_ascend/utils.py, now vllm_ascend/device/hardware.py).
def family_of_soc(soc_version: int) -> str | None:
    if 220 <= soc_version <= 225:
        return "A2"
    if 250 <= soc_version <= 255:
        return "A3"
    if 200 <= soc_version <= 205:
        return "310P"
    if soc_version == 260:
        return "A5"
    return None


def _wheel_family(device_type: str) -> str:
    """vllm_ascend._build_info.__device_type__ ("A2", "A3", "_310P", "AscendDeviceType.A3") as a family name."""
    return device_type.rsplit(".", 1)[-1].lstrip("_").upper()


def service_process_env(env: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """The environment to import torch_npu with: the service's, with autoload left on so the real failure
    surfaces, and systemd's default PATH when the env file has none. Returns (env, autoload_was_disabled)."""
    result = dict(env)
    disabled = result.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None) is not None
    result.setdefault("PATH", SYSTEMD_DEFAULT_PATH)
    return result, disabled


class TorchNpuImport(Check):
    """torch_npu imports in the stack's interpreter with the service's environment (a failure is classified)."""

    id = "torch-npu-import"
    area = "stack"
    severity = Severity.CRITICAL
    level = 2

    def run(self, ctx: CheckContext) -> Result:
        node = ctx.node
        stack = node.python_stack
        if stack.error or stack.version("torch_npu") is None:
            why = stack.error or f"torch_npu is not installed in {stack.executable}"
            return Result.skip(f"nothing to import ({why})", f"install the serving stack: {PROVISION_PYTHON}",
                               torch_npu=stack.version("torch_npu"), error=stack.error)
        python = stack_interpreter(ctx.probe)
        env, autoload_disabled = service_process_env(ctx.service_env())
        timeout = float(ctx.threshold("torch_npu_import_timeout_s"))
        result = ctx.probe.runner.run((python, "-c", IMPORT_SCRIPT), timeout=timeout, env=env)
        evidence: dict[str, Any] = {"python": python, "env_source": ctx.env_source, "returncode": result.returncode,
                                    "duration_s": round(result.duration_s, 2), "timeout_s": timeout}
        if autoload_disabled:
            evidence["note"] = "TORCH_DEVICE_BACKEND_AUTOLOAD removed for the probe so the real failure shows"
        if result.returncode == RC_TIMEOUT and result.error:
            return Result.fail(f"import torch_npu did not finish in {timeout:g} s",
                               "check that the driver answers (`npu-smi info`) and no process holds the chips in a "
                               "bad state; then time `python -c 'import torch_npu'` by hand", **evidence)
        if result.returncode in (RC_NOT_FOUND, RC_NOT_EXECUTABLE) and result.error:
            return Result.fail(f"cannot run the stack interpreter: {result.error}",
                               f"set NPUOPS_STACK_PYTHON to the serving venv's python, or recreate it with "
                               f"{PROVISION_PYTHON}", **evidence)
        if result.returncode != 0:
            failure = classify_import_failure(result.output, ctx.env_source)
            return Result.fail(f"import torch_npu fails: {failure.cause}", failure.remediation,
                               kind=failure.kind, line=failure.line, **evidence)
        info = self._parse(result.stdout)
        evidence.update(info)
        mismatch = self._device_type_mismatch(info, ctx)
        if mismatch is not None:
            wheel, chips = mismatch
            return Result.fail(f"vllm-ascend was built for {wheel} but the chips are {chips} (the engine would stop "
                               f"with \"{DEVICE_TYPE_MESSAGE}\")", DEVICE_TYPE_FIX, kind="device-type",
                               built_for=wheel, chip_family=chips, **evidence)
        count = info.get("device_count")
        seen = f", {count} device(s) visible" if isinstance(count, int) else ""
        return Result.passed(f"torch_npu {info.get('torch_npu') or stack.version('torch_npu')} imports{seen}",
                             **evidence)

    @staticmethod
    def _parse(stdout: str) -> dict[str, Any]:
        for line in reversed(stdout.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    data = json.loads(line)
                except json.JSONDecodeError:
                    break
                if isinstance(data, dict):
                    return data
        return {}

    @staticmethod
    def _device_type_mismatch(info: Mapping[str, Any], ctx: CheckContext) -> tuple[str, str] | None:
        """(wheel family, chip family) when the vllm-ascend wheel's device type is not the chips' family."""
        built = info.get("vllm_ascend_device_type")
        if not isinstance(built, str) or not built:
            return None
        soc = info.get("soc_version")
        family = family_of_soc(soc) if isinstance(soc, int) else None
        if family is None:
            families = {c.family for c in ctx.node.chips if c.family}
            family = families.pop() if len(families) == 1 else None
        if family is None:
            return None
        wheel = _wheel_family(built)
        return (wheel, family) if wheel != family.upper() else None
