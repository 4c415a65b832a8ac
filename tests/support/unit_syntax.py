"""systemd's own reading of the files npuops renders, ported for the property tests (tests/launch/
test_hostile_values.py) and checked against the real systemd on a corpus (tests/systemd/test_quoting.py).

- unit files, systemd.syntax(7): comments (`#`, `;`), `[Section]` headers, `Key=Value` with the whitespace around
  both trimmed, a line ending in a backslash continued on the next (comment lines between are skipped);
- command lines, systemd.service(5) "Command lines" (src/core/load-fragment.c config_parse_exec): specifiers
  expanded first (`%%` is `%`), then words split as extract_first_word(EXTRACT_UNQUOTE | EXTRACT_CUNESCAPE) does,
  then each word's `$$` becomes `$` when the command runs (replace_env_argv);
- EnvironmentFile= files, systemd's parse_env_file() (src/basic/env-file.c): `KEY=VALUE`, values unquoted (a
  backslash keeps the next character), in single quotes (literal) or in double quotes (a backslash before one of
  "\\`$ keeps that character, before a newline continues the line, before anything else stays).
"""

from __future__ import annotations

import re

_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
            "'": "'", "s": " "}


def parse_unit(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every setting, in file order."""
    settings: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in text.split("\n"):
        line = raw.strip()
        if pending and line.startswith(("#", ";")):
            continue  # a comment between continued lines is dropped
        if not pending and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"not a setting: {line!r}")
        settings.append((section, key.strip(), value.strip()))
    if pending:
        settings.append((section, *_setting(pending)))
    return settings


def _setting(line: str) -> tuple[str, str]:
    key, _, value = line.partition("=")
    return key.strip(), value.strip()


def expand_specifiers(value: str) -> str:
    """`%%` -> `%`; any other specifier is left as `%x` (npuops' renderers never write one from a value)."""
    return re.sub(r"%(.)", lambda m: "%" if m.group(1) == "%" else m.group(0), value)


def _cunescape(text: str, i: int) -> tuple[str, int]:
    """The character a backslash escape at text[i] (just after the backslash) stands for, and the next index."""
    c = text[i]
    if c in _ESCAPES:
        return _ESCAPES[c], i + 1
    if c == "x":
        return chr(int(text[i + 1:i + 3], 16)), i + 3
    if c in "01234567":
        return chr(int(text[i:i + 3], 8)), i + 3
    if c == "u":
        return chr(int(text[i + 1:i + 5], 16)), i + 5
    if c == "U":
        return chr(int(text[i + 1:i + 9], 16)), i + 9
    raise ValueError(f"invalid escape \\{c}")


def split_command_line(value: str) -> list[str]:
    """The argv an ExecStart= value runs (specifiers, then quotes and C escapes, then `$$`)."""
    text = expand_specifiers(value)
    words: list[str] = []
    i = 0
    while True:
        while i < len(text) and text[i] in " \t\n":
            i += 1
        if i >= len(text):
            break
        word: list[str] = []
        quote = ""
        while i < len(text):
            c = text[i]
            if quote:
                if c == quote:
                    quote = ""
                    i += 1
                elif c == "\\":
                    ch, i = _cunescape(text, i + 1)
                    word.append(ch)
                else:
                    word.append(c)
                    i += 1
            elif c in "\"'":
                quote = c
                i += 1
            elif c == "\\":
                ch, i = _cunescape(text, i + 1)
                word.append(ch)
            elif c in " \t\n":
                break
            else:
                word.append(c)
                i += 1
        if quote:
            raise ValueError("unbalanced quotes")
        words.append("".join(word))
    return [w.replace("$$", "$") for w in words]


def parse_env_file(text: str) -> dict[str, str]:
    """The variables systemd reads from an EnvironmentFile= file (parse_env_file_internal's states)."""
    values: dict[str, str] = {}
    i = 0
    n = len(text)
    while i < n:
        # Skip blank space and comment lines.
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i < n and text[i] in "#;":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if i >= n:
            break
        start = i
        while i < n and text[i] not in "=\n\r":
            i += 1
        key = text[start:i].strip()
        if i >= n or text[i] in "\n\r":
            continue  # no "=": systemd ignores the line
        i += 1
        while i < n and text[i] in " \t":
            i += 1
        value: list[str] = []
        if i < n and text[i] == "'":
            i += 1
            while i < n and text[i] != "'":
                value.append(text[i])
                i += 1
            i += 1
        elif i < n and text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n:
                    nxt = text[i + 1]
                    if nxt in '"\\`$':
                        value.append(nxt)
                    elif nxt != "\n":
                        value.extend(("\\", nxt))
                    i += 2
                    continue
                value.append(text[i])
                i += 1
            i += 1
        else:
            while i < n and text[i] not in "\n\r":
                if text[i] == "\\" and i + 1 < n:
                    if text[i + 1] not in "\n\r":
                        value.append(text[i + 1])
                    i += 2
                    continue
                value.append(text[i])
                i += 1
            # Trailing whitespace of an unquoted value is dropped.
            while value and value[-1] in " \t":
                value.pop()
        # Whatever follows a closing quote up to the end of the line is ignored here (npuops writes nothing there).
        while i < n and text[i] not in "\n\r":
            i += 1
        if key:
            values[key] = "".join(value)
    return values
