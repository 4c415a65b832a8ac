"""Pure parsers of ``npu-smi info -t <type> -i <id> [-c <chip>]`` outputs.

Most types print indented ``Key : Value`` lines in blank-line separated groups (the card, then the chip, then for
some types an ``mcu`` group). :func:`parse_npu_smi_kv` reads any of them into ordered pairs; typed views pick what
a check needs:

* ``-t health``  -> :func:`parse_npu_smi_health`  -> :class:`NpuSmiHealth`  (chip-health-detail)
* ``-t ecc``     -> :func:`parse_npu_smi_ecc`     -> :class:`NpuSmiEcc`     (chip-ecc)
* ``-t topo``    -> :func:`parse_npu_smi_topo`    -> :class:`NpuTopology`   (npu-cpu-affinity; a matrix, not pairs)

Text in, frozen dataclass out; the only exception raised is :class:`npuops.parsing.ParseError`.
Redacted values (``Chip Name : xxx``) are kept as strings; numeric fields that do not hold a number (``NA``) are
None, with the printed text still in ``raw``.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from npuops.parsing import (
    Pairs,
    ParseError,
    error_line_pattern,
    is_elision,
    numbered_lines,
    parse_int,
    split_pair,
)

__all__ = [
    "NpuSmiEcc",
    "NpuSmiHealth",
    "NpuSmiKeyValues",
    "NpuTopology",
    "parse_npu_smi_ecc",
    "parse_npu_smi_health",
    "parse_npu_smi_kv",
    "parse_npu_smi_topo",
]

# Error reports instead of data: the shell's, and npu-smi/dcmi's own ("dcmi module initialize failed. ret is -8005",
# "This device does not support querying p2p-enable.").
_ERRORS = error_line_pattern(r"\binitiali[sz]e failed\b", r"\bdoes not support\b")
_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9 ()%/._,+\-]*")
_DEVICE_NAME_RE = re.compile(r"([A-Za-z][A-Za-z_\-]*)[0-9]{1,6}")
_NONE_VALUES = frozenset({"", "na", "n/a", "-", "--", "none", "null"})


def _norm(key: str) -> str:
    """Key for matching: case, spaces, dashes and underscores ignored ("Single-bit Error Count" ~ "single bit ...")."""
    return re.sub(r"[\s\-_]+", "", key).lower()


# ----------------------------------------------------------------------------------------------------------------
# Generic "Key : Value"
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NpuSmiKeyValues:
    """The ``Key : Value`` lines of one ``npu-smi info -t <type>`` output."""

    pairs: Pairs  # every pair in printed order, duplicates and the mcu block included
    blocks: tuple[Pairs, ...]  # the blank-line separated groups (an "Chip Name : mcu" line always starts one)
    mcu: Pairs | None  # the group starting with "Chip Name : mcu" (the board MCU), if printed

    def get(self, *keys: str) -> str | None:
        """First value, outside the mcu block, of any of ``keys`` (matched ignoring case/spaces/dashes)."""
        wanted = {_norm(key) for key in keys}
        for block in self.blocks:
            if _is_mcu(*block[0]):
                continue
            for key, value in block:
                if _norm(key) in wanted:
                    return value
        return None


def _is_mcu(key: str, value: str) -> bool:
    return _norm(key) == "chipname" and value.strip().lower() == "mcu"


def parse_npu_smi_kv(text: str, what: str = "npu-smi info -t") -> NpuSmiKeyValues:
    """Parse indented ``Key : Value`` lines (split at the first colon; values may contain colons).

    Blank lines separate blocks; a ``Chip Name : mcu`` line starts the mcu block even without a blank line before
    it; author-elided ``...`` lines are skipped. Any other line without a colon is a ParseError.
    """
    blocks: list[list[tuple[str, str]]] = [[]]
    for line_no, line in numbered_lines(text, what, errors=_ERRORS):
        stripped = line.strip()
        if not stripped:
            if blocks[-1]:
                blocks.append([])
            continue
        if is_elision(stripped):
            continue
        pair = split_pair(stripped)
        if pair is None or not _KEY_RE.fullmatch(pair[0]):
            raise ParseError(what, "expected a 'Key : Value' line", line_no, line)
        key, value = pair
        if _is_mcu(key, value) and blocks[-1]:
            blocks.append([])
        blocks[-1].append((key, value))
    groups = tuple(tuple(block) for block in blocks if block)
    if not groups:
        raise ParseError(what, "no 'Key : Value' lines found")
    mcu = next((block for block in groups if _is_mcu(*block[0])), None)
    return NpuSmiKeyValues(pairs=tuple(pair for block in groups for pair in block), blocks=groups, mcu=mcu)


# ----------------------------------------------------------------------------------------------------------------
# Typed views
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NpuSmiHealth:
    """``-t health``: ``Health Status : OK`` / ``Error Code : NA`` / ``Error Information : NA``."""

    health: str  # "OK", "Warning", "Alarm", "Critical", ... as printed
    healthy: bool  # health == "OK"
    error_codes: tuple[str, ...]  # () for "NA"; codes split on spaces/commas
    error_information: str | None  # None for "NA"
    raw: NpuSmiKeyValues


def parse_npu_smi_health(text: str) -> NpuSmiHealth:
    what = "npu-smi info -t health"
    kv = parse_npu_smi_kv(text, what)
    health = kv.get("Health Status", "Health", "Healthy")
    if not health:
        raise ParseError(what, "no 'Health Status' line")
    codes_text = kv.get("Error Code", "Error Codes") or ""
    codes = tuple(code for code in re.split(r"[\s,;]+", codes_text) if code and code.lower() not in _NONE_VALUES)
    information = kv.get("Error Information")
    return NpuSmiHealth(
        health=health,
        healthy=health.upper() == "OK",
        error_codes=codes,
        error_information=None if information is None or information.strip().lower() in _NONE_VALUES else information,
        raw=kv,
    )


@dataclass(frozen=True)
class NpuSmiEcc:
    """``-t ecc -i N -c C``: ``Single-bit Error Count : 0`` / ``Double-bit Error Count : 0``.

    Field names from the vendor manual's example (Atlas 200I A2, "查询指定芯片ECC错误计数"):
    https://www.hiascend.com/document/detail/zh/Atlas%20200I%20A2/2520/re/npu/npusmi_033.html
    Single-bit errors are corrected by ECC; double-bit (multi-bit) errors are not.
    """

    single_bit_errors: int | None
    double_bit_errors: int | None
    raw: NpuSmiKeyValues

    @property
    def has_uncorrectable_errors(self) -> bool:
        return bool(self.double_bit_errors)


# The manual's example says "Single-bit Error Count"; A2 servers print one line per memory ("HBM Single Bit Error
# Count", "DDR ..." on some cards). All end in the same words once case, spaces and dashes are ignored; the
# "Aggregate Total" (lifetime) lines do not, so only the current counts are summed.
_ECC_SINGLE = "singlebiterrorcount"
_ECC_DOUBLE = "doublebiterrorcount"


def _sum_ints(values: list[str]) -> int | None:
    numbers = [n for n in (parse_int(v) for v in values) if n is not None]
    return sum(numbers) if numbers else None


def parse_npu_smi_ecc(text: str) -> NpuSmiEcc:
    what = "npu-smi info -t ecc"
    kv = parse_npu_smi_kv(text, what)
    singles = [v for k, v in kv.pairs if _norm(k).endswith(_ECC_SINGLE)]
    doubles = [v for k, v in kv.pairs if _norm(k).endswith(_ECC_DOUBLE)]
    if not singles and not doubles:
        raise ParseError(what, "no 'Single-bit Error Count' or 'Double-bit Error Count' line")
    return NpuSmiEcc(single_bit_errors=_sum_ints(singles), double_bit_errors=_sum_ints(doubles), raw=kv)


# ----------------------------------------------------------------------------------------------------------------
# -t topo
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NpuTopology:
    """``npu-smi info -t topo``: the device-to-device link matrix, extra columns, and the legend.

    ``matrix[i][j]`` is the link from ``devices[i]`` to ``devices[j]`` as printed (``X`` for self, ``HCCS``,
    ``PIX``, ``PXB``, ``PHB``, ``SYS``, ...). Rows are in header order.
    """

    devices: tuple[str, ...]  # ("NPU0", ..., "NPU7")
    matrix: tuple[tuple[str, ...], ...]
    extra_columns: tuple[str, ...]  # ("CPU Affinity",)
    extras: tuple[tuple[str, ...], ...]  # per device row, values of extra_columns ("" when missing)
    legend: Mapping[str, str] = field(hash=False)  # {"X": "Self", "HCCS": "Connection traversing HCCS.", ...}

    @property
    def cpu_affinity(self) -> tuple[str | None, ...]:
        """Per device, the "CPU Affinity" column ("144-167"), or None when not printed."""
        index = next((i for i, name in enumerate(self.extra_columns) if _norm(name) == "cpuaffinity"), None)
        if index is None:
            return tuple(None for _ in self.devices)
        return tuple(row[index] or None for row in self.extras)


_TopoRow = tuple[int, str, list[str]]  # line number, line, its tokens


def _legend_entry(legend: dict[str, str], last: str | None, stripped: str, what: str, line_no: int,
                  line: str) -> str:
    """Add one ``NAME = meaning`` line (or the continuation of the previous one); the key it belongs to."""
    key, sep, value = stripped.partition("=")
    if sep and key.strip():
        legend[key.strip()] = value.strip()
        return key.strip()
    if last is None:
        raise ParseError(what, "expected a 'NAME = meaning' legend line", line_no, line)
    legend[last] = f"{legend[last]} {stripped}".strip()
    return last


def _topo_sections(text: str, what: str) -> tuple[tuple[int, str] | None, list[_TopoRow], dict[str, str]]:
    """The header line, the matrix rows and the legend (everything after a ``Legend:`` line)."""
    header: tuple[int, str] | None = None
    rows: list[_TopoRow] = []
    legend: dict[str, str] = {}
    last_key: str | None = None
    in_legend = False
    for line_no, line in numbered_lines(text, what, errors=_ERRORS):
        stripped = line.strip()
        if not stripped or is_elision(stripped):
            continue
        if re.fullmatch(r"(?i)legend\s*:?", stripped):
            in_legend = True
        elif in_legend:
            last_key = _legend_entry(legend, last_key, stripped, what, line_no, line)
        elif header is None:
            header = (line_no, line)
        else:
            rows.append((line_no, line, stripped.split()))
    return header, rows, legend


def _topo_columns(header: tuple[int, str], labels: set[str], what: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(device columns, extra columns) of the header. A name is a device if some row is labelled with it, or if it
    is shaped like the row labels ("NPU5" when rows are "NPU0".."NPU3"), so that a missing row is reported rather
    than taken for a column."""
    prefixes = {m.group(1) for m in (_DEVICE_NAME_RE.fullmatch(label) for label in labels) if m}

    def leading_devices(names: list[str]) -> int:
        count = 0
        for name in names:
            shaped = _DEVICE_NAME_RE.fullmatch(name)
            if name not in labels and (shaped is None or shaped.group(1) not in prefixes):
                break
            count += 1
        return count

    names = re.split(r"\s{2,}|\t", header[1].strip())
    count = leading_devices(names)
    if count == 0:  # names separated by single spaces
        names = header[1].split()
        count = leading_devices(names)
    if count == 0:
        raise ParseError(what, "header names no device that has a row", *header)
    return tuple(names[:count]), tuple(names[count:])


