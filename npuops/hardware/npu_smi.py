"""Pure parser for the default table printed by `npu-smi info`.

The layout changes between products and driver versions. What stays is the shape: a two-row
header, then two rows per chip, whose `|`-separated cells each hold one or more
whitespace-separated columns; then, optionally, a process table. Which columns exist is read from
the header, never from character offsets, because published captures are often misaligned
(redacted names, dedented copies) and widths differ between versions (91 to 116 characters).
Columns the parser does not know are skipped, so a new column does not break it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from npuops.datafiles import load_data_toml
from npuops.hardware.chips import VnpuName, parse_vnpu_name
from npuops.parsing import ParseError
from npuops.wire import WireObject

__all__ = [
    "NpuSmiChip",
    "NpuSmiFailed",
    "NpuSmiFailure",
    "NpuSmiInfo",
    "NpuSmiProcess",
    "detect_npu_smi_failure",
    "parse_npu_smi_info",
]

_WHAT = "npu-smi info"


@dataclass(frozen=True)
class NpuSmiChip:
    npu_id: int
    chip_id: int
    logical_id: int | None
    name: str
    health: str
    bus_id: str
    power_w: float | None
    temperature_c: float | None
    hugepages_used: int | None
    hugepages_total: int | None
    aicore_percent: float | None
    memory_used_mb: int | None
    memory_total_mb: int | None
    hbm_used_mb: int | None
    hbm_total_mb: int | None

    @property
    def pci_address(self) -> str | None:
        """The PCI address in Bus-Id, or None where npu-smi prints "NA": an SoC board such as a 310B has none."""
        return None if self.bus_id in _PLACEHOLDERS else self.bus_id

    @property
    def vnpu(self) -> VnpuName | None:
        """A hard-sliced virtual NPU ("310Pvir04": a share of a chip) as its name says: its template and the
        template's AI cores; None for a whole chip."""
        return parse_vnpu_name(self.name)

    @classmethod
    def from_json(cls, data: object) -> NpuSmiChip:
        """The chip's columns from its entry in the node model's `chips` (npuops/hardware/node.py writes them)."""
        chip = WireObject.wrap(data, "npu-smi chip")
        return cls(
            npu_id=chip.req_integer("npu_id"),
            chip_id=chip.req_integer("chip_id"),
            logical_id=chip.opt_integer("logical_id"),
            name=chip.text("name"),
            health=chip.text("health"),
            bus_id=chip.text("bus_id"),
            power_w=chip.opt_number("power_w"),
            temperature_c=chip.opt_number("temperature_c"),
            hugepages_used=chip.opt_integer("hugepages_used"),
            hugepages_total=chip.opt_integer("hugepages_total"),
            aicore_percent=chip.opt_number("aicore_percent"),
            memory_used_mb=chip.opt_integer("memory_used_mb"),
            memory_total_mb=chip.opt_integer("memory_total_mb"),
            hbm_used_mb=chip.opt_integer("hbm_used_mb"),
            hbm_total_mb=chip.opt_integer("hbm_total_mb"),
        )


@dataclass(frozen=True)
class NpuSmiProcess:
    npu_id: int
    chip_id: int | None
    pid: int
    name: str
    memory_mb: int
    container_pid: int | None

    @classmethod
    def from_json(cls, data: object) -> NpuSmiProcess:
        process = WireObject.wrap(data, "npu-smi process")
        return cls(npu_id=process.req_integer("npu_id"), chip_id=process.opt_integer("chip_id"),
                   pid=process.req_integer("pid"), name=process.text("name"),
                   memory_mb=process.integer("memory_mb"), container_pid=process.opt_integer("container_pid"))


@dataclass(frozen=True)
class NpuSmiInfo:
    tool_version: str | None
    driver_version: str | None
    chips: tuple[NpuSmiChip, ...]
    processes: tuple[NpuSmiProcess, ...]
    elided: bool
    has_process_table: bool


@dataclass(frozen=True)
class NpuSmiFailure:
    code: str
    message: str
    meaning: str
    remediation: str


class NpuSmiFailed(ParseError):
    """npu-smi printed one of its own error messages instead of the table."""

    failure: NpuSmiFailure

    def __init__(self, failure: NpuSmiFailure, line_no: int | None = None, line: str | None = None) -> None:
        super().__init__(_WHAT, f"npu-smi failed with error {failure.code}: {failure.meaning}", line_no, line)
        self.failure = failure


