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


def env_assignments(text: str) -> list[tuple[str, str]]:
    """Every NAME=value an EnvironmentFile= file assigns, read as systemd reads it but never refused: for finding
    the values in a file, not for using them (parse_env_file is the strict reader).

    systemd's states (src/basic/env-file.c parse_env_file_internal): comments (`#`, `;`, continued by a trailing
    backslash), a line without `=` ignored; a value unquoted (a backslash keeps the next character or continues
    the line; trailing blanks dropped), in single quotes (literal, across lines) or double quotes (a backslash
    before one of "\\`$ keeps that character, before a newline continues the line, before anything else stays),
    the pieces after one another concatenated (`A='x'"y"z` is xyz). Names systemd would drop with a warning
    (`MY-TOKEN`, `two words`) are kept, and an `export ` before a name is taken off. Pairs in file order, a name
    assigned twice listed twice."""
    pairs: list[tuple[str, str]] = []
    state, key, value, keep = "pre_key", "", "", 0  # keep: the value's length without its trailing blanks

    def push() -> None:
        name = key.strip(_BLANK)
        if name.startswith("export") and name[6:7] in (" ", "\t"):
            name = name[6:].strip(_BLANK)
        if name:
            pairs.append((name, value[:keep] if state in ("value", "pre_value") else value))

    for char in text:
        if state == "pre_key":
            if char in "#;":
                state = "comment"
            elif char not in " \t\r\n":
                state, key, value, keep = ("pre_value", "", "", 0) if char == "=" else ("key", char, "", 0)
        elif state == "key":
            if char in "\r\n":
                state = "pre_key"  # no "=": systemd ignores the line
            elif char == "=":
                state = "pre_value"
            else:
                key += char
        elif state in ("pre_value", "value"):
            if char in "\r\n":
                push()
                state = "pre_key"
            elif char == "'":
                state = "single"
            elif char == '"':
                state = "double"
            elif char == "\\":
                state = "value_escape"
            elif state == "pre_value" and char in _BLANK:
                continue
            else:
                value += char
                state = "value"
                keep = len(value) if char not in _BLANK else keep
        elif state == "value_escape":
            if char not in "\r\n":
                value += char
                keep = len(value)
            state = "value"
        elif state == "single":
            if char == "'":
                state, keep = "pre_value", len(value)
            else:
                value += char
        elif state == "double":
            if char == '"':
                state, keep = "pre_value", len(value)
            elif char == "\\":
                state = "double_escape"
            else:
                value += char
        elif state == "double_escape":
            value += char if char in '"\\`$' else "" if char == "\n" else "\\" + char
            state = "double"
        elif state == "comment":
            state = "comment_escape" if char == "\\" else "pre_key" if char in "\r\n" else "comment"
        else:  # comment_escape
            state = "comment"
    if state not in ("pre_key", "key", "comment", "comment_escape"):
        if state in ("single", "double", "double_escape", "value_escape"):
            keep = len(value)
        push()
    return pairs