def _topo_row(row: _TopoRow, count: int, extra_columns: tuple[str, ...],
              what: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(links, extras) of one row; a last extra column may hold spaces, so surplus tokens join it."""
    line_no, line, tokens = row
    if len(tokens) < 1 + count:
        raise ParseError(what, f"expected {count} link columns, got {len(tokens) - 1}", line_no, line)
    rest = tokens[1 + count :]
    if len(rest) > len(extra_columns):
        if not extra_columns:
            raise ParseError(what, "more columns than the header names", line_no, line)
        rest = [*rest[: len(extra_columns) - 1], " ".join(rest[len(extra_columns) - 1 :])]
    return tuple(tokens[1 : 1 + count]), tuple(rest) + ("",) * (len(extra_columns) - len(rest))


def parse_npu_smi_topo(text: str) -> NpuTopology:
    what = "npu-smi info -t topo"
    header, rows, legend = _topo_sections(text, what)
    if header is None:
        raise ParseError(what, "no header line")
    devices, extra_columns = _topo_columns(header, {tokens[0] for _, _, tokens in rows}, what)
    by_label: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for row in rows:
        line_no, line, tokens = row
        label = tokens[0]
        if label not in devices:
            raise ParseError(what, f"row for {label[:40]!r}, which is not in the header", line_no, line)
        if label in by_label:
            raise ParseError(what, f"second row for {label[:40]!r}", line_no, line)
        by_label[label] = _topo_row(row, len(devices), extra_columns, what)
    missing = [device for device in devices if device not in by_label]
    if missing:
        raise ParseError(what, f"no row for {', '.join(missing)}: the matrix is not square")
    return NpuTopology(
        devices=devices,
        matrix=tuple(by_label[device][0] for device in devices),
        extra_columns=extra_columns,
        extras=tuple(by_label[device][1] for device in devices),
        legend=types.MappingProxyType(legend),
    )
