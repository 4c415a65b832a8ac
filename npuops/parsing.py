"""The one error type every pure parser raises, so callers catch exactly one thing."""

from __future__ import annotations


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
