"""The Jinja2 templates of templates/ and the quoting each rendered file needs.

One environment (StrictUndefined: a missing variable is an error, never an empty string) and a few
filters that quote for the consumer of each file: systemd's command-line syntax, systemd
EnvironmentFile= values, YAML scalars. Nothing is ever handed to a shell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npuops import __version__
from npuops.errors import BadInputError
from npuops.resources import shipped_dir

if TYPE_CHECKING:
    import jinja2


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
