"""systemd EnvironmentFile= files: parse (for the doctor) and render (for launch), one format both ways."""

from __future__ import annotations

import re
from collections.abc import Mapping

from npuops.parsing import ParseError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env_file(text: str, what: str = "environment file") -> dict[str, str]:
    """KEY=VALUE lines as systemd reads them: comments, blank lines, optional quotes, `export ` tolerated."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name):
            raise ParseError(what, "expected NAME=value", number, raw)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            if raw.strip().partition("=")[2].strip()[0] == '"':
                value = re.sub(r'\\(["\\$`])', r"\1", value)
        values[name] = value
    return values


def render_env_file(values: Mapping[str, str], header: str = "") -> str:
    """Render for systemd: every value double-quoted with backslash escapes, so spaces and quotes survive."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()] if header else []
    for name, value in values.items():
        if not _NAME.match(name):
            raise ValueError(f"not an environment variable name: {name!r}")
        if "\n" in value or "\x00" in value:
            raise ValueError(f"environment value of {name} contains a newline or NUL")
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{name}="{escaped}"')
    return "\n".join(lines) + "\n"