# Seen as "dcmi module initialize failed. ret is -8005", for -8020 as
# "dcmi model initialized failed, because the device is used. ret is -8020", and, when DCMI starts but the board type
# cannot be read, as "npu get board type failed. ret is -9005"; so only the code part is matched.
_FAILURE_RE = re.compile(r"\bret\s+is\s+(-[0-9]{1,10})\b", re.IGNORECASE)


def detect_npu_smi_failure(text: str) -> NpuSmiFailure | None:
    """The error npu-smi reported in `text`, or None if it reported none."""
    found = _find_failure(text.split("\n"))
    return None if found is None else found[2]


def _find_failure(lines: Sequence[str]) -> tuple[int, str, NpuSmiFailure] | None:
    for index, line in enumerate(lines):
        stripped = line.strip()
        # A table cell is device data (a process name, say), never npu-smi's own error message.
        if stripped.startswith("|"):
            continue
        match = _FAILURE_RE.search(stripped)
        if match is not None:
            code = match.group(1)
            codes, unknown = _error_table()
            meaning, remediation = codes.get(code, unknown)
            return index + 1, line, NpuSmiFailure(code, stripped, meaning, remediation)
    return None


_ErrorEntry = tuple[str, str]
_ERRORS_FILE = "npu_smi_errors.toml"


@functools.cache
def _error_table() -> tuple[dict[str, _ErrorEntry], _ErrorEntry]:
    data = load_data_toml(_ERRORS_FILE)
    source = f"npuops/data/{_ERRORS_FILE}"
    codes = data.get("codes")
    if not isinstance(codes, dict):
        raise RuntimeError(f"{source}: missing [codes] table")
    return (
        {str(code): _error_entry(entry, f"{source} [codes.{code!r}]") for code, entry in codes.items()},
        _error_entry(data.get("unknown"), f"{source} [unknown]"),
    )


def _error_entry(entry: object, where: str) -> _ErrorEntry:
    # The file ships with the package, so a bad entry is a packaging bug, not bad npu-smi output.
    if not isinstance(entry, dict):
        raise RuntimeError(f"{where}: not a table")
    meaning, remediation = entry.get("meaning"), entry.get("remediation")
    if not isinstance(meaning, str) or not isinstance(remediation, str):
        raise RuntimeError(f"{where}: needs string 'meaning' and 'remediation'")
    return meaning, remediation


def parse_npu_smi_info(text: str) -> NpuSmiInfo:
    """Parse the output of `npu-smi info` (the default table).

    Raises NpuSmiFailed if npu-smi printed a recognised error, and ParseError if the text cannot be read.
    """
    lines = text.split("\n")
    found = _find_failure(lines)
    if found is not None:
        line_no, line, failure = found
        raise NpuSmiFailed(failure, line_no, line)
    return _TableParser().parse(lines, _table_start(lines))


_BORDER_RE = re.compile(r"\+[-=+]*")
# Published captures cut repetitive rows out and leave a "..." line behind.
_ELISIONS = frozenset({"...", "\u2026"})
_TOOL_VERSION_RE = re.compile(r"\bnpu-smi\s+([0-9]\S*)")
_DRIVER_VERSION_RE = re.compile(r"\bVersion:\s*(\S+)")
_NO_PROCESSES_RE = re.compile(r"No running processes found in NPU\s+(\S+)", re.IGNORECASE)
# "0    / 0", "32446/ 65536" and "1198 / 15137" are all one used/total value.
_TOKEN_RE = re.compile(r"[^\s/]+\s*/\s*[^\s/]+|\S+")
_PAIR_RE = re.compile(r"([^\s/]+)\s*/\s*([^\s/]+)")
# ASCII only: int() and float() would also take "nan", "1_0" or non-ASCII digits.
_INT_RE = re.compile(r"[0-9]+")
_NUMBER_RE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_PLACEHOLDERS = frozenset({"NA", "N/A", "-"})

_NPU = "NPU"
_NAME = "Name"
_HEALTH = "Health"
_POWER = "Power(W)"
_TEMP = "Temp(C)"
_HUGEPAGES = "Hugepages-Usage(page)"
_CHIP = "Chip"
_DEVICE = "Device"
_PHY_ID = "Phy-ID"
_BUS_ID = "Bus-Id"
_AICORE = "AICore(%)"
_MEMORY = "Memory-Usage(MB)"
_HBM = "HBM-Usage(MB)"
_PID = "Process id"
_PROCESS_NAME = "Process name"
_PROCESS_MEMORY = "Process memory(MB)"
_CONTAINER_PID = "Process id in container"

