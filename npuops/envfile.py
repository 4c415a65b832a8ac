"""systemd EnvironmentFile= files, parsed for the doctor (the launch templates render them)."""

from __future__ import annotations

import re
from pathlib import Path

from npuops.errors import BadInputError
from npuops.inputfiles import MIB, read_input_text
from npuops.parsing import ParseError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BLANK = " \t"


def parse_env_file(text: str, what: str = "environment file") -> dict[str, str]:
    """KEY=VALUE lines as systemd reads them: comments, blank lines, optional quotes, `export ` tolerated."""
    values: dict[str, str] = {}
    # Only "\n" and "\r" end a line for systemd, and only spaces and tabs are trimmed (str.splitlines() and
    # str.strip() would also break on U+0085, U+2028 and the like, inside a value).
    for number, raw in enumerate(re.split(r"\r\n|[\n\r]", text), start=1):
        line = raw.strip(_BLANK)
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip(_BLANK)
        name, sep, value = line.partition("=")
        name = name.strip(_BLANK)
        if not sep or not _NAME.match(name):
            raise ParseError(what, "expected NAME=value", number, raw)
        value = value.strip(_BLANK)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            if raw.strip(_BLANK).partition("=")[2].strip(_BLANK)[0] == '"':
                value = re.sub(r'\\(["\\$`])', r"\1", value)
        values[name] = value
    return values


def read_env_file(path: Path, fix: str) -> dict[str, str]:
    """An env file read as input (a regular UTF-8 file of at most 1 MiB) and parsed; any problem is one
    BadInputError naming the path (`fix` says what to do)."""
    text = read_input_text(path, "environment file", max_bytes=MIB, fix=fix)
    try:
        return parse_env_file(text, str(path))
    except ParseError as exc:
        raise BadInputError(str(exc), fix) from None
