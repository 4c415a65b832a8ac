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


# C0 control characters and DEL: a newline ends a unit-file or env-file line (and would start a new setting or
# section), the others have no business in a name, a path or a description. Lone surrogates are the bytes of a
# file name that are not UTF-8 (os.fsdecode): no UTF-8 file can hold them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
# A user or group name as useradd's default NAME_REGEX and systemd's valid_user_group_name() both accept it.
_USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _refuse_control(value: str, what: str, fix: str, *, show: bool = True) -> None:
    found = _CONTROL.search(value)
    if found:
        shown = f" {value!r}" if show else ""  # a value that may be a secret is not repeated
        kind = "bytes that are not UTF-8" if "\ud800" <= found.group() <= "\udfff" else "a control character"
        raise BadInputError(f"{what}{shown} holds {kind} ({found.group()!r} at position {found.start()}): it cannot "
                            "be written into a configuration file safely", fix)


def systemd_quote(arg: str, what: str = "the command-line argument") -> str:
    """Quote one ExecStart= argument for systemd (systemd.service(5) "Command lines").

    Double quotes with C-style escapes; `%` doubled (specifiers) and `$` doubled (variable expansion),
    so a path or value is passed literally. A control character is refused (BadInputError).
    """
    text = str(arg)
    _refuse_control(text, what, "use a value without newlines or other control characters")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_@+=:,./-]+", text):
        return escaped
    return f'"{escaped}"'


def systemd_path(path: str | Path) -> str:
    text = str(path)
    if not text.startswith("/") or _CONTROL.search(text) or any(c in text for c in " \t\"'\\%$"):
        raise BadInputError(f"path {text!r} cannot be used in a systemd unit",
                            "use an absolute path without spaces, quotes, backslashes, control characters, % or $")
    return text


def unit_text(value: str, what: str) -> str:
    """Free text in a unit file (Description=, a comment): one line, `%` doubled (Description= expands
    specifiers). A control character is refused, naming `what` (the flag or input it came from)."""
    text = str(value)
    _refuse_control(text, what, "rename it: one line of UTF-8 text without control characters")
    return text.replace("%", "%%")


def unit_user(value: str, what: str = "--service-user") -> str:
    """A User=/Group= value: a plain user name (lower-case letters, digits, `_`, `-`; at most 32), never empty
    (an empty User= makes systemd run the service as root)."""
    text = str(value)
    if not _USER_NAME.fullmatch(text):
        raise BadInputError(f"{what} {text!r} is not a user name",
                            "give an existing unprivileged user: lower-case letters, digits, _ and -, at most 32 "
                            "characters (the default is npuops)")
    return text


def env_name(name: str, what: str = "--env") -> str:
    if not _ENV_NAME.fullmatch(str(name)):
        raise BadInputError(f"{what} variable name {name!r} is not usable in an environment file",
                            "use letters, digits and _, not starting with a digit")
    return str(name)


def env_quote(value: str, what: str = "an environment value") -> str:
    """A value for an EnvironmentFile= line: double-quoted, `\\` and `"` backslash-escaped, which is all that
    systemd's parser unescapes inside double quotes (`$` and backquotes stay literal there). A control character
    (a newline would start a new variable) is refused."""
    text = str(value)
    _refuse_control(text, what, "use a value without newlines or other control characters", show=False)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def yaml_scalar(value: Any) -> str:
    """A YAML scalar for vllm.yaml, written by the YAML library itself: a string double-quoted with YAML's escapes
    (line breaks such as U+0085 and U+2028, control characters and the lone surrogates of non-UTF-8 file names
    escaped, everything else as it is), on one line. Numbers, booleans and null as JSON writes them (JSON's are
    YAML's). vLLM takes JSON strings for dict options (--compilation-config '{"...": ...}')."""
    import yaml

    if isinstance(value, (dict, list)):
        value = json.dumps(value, separators=(",", ":"))
    if not isinstance(value, str):
        return json.dumps(value)
    # json.dumps would write a character beyond U+FFFF as a surrogate pair, which PyYAML reads back as two
    # characters: the emitter writes it whole.
    dumped = yaml.safe_dump(value, default_style='"', allow_unicode=True, width=2**30)
    return dumped.rstrip("\n")


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
                       yaml_scalar=yaml_scalar, unit_text=unit_text, unit_user=unit_user, env_name=env_name)
    return env


def render_template(name: str, variables: Mapping[str, Any]) -> str:
    import jinja2

    try:
        return template_environment().get_template(name).render(**variables, npuops_version=__version__)
    except jinja2.UndefinedError as exc:
        # A template asking for something the renderer did not provide is a bug in npuops.
        raise RuntimeError(f"template {name}: {exc}") from exc