_KNOWN_LABELS = (
    _NPU,
    _NAME,
    _HEALTH,
    _POWER,
    _TEMP,
    _HUGEPAGES,
    _CHIP,
    _DEVICE,
    _PHY_ID,
    _BUS_ID,
    _AICORE,
    _MEMORY,
    _HBM,
    _PID,
    _PROCESS_NAME,
    _PROCESS_MEMORY,
    _CONTAINER_PID,
)
_KNOWN_LABEL_SET = frozenset(_KNOWN_LABELS)
_CANONICAL_LABELS = {label.lower(): label for label in _KNOWN_LABELS}
# Process-table labels contain spaces, so known labels are matched whole (longest first, so that
# "Process id in container" wins over "Process id"); any other word is one unknown column.
_LABEL_RE = re.compile(
    "(?:"
    + "|".join(r"\s+".join(map(re.escape, label.split())) for label in sorted(_KNOWN_LABELS, key=len, reverse=True))
    + r")(?=\s|$)|\S+",
    re.IGNORECASE,
)
# Columns whose value may be empty or contain spaces (process names are blank in many containers).
_FREE_TEXT_LABELS = frozenset({_NAME, _PROCESS_NAME})
_CHIP_REQUIRED = (_NPU, _NAME, _HEALTH, _CHIP, _BUS_ID)
_PROCESS_REQUIRED = (_NPU, _PID, _PROCESS_MEMORY)

_Header = tuple[tuple[str, ...], ...]


def _table_start(lines: Sequence[str]) -> int:
    """Index of the first table line.

    Text before it is skipped: containers print driver warnings such as
    "DrvMngGetConsoleLogLevel failed." ahead of the table.
    """
    first_text: int | None = None
    for index, line in enumerate(lines):
        stripped = line.strip()
        if _BORDER_RE.fullmatch(stripped) or _row_cells(stripped) is not None:
            return index
        if stripped and first_text is None:
            first_text = index
    if first_text is None:
        raise ParseError(_WHAT, "the output is empty")
    raise ParseError(_WHAT, "no npu-smi table found; the output starts", first_text + 1, lines[first_text])


def _row_cells(stripped: str) -> list[str] | None:
    # A missing closing bar means the line was cut off, so it is not taken as a row.
    if len(stripped) >= 2 and stripped[0] == "|" and stripped[-1] == "|":
        return stripped[1:-1].split("|")
    return None


def _header_cell_labels(cell: str) -> tuple[str, ...]:
    return tuple(_CANONICAL_LABELS.get(" ".join(word.split()).lower(), word) for word in _LABEL_RE.findall(cell))


@dataclass(frozen=True)
class _Line:
    no: int
    text: str


