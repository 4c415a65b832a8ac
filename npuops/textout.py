"""Small helpers for the human output: aligned tables, sizes and text wrapped to the terminal (at most 100
columns). No click, no colours required."""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def compact_cpu_list(cpus: Sequence[int]) -> str:
    """(0,1,2,3,8) -> "0-3,8", the kernel's cpulist notation."""
    if not cpus:
        return "-"
    parts: list[str] = []
    start = prev = cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        if c is not None:
            start = prev = c
    return ",".join(parts)


MAX_WIDTH = 100  # terminal text fits 100 columns, also in a wider terminal (logs, tickets, e-mail)
MIN_WIDTH = 60


def terminal_width() -> int:
    """COLUMNS when set (as shells and `COLUMNS=80 npuops ...` do), else the terminal's width, within
    [MIN_WIDTH, MAX_WIDTH]; 100 when output goes to a pipe or file."""
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() else shutil.get_terminal_size((MAX_WIDTH, 24)).columns
    return max(MIN_WIDTH, min(MAX_WIDTH, width))


def wrapped(text: str, prefix: str = "", indent: str | None = None, width: int | None = None) -> str:
    """`text` after `prefix`, wrapped at the terminal's width on spaces only: a path, flag or value is never
    cut (one longer than the line stays whole on its own line). Continuation lines take `indent` (default:
    spaces as wide as `prefix`)."""
    return textwrap.fill(text, width=width or terminal_width(), initial_indent=prefix,
                         subsequent_indent=" " * len(prefix) if indent is None else indent,
                         break_long_words=False, break_on_hyphens=False)
