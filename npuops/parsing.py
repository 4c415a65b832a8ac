"""The base of every pure parser: the one error type (ParseError) and the text handling the parsers share.

Vendor tools and files are read the same way everywhere: refuse what is not text (empty, binary, an error message
instead of the output), number the lines so an error can point at one, skip the elisions whoever published a
capture left ("..."), split "key: value" lines, read integers that may be "NA". One copy of each, here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

Pairs = tuple[tuple[str, str], ...]

# C0 control characters other than tab/LF/CR, DEL, and U+FFFD (what a binary blob decodes to with errors="replace").
_BINARY_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
# An elision left by whoever published a capture ("...", "…", "......").
_ELISION_RE = re.compile(r"(?:\.{3,}|\u2026+)")
# What the shell, cat or a vendor tool prints instead of the output asked for ("ret is -8005" from npu-smi/dcmi).
_ERROR_PHRASES = (
    r"command not found",
    r"no such file or directory",
    r"permission denied",
    r"\bret(?:urn)?\s*(?:is|code|=|:)\s*-\d+",
)
_INT_RE = re.compile(r"[+-]?[0-9]{1,18}")


class ParseError(ValueError):
    """Text from a vendor tool or file that does not have the expected shape.

    Carries the 1-based line number and the offending line, so the message can point at it.
    """

    def __init__(self, what: str, message: str, line_no: int | None = None, line: str | None = None) -> None:
        self.what = what
        self.reason = message
        self.line_no = line_no
        self.line = line
        where = f" at line {line_no}: {line.strip()[:120]!r}" if line_no is not None and line is not None else ""
        super().__init__(f"cannot parse {what}: {message}{where}")


def error_line_pattern(*extra: str) -> re.Pattern[str]:
    """A pattern for lines that report an error rather than carry data: the shell's and `ret is -N`, plus `extra`
    (regular expressions a tool of its own prints, e.g. npu-smi's "does not support")."""
    return re.compile("|".join((*_ERROR_PHRASES, *extra)), re.IGNORECASE)


ERROR_LINES = error_line_pattern()


def numbered_lines(
    text: object, what: str, *, errors: re.Pattern[str] = ERROR_LINES, instead_of: str | None = None
) -> list[tuple[int, str]]:
    """(1-based line number, line) pairs of `text`, after the checks every parser makes first.

    Refused with a ParseError: anything but a str, empty or blank text, a line with control characters (binary
    data), a line matching `errors` (an error message printed instead of `instead_of`, by default "<what> output").
    A leading BOM is dropped; CRLF and CR line ends count as LF.
    """
    if not isinstance(text, str):
        raise ParseError(what, f"expected text, got {type(text).__name__}")
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise ParseError(what, "empty output")
    numbered = list(enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), start=1))
    for line_no, line in numbered:
        if _BINARY_RE.search(line):
            raise ParseError(what, "binary data (control characters) instead of text", line_no, line)
    for line_no, line in numbered:
        if errors.search(line):
            expected = instead_of if instead_of is not None else f"{what} output"
            raise ParseError(what, f"the output is an error message, not {expected}", line_no, line)
    return numbered


def is_elision(line: str) -> bool:
    """Whether a (stripped) line is only an elision: "...", "…" and the like."""
    return _ELISION_RE.fullmatch(line) is not None


def content_lines(
    text: object, what: str, *, errors: re.Pattern[str] = ERROR_LINES, instead_of: str | None = None
) -> list[tuple[int, str]]:
    """The non-blank, non-elision lines of :func:`numbered_lines`, stripped, with their line numbers."""
    out: list[tuple[int, str]] = []
    for line_no, line in numbered_lines(text, what, errors=errors, instead_of=instead_of):
        stripped = line.strip()
        if stripped and not is_elision(stripped):
            out.append((line_no, stripped))
    return out


def split_pair(line: str, sep: str = ":") -> tuple[str, str] | None:
    """``"Link  status : UP"`` -> ``("Link status", "UP")``: split at the first `sep`, runs of spaces in the key
    made one, the value stripped (it may contain `sep`); None without a `sep` or with an empty key."""
    key, found, value = line.partition(sep)
    key = " ".join(key.split())
    if not found or not key:
        return None
    return key, value.strip()


def first_value(pairs: Sequence[tuple[str, str]], *keys: str) -> str | None:
    """The value of the first pair whose key is one of `keys`, ignoring case; None when there is none."""
    wanted = {key.lower() for key in keys}
    return next((value for key, value in pairs if key.lower() in wanted), None)


def parse_int(value: str | None) -> int | None:
    """An integer as printed ("42", " -3 "), or None for anything else ("NA", "", "4.5", None)."""
    if value is None or not _INT_RE.fullmatch(value.strip()):
        return None
    return int(value)