class _Fields:
    """Values of one table entry by column label, each remembering the line it came from."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[str, _Line]] = {}

    def add_row(self, header: _Header, cells: Sequence[str], line: _Line) -> None:
        if len(cells) != len(header):
            raise ParseError(
                _WHAT,
                f"expected {len(header)} '|'-separated cells as in the header, found {len(cells)}",
                line.no,
                line.text,
            )
        for labels, cell in zip(header, cells, strict=True):
            for label, value in zip(labels, _cell_values(labels, cell, line), strict=True):
                self._values[label] = (value, line)

    def has(self, label: str) -> bool:
        return label in self._values

    def text(self, label: str) -> str:
        value, line = self._values[label]
        if not value:
            raise ParseError(_WHAT, f"{label} is empty", line.no, line.text)
        return value

    def free_text(self, label: str) -> str:
        return self._values[label][0] if label in self._values else ""

    def integer(self, label: str) -> int:
        value, line = self._values[label]
        return _parse_int(label, value, line)

    def optional_integer(self, label: str) -> int | None:
        if label not in self._values:
            return None
        value, line = self._values[label]
        return None if value in _PLACEHOLDERS else _parse_int(label, value, line)

    def optional_number(self, label: str) -> float | None:
        if label not in self._values:
            return None
        value, line = self._values[label]
        if value in _PLACEHOLDERS:
            return None
        if not _NUMBER_RE.fullmatch(value):
            raise ParseError(_WHAT, f"{label} value {value!r} is not a number", line.no, line.text)
        return float(value)

    def used_total(self, label: str) -> tuple[int | None, int | None]:
        if label not in self._values:
            return None, None
        value, line = self._values[label]
        match = _PAIR_RE.fullmatch(value)
        if match is None:
            raise ParseError(_WHAT, f"{label} value {value!r} is not 'used / total'", line.no, line.text)
        used, total = match.groups()
        return (
            None if used in _PLACEHOLDERS else _parse_int(label, used, line),
            None if total in _PLACEHOLDERS else _parse_int(label, total, line),
        )


def _parse_int(label: str, value: str, line: _Line) -> int:
    if not _INT_RE.fullmatch(value):
        raise ParseError(_WHAT, f"{label} value {value!r} is not a whole number", line.no, line.text)
    return int(value)


def _cell_values(labels: tuple[str, ...], cell: str, line: _Line) -> list[str]:
    if len(labels) == 1:
        # A cell with one column is taken whole, which keeps blank and multi-word process names intact.
        return [cell.strip()]
    tokens = _TOKEN_RE.findall(cell)
    free = [index for index, label in enumerate(labels) if label in _FREE_TEXT_LABELS]
    if free and len(tokens) >= len(labels) - 1:
        start, after = free[0], len(labels) - free[0] - 1
        end = len(tokens) - after
        return [*tokens[:start], " ".join(tokens[start:end]), *tokens[end:]]
    if len(tokens) != len(labels):
        raise ParseError(
            _WHAT,
            f"cell {cell.strip()!r} has {len(tokens)} values for the {len(labels)} columns {', '.join(labels)}",
            line.no,
            line.text,
        )
    return tokens


class _TableParser:
    """Walks the table line by line; which of the optional attributes are set is the parser's state."""

    def __init__(self) -> None:
        self._tool_version: str | None = None
        self._driver_version: str | None = None
        self._seen_version = False
        self._header_first: tuple[_Header, _Line] | None = None
        self._chip_header: tuple[_Header, _Header] | None = None
        # The first row of a chip entry, with the header it belongs to, until its second row arrives.
        self._pending: tuple[tuple[_Header, _Header], list[str], _Line] | None = None
        self._process_header: _Header | None = None
        self._chips: list[NpuSmiChip] = []
        self._chip_keys: set[tuple[int, int]] = set()
        self._processes: list[NpuSmiProcess] = []
        self._elided = False

    def parse(self, lines: Sequence[str], start: int) -> NpuSmiInfo:
        for index in range(start, len(lines)):
            line = _Line(index + 1, lines[index])
            stripped = line.text.strip()
            if not stripped:
                # The 910ProB 23.0.rc1 layout has a blank line between the chip and process tables.
                continue
            if stripped in _ELISIONS:
                self._elision(line)
            elif _BORDER_RE.fullmatch(stripped):
                self._border(line)
            else:
                cells = _row_cells(stripped)
                if cells is None:
                    raise ParseError(
                        _WHAT, "line inside the table is not a row, a border or '...' (cut off?)", line.no, line.text
                    )
                self._row(cells, line)
        return self._finish()

    def _elision(self, line: _Line) -> None:
        if self._chip_header is None or self._pending is not None:
            raise ParseError(_WHAT, "'...' outside the chip or process rows", line.no, line.text)
        self._elided = True

    def _border(self, line: _Line) -> None:
        if self._header_first is not None:
            raise ParseError(_WHAT, "the chip table header has only one row", line.no, line.text)
        if self._pending is not None:
            raise ParseError(_WHAT, "chip entry is missing its second row", line.no, line.text)

    def _row(self, cells: list[str], line: _Line) -> None:
        if self._pending is not None:
            header, first, first_line = self._pending
            self._pending = None
            self._add_chip(header, first, first_line, cells, line)
        elif self._header_first is not None:
            self._second_header_row(self._header_first[0], cells, line)
        elif self._process_header is not None:
            self._process_row(self._process_header, cells, line)
        elif self._chip_header is not None:
            labels = tuple(_header_cell_labels(cell) for cell in cells)
            if any(_PID in cell_labels for cell_labels in labels):
                _check_header(labels, _PROCESS_REQUIRED, "process table", line)
                self._process_header = labels
            else:
                self._pending = (self._chip_header, cells, line)
        else:
            self._preamble_row(cells, line)

    def _preamble_row(self, cells: list[str], line: _Line) -> None:
        header = tuple(_header_cell_labels(cell) for cell in cells)
        if header[0][:1] == (_NPU,) and not any(_PID in labels for labels in header):
            self._header_first = (header, line)
            return
        tool = _TOOL_VERSION_RE.search(line.text)
        driver = _DRIVER_VERSION_RE.search(line.text)
        if self._seen_version or (tool is None and driver is None):
            raise ParseError(_WHAT, "expected the npu-smi version row or the chip table header", line.no, line.text)
        self._seen_version = True
        self._tool_version = None if tool is None else tool.group(1)
        self._driver_version = None if driver is None else driver.group(1)

    def _second_header_row(self, first: _Header, cells: list[str], line: _Line) -> None:
        second = tuple(_header_cell_labels(cell) for cell in cells)
        _check_header((*first, *second), _CHIP_REQUIRED, "chip table", line)
        self._chip_header = (first, second)
        self._header_first = None

    def _add_chip(
        self,
        header: tuple[_Header, _Header],
        first: list[str],
        first_line: _Line,
        second: list[str],
        second_line: _Line,
    ) -> None:
        fields = _Fields()
        fields.add_row(header[0], first, first_line)
        fields.add_row(header[1], second, second_line)
        npu_id, chip_id = fields.integer(_NPU), fields.integer(_CHIP)
        if (npu_id, chip_id) in self._chip_keys:
            raise ParseError(_WHAT, f"NPU {npu_id} chip {chip_id} appears twice", second_line.no, second_line.text)
        self._chip_keys.add((npu_id, chip_id))
        hugepages = fields.used_total(_HUGEPAGES)
        memory = fields.used_total(_MEMORY)
        hbm = fields.used_total(_HBM)
        self._chips.append(
            NpuSmiChip(
                npu_id=npu_id,
                chip_id=chip_id,
                # 310P tables call the logical id "Device", A3 tables "Phy-ID".
                logical_id=fields.optional_integer(_DEVICE if fields.has(_DEVICE) else _PHY_ID),
                name=fields.free_text(_NAME),
                health=fields.text(_HEALTH),
                bus_id=fields.text(_BUS_ID),
                power_w=fields.optional_number(_POWER),
                temperature_c=fields.optional_number(_TEMP),
                hugepages_used=hugepages[0],
                hugepages_total=hugepages[1],
                aicore_percent=fields.optional_number(_AICORE),
                memory_used_mb=memory[0],
                memory_total_mb=memory[1],
                hbm_used_mb=hbm[0],
                hbm_total_mb=hbm[1],
            )
        )

    def _process_row(self, header: _Header, cells: list[str], line: _Line) -> None:
        if len(cells) == 1:
            empty = _NO_PROCESSES_RE.fullmatch(cells[0].strip())
            if empty is not None:
                _parse_int(_NPU, empty.group(1), line)
                return
        fields = _Fields()
        fields.add_row(header, cells, line)
        self._processes.append(
            NpuSmiProcess(
                npu_id=fields.integer(_NPU),
                chip_id=fields.optional_integer(_CHIP),
                pid=fields.integer(_PID),
                name=fields.free_text(_PROCESS_NAME),
                memory_mb=fields.integer(_PROCESS_MEMORY),
                container_pid=fields.optional_integer(_CONTAINER_PID),
            )
        )

    def _finish(self) -> NpuSmiInfo:
        if self._header_first is not None:
            line = self._header_first[1]
            raise ParseError(_WHAT, "the output ends after the first chip table header row", line.no, line.text)
        if self._chip_header is None:
            raise ParseError(_WHAT, "the table has no chip header row")
        if self._pending is not None:
            line = self._pending[2]
            raise ParseError(_WHAT, "the output ends before the second row of this chip", line.no, line.text)
        if not self._chips and not self._elided:
            raise ParseError(_WHAT, "the chip table has no rows")
        return NpuSmiInfo(
            tool_version=self._tool_version,
            driver_version=self._driver_version,
            chips=tuple(self._chips),
            processes=tuple(self._processes),
            elided=self._elided,
            has_process_table=self._process_header is not None,
        )


def _check_header(header: _Header, required: Sequence[str], table: str, line: _Line) -> None:
    known = [label for labels in header for label in labels if label in _KNOWN_LABEL_SET]
    duplicates = sorted({label for label in known if known.count(label) > 1})
    if duplicates:
        raise ParseError(_WHAT, f"{table} header repeats column(s) {', '.join(duplicates)}", line.no, line.text)
    missing = [label for label in required if label not in known]
    if missing:
        raise ParseError(_WHAT, f"{table} header lacks column(s) {', '.join(missing)}", line.no, line.text)
