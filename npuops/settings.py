"""The one typed settings object, merged: defaults < config files < NPUOPS_* environment < flags.

The CLI captures the process environment once and passes it in; nothing in the core reads
os.environ itself, so tests build a Settings with exactly the world they want.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from npuops.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SYSTEM_CONFIG = Path("/etc/npuops/config.toml")
# The serving venv provisioning creates (vllm, npuops, ray): the default of `venv` and of what units run.
DEFAULT_VENV = Path("/opt/npuops/venv")
ENV_PREFIX = "NPUOPS_"
# The longest wait a setting may ask for (a day): a bigger one is a typo, not a timeout.
MAX_SECONDS = 86400.0


@dataclass(frozen=True)
class Settings:
    """Everything the core needs to know about where things are and how long to wait."""

    # Filesystem root for every host path npuops reads (/dev, /proc, /sys, /etc, the Ascend tree).
    # "/" on a real node; tests point it at a prepared tree.
    root: Path = Path("/")
    # Where the Ascend driver and CANN are installed (vendor installers' --install-path).
    ascend_root: Path = Path("/usr/local/Ascend")
    # Vendor tools: a name looked up on tool_path, or an absolute path.
    npu_smi: str = "npu-smi"
    hccn_tool: str = "hccn_tool"
    # Directories searched for vendor tools after PATH: where the driver installs them.
    tool_dirs: tuple[str, ...] = ("/usr/local/sbin", "/usr/local/bin", "/usr/local/Ascend/driver/tools")
    # Python interpreter of the serving stack (torch, torch_npu, vllm); empty means npuops' own.
    stack_python: str = ""
    # The serving venv that provisioning creates; its python is used when stack_python is empty and it exists.
    venv: Path = DEFAULT_VENV
    # Per-instance files written by launch.
    state_dir: Path = Path("/etc/npuops")
    # The service manager: systemd's systemctl on production nodes; a command with arguments is allowed
    # (docker-systemctl-replacement: "systemctl3.py --root=DIR").
    systemctl: str = "systemctl"
    # Where launch installs unit files.
    unit_dir: Path = Path("/etc/systemd/system")
    # Where each service keeps its state (its StateDirectory=, npuops-NAME under it); /var/lib under systemd.
    service_data_root: Path = Path("/var/lib")
    command_timeout_s: float = 15.0
    # The environment npuops was started in, captured once by the CLI.
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def host_path(self, path: str | Path) -> Path:
        """Map an absolute host path under `root`."""
        p = Path(path)
        return self.root / p.relative_to("/") if p.is_absolute() else self.root / p

    def ascend_path(self, *parts: str) -> Path:
        return self.host_path(self.ascend_root).joinpath(*parts)

    def search_path(self) -> str:
        entries = [e for e in self.environ.get("PATH", "").split(":") if e]
        entries += [d for d in self.tool_dirs if d not in entries]
        return ":".join(entries)


# NPUOPS_* variables of npuops' own tooling (scripts/, the test suite, the demo): not settings, never warned about.
TOOL_VARIABLE_PREFIXES = ("NPUOPS_TEST_", "NPUOPS_REQUIRE_", "NPUOPS_ENGINE_", "NPUOPS_DEMO_")
TOOL_VARIABLES = frozenset({"NPUOPS_CONFIG", "NPUOPS_REFRESH_GOLDEN", "NPUOPS_CPU_RAY_PLATFORM",
                            "NPUOPS_BENCH_TORCH_THREADS"})
# How alike a variable's name and a setting's must be (difflib's ratio of the names after NPUOPS_) for the variable
# to be taken for a misspelling of it: NPUOPS_STATE of NPUOPS_STATE_DIR (0.71), NPUOPS_UNIT of NPUOPS_UNIT_DIR.
NEAR_MISS_RATIO = 0.6


@dataclass(frozen=True)
class UnknownVariable:
    """An NPUOPS_* variable that is neither a setting nor one of npuops' tools': ignored, and said so."""

    name: str
    closest: str  # the setting's variable it resembles most
    near_miss: bool  # so alike that it is most likely a misspelling of `closest`

    def warning(self) -> str:
        ignored = f"environment variable {self.name} is not an npuops setting and is ignored"
        if self.near_miss:
            return f"{ignored}; did you mean {self.closest}?"
        return f"{ignored} (the closest setting is {self.closest})"


def unknown_variables(environ: Mapping[str, str]) -> list[UnknownVariable]:
    """Every NPUOPS_* variable that is neither a setting nor one of npuops' tools', with the closest setting: a
    misspelt one (NPUOPS_STATE for NPUOPS_STATE_DIR) would otherwise leave its setting at the default without a
    word. The caller says it (a warning) or refuses it (the CLI, for a near miss before a command that changes the
    node). Pure."""
    settings_vars = [ENV_PREFIX + name.upper() for name in _CONFIGURABLE]
    unknown = []
    for key in sorted(environ):
        if (not key.startswith(ENV_PREFIX) or key in settings_vars or key in TOOL_VARIABLES
                or key.startswith(TOOL_VARIABLE_PREFIXES)):
            continue
        closest = max(settings_vars, key=lambda var: _likeness(key, var))
        unknown.append(UnknownVariable(key, closest, _likeness(key, closest) >= NEAR_MISS_RATIO))
    return unknown


def _likeness(variable: str, setting_variable: str) -> float:
    """How alike two variables' names are after NPUOPS_: difflib's ratio, or 1 when one holds the other whole
    (NPUOPS_TIMEOUT and NPUOPS_COMMAND_TIMEOUT_S)."""
    a, b = variable[len(ENV_PREFIX):].lower(), setting_variable[len(ENV_PREFIX):].lower()
    if len(a) >= 4 and len(b) >= 4 and (a in b or b in a):
        return 1.0
    return difflib.SequenceMatcher(None, a, b).ratio()


# Which settings a user may set, and how to read a string (from the environment) into each.
_CONFIGURABLE = {f.name: f for f in fields(Settings) if f.name != "environ"}
# The settings that name a command npuops runs: systemctl's is a command line (a command with arguments); the others
# a name looked up on the search path or a path. Empty, each would be no command at all (an IndexError of an empty
# argument list); stack_python empty means npuops' own interpreter.
COMMAND_LINES = frozenset({"systemctl"})
COMMANDS = frozenset({"systemctl", "npu_smi", "hccn_tool", "stack_python"})
MAY_BE_EMPTY = frozenset({"stack_python"})
# npuops runs as root and its paths go into units and removals: a relative one would depend on the directory it is
# run from.
ABSOLUTE_FIX = "set {name} to an absolute path (npuops runs as root: a path must not depend on where it is run)"


def _absolute(name: str, value: str, origin: str) -> str:
    if not value.startswith("/"):
        raise ConfigError(f"{origin}: {name} = {value!r} is a relative path", ABSOLUTE_FIX.format(name=name))
    return value


def _command(name: str, value: str, origin: str) -> str:
    """A command setting's value, checked: not empty (unless it may be), a command line that splits, and a path in
    it (a word with a slash) absolute."""
    fix = (f"set {name} to a command: a name on the search path or an absolute path"
           + (", or unset it for npuops' own" if name in MAY_BE_EMPTY else f", or unset it for {_default(name)!r}"))
    if name in COMMAND_LINES:
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ConfigError(f"{origin}: {name} = {value!r} is not a command line ({exc})", fix) from None
    else:
        words = [value] if value.strip() else []
    if not words:
        if name in MAY_BE_EMPTY and not value:
            return value
        raise ConfigError(f"{origin}: {name} is empty", fix)
    if "/" in words[0]:
        _absolute(name, words[0], origin)
    return value


def _default(name: str) -> Any:
    return _CONFIGURABLE[name].default


def _coerce(name: str, value: Any, origin: str) -> Any:
    default = _default(name)
    try:
        if isinstance(default, Path):
            if not isinstance(value, str) or not value:
                raise TypeError
            return Path(_absolute(name, value, origin))
        if isinstance(default, float):
            if isinstance(value, bool):
                raise TypeError
            number = float(value)
            # nan and inf parse as floats, and nan compares False with everything: a range check must say so.
            if not math.isfinite(number) or not 0 < number <= MAX_SECONDS:
                raise ConfigError(f"{origin}: {name} = {value!r} is outside its range",
                                  f"set {name} to a number of seconds above 0 and at most {MAX_SECONDS:.0f}")
            return number
        if isinstance(default, tuple):  # tool_dirs: directories searched for vendor tools, as root
            if isinstance(value, str):
                return tuple(_absolute(name, v, origin) for v in value.split(":") if v)
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return tuple(_absolute(name, v, origin) for v in value)
            raise TypeError
        if isinstance(value, str):
            return _command(name, value, origin) if name in COMMANDS else value
        raise TypeError
    except (TypeError, ValueError):
        kind = type(default).__name__ if not isinstance(default, Path) else "path"
        raise ConfigError(
            f"{origin}: {name} = {value!r} is not a valid {kind}",
            f"set {name} to a {kind} (see `npuops --help` and README 'Configuration')",
        ) from None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}",
                          "fix its permissions or remove it") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML ({exc})", "correct the TOML syntax") from None
    except RecursionError:  # tomllib recurses into each nested array or table
        raise ConfigError(f"config file {path} nests its values deeper than TOML's parser goes",
                          "write the settings as key = value lines") from None
    values = data.get("npuops", data)
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path}: [npuops] must be a table", "write the settings as key = value lines")
    unknown = sorted(k for k in values if k not in _CONFIGURABLE)
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting {unknown[0]!r}",
            f"use one of: {', '.join(sorted(_CONFIGURABLE))}",
        )
    return {k: _coerce(k, v, str(path)) for k, v in values.items()}


def config_files(home: Path | None, explicit: Path | None) -> list[Path]:
    """The files consulted, in increasing precedence."""
    files = [SYSTEM_CONFIG]
    if home is not None:
        files.append(home / ".config" / "npuops" / "config.toml")
    if explicit is not None:
        files.append(explicit)
    return files


def load_settings(
    environ: Mapping[str, str],
    *,
    config_file: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    home: Path | None = None,
    system_config: Path | None = None,
) -> Settings:
    """Merge defaults < config files < NPUOPS_* environment < flags into one Settings."""
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"config file {config_file} does not exist", "pass an existing file to --config")
    merged: dict[str, Any] = {}
    files = config_files(home, config_file)
    if system_config is not None:
        files[0] = system_config
    for path in files:
        merged.update(_read_config_file(path))
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name == "config":  # NPUOPS_CONFIG names a file, handled by the CLI
            continue
        if name not in _CONFIGURABLE:
            # Environments carry stray variables: unknown_variables names them for the CLI to warn about.
            continue
        merged[name] = _coerce(name, raw, f"environment {key}")
    for name, value in (flags or {}).items():
        if value is not None:
            # A flag's path (click gives a Path) is checked as the same setting from a file or the environment.
            merged[name] = (_coerce(name, str(value) if isinstance(value, Path) else value, f"flag for {name}")
                            if isinstance(value, (str, Path)) else value)
    return dataclasses.replace(Settings(environ=MappingProxyType(dict(environ))), **merged)
