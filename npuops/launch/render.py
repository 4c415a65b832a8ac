"""Rendering a plan into the files of one instance, with Jinja2 templates from templates/.

One environment (StrictUndefined: a missing variable is an error, never an empty string) and a few
filters that quote for the consumer of each file: systemd's command-line syntax, systemd
EnvironmentFile= values, YAML scalars. Nothing is ever handed to a shell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npuops import __version__
from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError
from npuops.resources import shipped_dir

if TYPE_CHECKING:
    import jinja2

    from npuops.instance.record import InstanceRecord

def systemd_quote(arg: str) -> str:
    """Quote one ExecStart= argument for systemd (systemd.service(5) "Command lines").

    Double quotes with C-style escapes; `%` doubled (specifiers) and `$` doubled (variable expansion),
    so a path or value is passed literally.
    """
    text = str(arg)
    if "\n" in text or "\x00" in text:
        raise ValueError("an ExecStart argument cannot contain a newline or NUL")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", text) and "%" not in text and "$" not in text:
        return escaped
    return f'"{escaped}"'


def systemd_path(path: str | Path) -> str:
    text = str(path)
    if not text.startswith("/") or any(c in text for c in "\n\x00 \t\"'\\%$"):
        raise BadInputError(f"path {text!r} cannot be used in a systemd unit",
                            "use an absolute path without spaces, quotes, backslashes, % or $")
    return text


def env_quote(value: str) -> str:
    """A value for an EnvironmentFile= line: double-quoted, backslash-escaped (systemd.exec(5))."""
    text = str(value)
    if "\n" in text or "\x00" in text:
        raise ValueError("an environment value cannot contain a newline or NUL")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def yaml_scalar(value: Any) -> str:
    """A YAML scalar: JSON is a subset of YAML, so json.dumps quotes every string safely."""
    if isinstance(value, (dict, list)):
        # vLLM takes JSON strings for dict options (--compilation-config '{"...": ...}').
        return json.dumps(json.dumps(value, separators=(",", ":")))
    return json.dumps(value)


def template_environment() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(shipped_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - these are config files, not HTML
        trim_blocks=False,
    )
    env.filters.update(systemd_quote=systemd_quote, systemd_path=systemd_path, env_quote=env_quote,
                       yaml_scalar=yaml_scalar)
    return env


def render_template(name: str, variables: Mapping[str, Any]) -> str:
    import jinja2

    try:
        return template_environment().get_template(name).render(**variables, npuops_version=__version__)
    except jinja2.UndefinedError as exc:
        # A template asking for something the renderer did not provide is a bug in npuops.
        raise RuntimeError(f"template {name}: {exc}") from exc


@dataclass(frozen=True)
class RenderedFile:
    name: str
    text: str
    mode: int


@dataclass(frozen=True)
class InstanceFiles:
    name: str
    files: tuple[RenderedFile, ...]
    unit_name: str
    record: InstanceRecord
    environment: dict[str, str] = field(default_factory=dict)  # what the env file holds (it may hold the API key)

    def file(self, name: str) -> RenderedFile:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)


def args_to_options(args: Sequence[str]) -> dict[str, Any]:
    """`--tensor-parallel-size 2 --enforce-eager` -> {"tensor-parallel-size": 2, "enforce-eager": True}."""
    options: dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--"):
            raise ValueError(f"expected an option, got {flag!r}")
        key = flag[2:]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            raw = args[i + 1]
            value: Any = raw
            if re.fullmatch(r"-?\d+", raw):
                value = int(raw)
            elif re.fullmatch(r"-?\d+\.\d*", raw):
                value = float(raw)
            elif raw.startswith("{"):
                value = json.loads(raw)
            options[key] = value
            i += 2
        else:
            options[key] = True
            i += 1
    return options


def write_instance_files(directory: Path, files: InstanceFiles) -> list[Path]:
    """Write every file atomically with its mode; returns the paths written."""
    written = []
    for f in files.files:
        target = directory / f.name
        write_text_atomic(target, f.text, mode=f.mode)
        written.append(target)
    return written
