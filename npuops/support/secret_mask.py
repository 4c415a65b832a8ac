"""MARK, and how a secret value found in a text is masked (pure): shared by the shape passes
(npuops/support/secret_shapes.py, npuops/support/secret_markup.py).

A value needs no mask when it is empty, masked already, a literal that says no secret is set (null, true, false,
None, ~) or a shell variable and nothing more ($VLLM_API_KEY, ${HF_TOKEN}, ${env.DB_PASSWORD}: where the secret
is, not the secret; ${NAME:-default} is not one, the default may be the secret, nor is $lowercase, a password may
start with $). A quoted value is masked inside its quotes.
"""

from __future__ import annotations

import re

MARK = "[REDACTED]"

JSON_LITERAL = re.compile(r"(?:null|true|false|None|True|False|~)(?![^\s,;})\]])")
VARIABLE_REFERENCE = re.compile(r"\$(?:[A-Z_][A-Z0-9_]{0,127}+|\{[A-Za-z_][A-Za-z0-9_.]{0,127}+\})")


def is_variable_reference(value: str) -> bool:
    """Whether `value` is a shell variable and nothing more ($VLLM_API_KEY, ${HF_TOKEN}): on a command line the
    shell or systemd puts the secret there; the text says only where it is kept."""
    return VARIABLE_REFERENCE.fullmatch(value) is not None


def needs_no_mask(value: str) -> bool:
    """A value that needs no mask: empty, masked, a literal that says none is set, a shell variable."""
    return (not value or value.startswith(MARK) or JSON_LITERAL.fullmatch(value) is not None
            or is_variable_reference(value))


def masked_scalar(value: str) -> str:
    """A scalar (a list's item, a YAML value, a command's argument) masked: a quoted one inside its quotes."""
    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
    inner = value[1:-1] if quoted else value
    if needs_no_mask(inner):
        return value
    return value[0] + MARK + value[-1] if quoted else MARK


def masked_group(match: re.Match[str], group: str) -> str:
    """The match with `group` masked (a quoted value inside its quotes), unless it needs none."""
    value = match.group(group)
    if value is None or needs_no_mask(value):
        return match.group(0)
    start, end = match.start(group) - match.start(), match.end(group) - match.start()
    return match.group(0)[:start] + masked_scalar(value) + match.group(0)[end:]


def masked_inside_blanks(match: re.Match[str], group: str) -> str:
    """The match with `group` masked but for the blanks around it (an element's text on lines of its own)."""
    value = match.group(group)
    if value is None or needs_no_mask(value.strip()):
        return match.group(0)
    start = match.start(group) - match.start() + len(value) - len(value.lstrip())
    end = match.end(group) - match.start() - (len(value) - len(value.rstrip()))
    return match.group(0)[:start] + MARK + match.group(0)[end:]


def replace_groups(pattern: re.Pattern[str], text: str) -> str:
    """Every match with the group that matched last (the value, of the alternatives that matched) replaced by
    MARK."""
    def replace(match: re.Match[str]) -> str:
        group = match.lastindex or 0
        start, end = match.span(group)
        if needs_no_mask(match.group(group)):
            return match.group(0)
        base = match.start()
        return match.group(0)[:start - base] + MARK + match.group(0)[end - base:]

    return pattern.sub(replace, text)


def end_of(pattern: re.Pattern[str], text: str, start: int) -> int:
    """Where `pattern` (one that matches the empty string too) ends from `start`."""
    found = pattern.match(text, start)
    return found.end() if found else start
