"""Pure parsers of ``npu-smi info -t <type> -i <id> [-c <chip>]`` outputs.

Most types print indented ``Key : Value`` lines in blank-line separated groups (the card, then the chip, then for
``common`` an ``mcu`` group). :func:`parse_npu_smi_kv` reads any of them into ordered pairs; typed views pick what
an operator needs:

* ``-t health``  -> :func:`parse_npu_smi_health`  -> :class:`NpuSmiHealth`
* ``-t usages``  -> :func:`parse_npu_smi_usages`  -> :class:`NpuSmiUsages`
* ``-t common``  -> :func:`parse_npu_smi_common`  -> :class:`NpuSmiCommon`
* ``-t memory``  -> :func:`parse_npu_smi_memory`  -> :class:`NpuSmiMemory`
* ``-t board``   -> :func:`parse_npu_smi_board`   -> :class:`NpuSmiBoard`
* ``-t ecc``     -> :func:`parse_npu_smi_ecc`     -> :class:`NpuSmiEcc`
* ``-t topo``    -> :func:`parse_npu_smi_topo`    -> :class:`NpuTopology` (a matrix, not key/value lines)

Text in, frozen dataclass out; the only exception raised is :class:`npuops.parsing.ParseError`.
Redacted values (``Chip Name : xxx``) are kept as strings; numeric fields that do not hold a number (``NA``) are
None, with the printed text still in ``raw``.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from npuops.parsing import ParseError

__all__ = [
    "NpuSmiBoard",
    "NpuSmiCommon",
    "NpuSmiEcc",
    "NpuSmiHealth",
    "NpuSmiKeyValues",
    "NpuSmiMemory",
    "NpuSmiUsages",
    "NpuTopology",
    "parse_npu_smi_board",
    "parse_npu_smi_common",
    "parse_npu_smi_ecc",
    "parse_npu_smi_health",
    "parse_npu_smi_kv",
    "parse_npu_smi_memory",
    "parse_npu_smi_topo",
    "parse_npu_smi_usages",
]

Pairs = tuple[tuple[str, str], ...]

# ----------------------------------------------------------------------------------------------------------------
# Shared text handling
# ----------------------------------------------------------------------------------------------------------------

_BINARY_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
# Error reports instead of data: the shell, or npu-smi/dcmi itself ("dcmi module initialize failed. ret is -8005",
# "This device does not support querying p2p-enable.").
_ERROR_RE = re.compile(
    r"command not found|no such file or directory|permission denied|\bret(?:urn)?\s*(?:is|code|=|:)\s*-\d+"
    r"|\binitiali[sz]e failed\b|\bdoes not support\b",
    re.IGNORECASE,
)
_ELISION_RE = re.compile(r"(?:\.{3,}|\u2026+)")
_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9 ()%/._,+\-]*")
_INT_RE = re.compile(r"[+-]?[0-9]{1,18}")
_FLOAT_RE = re.compile(r"[+-]?[0-9]{1,18}(?:\.[0-9]{1,18})?")
_DEVICE_NAME_RE = re.compile(r"([A-Za-z][A-Za-z_\-]*)[0-9]{1,6}")
_NONE_VALUES = frozenset({"", "na", "n/a", "-", "--", "none", "null"})


def _lines(text: str, what: str) -> list[tuple[int, str]]:
    """(1-based line number, line) pairs after the checks every parser shares."""
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
        if _ERROR_RE.search(line):
            raise ParseError(what, f"the output is an error message, not {what} output", line_no, line)
    return numbered


def _norm(key: str) -> str:
    """Key for matching: case, spaces, dashes and underscores ignored ("Single-bit Error Count" ~ "single bit ...")."""
    return re.sub(r"[\s\-_]+", "", key).lower()


def _int(value: str | None) -> int | None:
    if value is None or not _INT_RE.fullmatch(value.strip()):
        return None
    return int(value)


def _float(value: str | None) -> float | None:
    if value is None or not _FLOAT_RE.fullmatch(value.strip()):
        return None
    return float(value)


def _text(value: str | None) -> str | None:
    return value if value is not None and value.strip() else None


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

    def get_all(self, key: str) -> tuple[str, ...]:
        """Every value of ``key``, mcu block included, in order."""
        wanted = _norm(key)
        return tuple(value for k, value in self.pairs if _norm(k) == wanted)

    def mcu_get(self, key: str) -> str | None:
        if self.mcu is None:
            return None
        wanted = _norm(key)
        return next((value for k, value in self.mcu if _norm(k) == wanted), None)


def _is_mcu(key: str, value: str) -> bool:
    return _norm(key) == "chipname" and value.strip().lower() == "mcu"


def parse_npu_smi_kv(text: str, what: str = "npu-smi info -t") -> NpuSmiKeyValues:
    """Parse indented ``Key : Value`` lines (split at the first colon; values may contain colons).

    Blank lines separate blocks; a ``Chip Name : mcu`` line starts the mcu block even without a blank line before
    it; author-elided ``...`` lines are skipped. Any other line without a colon is a ParseError.
    """
    blocks: list[list[tuple[str, str]]] = [[]]
    for line_no, line in _lines(text, what):
        stripped = line.strip()
        if not stripped:
            if blocks[-1]:
                blocks.append([])
            continue
        if _ELISION_RE.fullmatch(stripped):
            continue
        key, sep, value = stripped.partition(":")
        key = " ".join(key.split())
        if not sep or not _KEY_RE.fullmatch(key):
            raise ParseError(what, "expected a 'Key : Value' line", line_no, line)
        value = value.strip()
        if _is_mcu(key, value) and blocks[-1]:
            blocks.append([])
        blocks[-1].append((key, value))
    groups = tuple(tuple(block) for block in blocks if block)
    if not groups:
        raise ParseError(what, "no 'Key : Value' lines found")
    mcu = next((block for block in groups if _is_mcu(*block[0])), None)
    return NpuSmiKeyValues(pairs=tuple(pair for block in groups for pair in block), blocks=groups, mcu=mcu)


def _require_any(kv: NpuSmiKeyValues, what: str, found: list[object], fields: str) -> None:
    if all(value is None for value in found):
        keys = ", ".join(key for key, _ in kv.pairs[:6])
        raise ParseError(what, f"none of the expected fields ({fields}) found; got keys: {keys}")


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
class NpuSmiUsages:
    """``-t usages``: memory capacities and usage rates of one chip."""

    npu_id: int | None
    chip_id: int | None
    ddr_capacity_mb: int | None
    ddr_usage_percent: float | None
    hbm_capacity_mb: int | None
    hbm_usage_percent: float | None
    aicore_usage_percent: float | None
    aivector_usage_percent: float | None  # 910B and later only
    aicpu_usage_percent: float | None
    ctrlcpu_usage_percent: float | None
    ddr_bandwidth_usage_percent: float | None
    hbm_bandwidth_usage_percent: float | None
    raw: NpuSmiKeyValues

    @property
    def hbm_used_mb(self) -> float | None:
        """HBM in use, from capacity x rate (npu-smi prints only the rate here)."""
        if self.hbm_capacity_mb is None or self.hbm_usage_percent is None:
            return None
        return self.hbm_capacity_mb * self.hbm_usage_percent / 100


def parse_npu_smi_usages(text: str) -> NpuSmiUsages:
    what = "npu-smi info -t usages"
    kv = parse_npu_smi_kv(text, what)
    result = NpuSmiUsages(
        npu_id=_int(kv.get("NPU ID")),
        chip_id=_int(kv.get("Chip ID")),
        ddr_capacity_mb=_int(kv.get("DDR Capacity(MB)")),
        ddr_usage_percent=_float(kv.get("DDR Usage Rate(%)")),
        hbm_capacity_mb=_int(kv.get("HBM Capacity(MB)")),
        hbm_usage_percent=_float(kv.get("HBM Usage Rate(%)")),
        aicore_usage_percent=_float(kv.get("Aicore Usage Rate(%)", "AI Core Usage Rate(%)")),
        aivector_usage_percent=_float(kv.get("Aivector Usage Rate(%)", "AI Vector Usage Rate(%)")),
        aicpu_usage_percent=_float(kv.get("Aicpu Usage Rate(%)", "AI CPU Usage Rate(%)")),
        ctrlcpu_usage_percent=_float(kv.get("Ctrlcpu Usage Rate(%)", "Control CPU Usage Rate(%)")),
        ddr_bandwidth_usage_percent=_float(kv.get("DDR Bandwidth Usage Rate(%)")),
        hbm_bandwidth_usage_percent=_float(kv.get("HBM Bandwidth Usage Rate(%)")),
        raw=kv,
    )
    _require_any(
        kv,
        what,
        [
            kv.get("DDR Capacity(MB)"),
            kv.get("HBM Capacity(MB)"),
            kv.get("HBM Usage Rate(%)"),
            kv.get("DDR Usage Rate(%)"),
            kv.get("Aicore Usage Rate(%)", "AI Core Usage Rate(%)"),
        ],
        "DDR/HBM Capacity, usage rates",
    )
    return result


@dataclass(frozen=True)
class NpuSmiCommon:
    """``-t common``: the chip's load, clocks, temperature and power, plus the board MCU's temperature."""

    npu_id: int | None
    chip_count: int | None
    chip_id: int | None
    memory_usage_percent: float | None
    hbm_usage_percent: float | None
    aicore_usage_percent: float | None
    aicore_freq_mhz: int | None  # rated
    aicore_cur_freq_mhz: int | None  # current ("Aicore curFreq(MHZ)")
    aicore_count: int | None
    temperature_c: int | None
    power_w: float | None  # "NPU Real-time Power(W)"
    mcu_temperature_c: int | None  # from the "Chip Name : mcu" block
    raw: NpuSmiKeyValues


def parse_npu_smi_common(text: str) -> NpuSmiCommon:
    what = "npu-smi info -t common"
    kv = parse_npu_smi_kv(text, what)
    result = NpuSmiCommon(
        npu_id=_int(kv.get("NPU ID")),
        chip_count=_int(kv.get("Chip Count")),
        chip_id=_int(kv.get("Chip ID")),
        memory_usage_percent=_float(kv.get("Memory Usage Rate(%)")),
        hbm_usage_percent=_float(kv.get("HBM Usage Rate(%)")),
        aicore_usage_percent=_float(kv.get("Aicore Usage Rate(%)", "AI Core Usage Rate(%)")),
        aicore_freq_mhz=_int(kv.get("Aicore Freq(MHZ)", "AI Core Freq(MHZ)")),
        aicore_cur_freq_mhz=_int(kv.get("Aicore curFreq(MHZ)", "AI Core curFreq(MHZ)")),
        aicore_count=_int(kv.get("Aicore Count", "AI Core Count")),
        temperature_c=_int(kv.get("Temperature(C)")),
        power_w=_float(kv.get("NPU Real-time Power(W)", "Power(W)")),
        mcu_temperature_c=_int(kv.mcu_get("Temperature(C)")),
        raw=kv,
    )
    _require_any(
        kv,
        what,
        [
            result.memory_usage_percent,
            result.hbm_usage_percent,
            result.aicore_usage_percent,
            result.temperature_c,
            result.power_w,
            kv.get("Aicore Count"),
        ],
        "usage rates, Temperature, Power",
    )
    return result


@dataclass(frozen=True)
class NpuSmiMemory:
    """``-t memory``: capacities, clocks and HBM vendor."""

    npu_id: int | None
    chip_count: int | None
    chip_id: int | None
    ddr_capacity_mb: int | None
    ddr_clock_mhz: int | None
    hbm_capacity_mb: int | None
    hbm_clock_mhz: int | None
    hbm_temperature_c: int | None
    hbm_manufacturer_id: str | None  # "0x57", verbatim
    raw: NpuSmiKeyValues


def parse_npu_smi_memory(text: str) -> NpuSmiMemory:
    what = "npu-smi info -t memory"
    kv = parse_npu_smi_kv(text, what)
    result = NpuSmiMemory(
        npu_id=_int(kv.get("NPU ID")),
        chip_count=_int(kv.get("Chip Count")),
        chip_id=_int(kv.get("Chip ID")),
        ddr_capacity_mb=_int(kv.get("DDR Capacity(MB)")),
        ddr_clock_mhz=_int(kv.get("DDR Clock Speed(MHz)")),
        hbm_capacity_mb=_int(kv.get("HBM Capacity(MB)")),
        hbm_clock_mhz=_int(kv.get("HBM Clock Speed(MHz)")),
        hbm_temperature_c=_int(kv.get("HBM Temperature(C)")),
        hbm_manufacturer_id=_text(kv.get("HBM Manufacturer ID")),
        raw=kv,
    )
    _require_any(
        kv,
        what,
        [kv.get("DDR Capacity(MB)"), kv.get("HBM Capacity(MB)"), kv.get("DDR Clock Speed(MHz)")],
        "DDR/HBM Capacity, Clock Speed",
    )
    return result


@dataclass(frozen=True)
class NpuSmiBoard:
    """``-t board`` (card level) or ``-t board -c C`` (chip level)."""

    npu_id: int | None
    chip_id: int | None  # chip-level output only
    software_version: str | None  # card level: the driver version
    firmware_version: str | None
    compatibility: str | None  # "OK"
    board_id: str | None  # "0x02"
    pcb_id: str | None
    bom_id: str | None
    pcie_bus_info: str | None  # "0000:61:00.0"
    slot_id: int | None
    chip_count: int | None
    chip_type: str | None  # chip level
    chip_name: str | None  # chip level (vendor docs redact it as "xxx")
    chip_version: str | None
    raw: NpuSmiKeyValues


def parse_npu_smi_board(text: str) -> NpuSmiBoard:
    what = "npu-smi info -t board"
    kv = parse_npu_smi_kv(text, what)
    result = NpuSmiBoard(
        npu_id=_int(kv.get("NPU ID")),
        chip_id=_int(kv.get("Chip ID")),
        software_version=_text(kv.get("Software Version")),
        firmware_version=_text(kv.get("Firmware Version")),
        compatibility=_text(kv.get("Compatibility")),
        board_id=_text(kv.get("Board ID")),
        pcb_id=_text(kv.get("PCB ID")),
        bom_id=_text(kv.get("BOM ID")),
        pcie_bus_info=_text(kv.get("PCIe Bus Info")),
        slot_id=_int(kv.get("Slot ID")),
        chip_count=_int(kv.get("Chip Count")),
        chip_type=_text(kv.get("Chip Type")),
        chip_name=_text(kv.get("Chip Name")),
        chip_version=_text(kv.get("Chip Version")),
        raw=kv,
    )
    _require_any(
        kv,
        what,
        [result.software_version, result.firmware_version, result.board_id, result.pcie_bus_info],
        "Software/Firmware Version, Board ID, PCIe Bus Info",
    )
    return result


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
    numbers = [n for n in (_int(v) for v in values) if n is not None]
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

    def link(self, a: str, b: str) -> str | None:
        if a not in self.devices or b not in self.devices:
            return None
        return self.matrix[self.devices.index(a)][self.devices.index(b)]


def parse_npu_smi_topo(text: str) -> NpuTopology:
    what = "npu-smi info -t topo"
    header: list[str] | None = None
    header_line: tuple[int, str] | None = None
    rows: list[tuple[int, str, list[str]]] = []
    legend: dict[str, str] = {}
    last_legend_key: str | None = None
    in_legend = False
    for line_no, line in _lines(text, what):
        stripped = line.strip()
        if not stripped or _ELISION_RE.fullmatch(stripped):
            continue
        if re.fullmatch(r"(?i)legend\s*:?", stripped):
            in_legend = True
            continue
        if in_legend:
            key, sep, value = stripped.partition("=")
            if sep and key.strip():
                last_legend_key = key.strip()
                legend[last_legend_key] = value.strip()
            elif last_legend_key is not None:
                legend[last_legend_key] = f"{legend[last_legend_key]} {stripped}".strip()
            else:
                raise ParseError(what, "expected a 'NAME = meaning' legend line", line_no, line)
            continue
        if header is None:
            header = re.split(r"\s{2,}|\t", stripped)
            header_line = (line_no, line)
            continue
        tokens = stripped.split()
        rows.append((line_no, line, tokens))
    if header is None or header_line is None:
        raise ParseError(what, "no header line")
    labels = {tokens[0] for _, _, tokens in rows}
    # A header name is a device if some row is labelled with it, or if it is shaped like the row labels
    # ("NPU5" when rows are "NPU0".."NPU3"), so that a missing row is reported rather than taken for a column.
    prefixes = {m.group(1) for m in (_DEVICE_NAME_RE.fullmatch(label) for label in labels) if m}

    def is_device(name: str) -> bool:
        m = _DEVICE_NAME_RE.fullmatch(name)
        return name in labels or (m is not None and m.group(1) in prefixes)

    def leading_devices(names: list[str]) -> int:
        n = 0
        while n < len(names) and is_device(names[n]):
            n += 1
        return n

    count = leading_devices(header)
    if count == 0:  # names separated by single spaces
        header = header_line[1].split()
        count = leading_devices(header)
    if count == 0:
        raise ParseError(what, "header names no device that has a row", *header_line)
    devices = tuple(header[:count])
    extra_columns = tuple(header[count:])
    by_label: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for line_no, line, tokens in rows:
        label = tokens[0]
        if label not in devices:
            raise ParseError(what, f"row for {label[:40]!r}, which is not in the header", line_no, line)
        if label in by_label:
            raise ParseError(what, f"second row for {label[:40]!r}", line_no, line)
        if len(tokens) < 1 + count:
            raise ParseError(what, f"expected {count} link columns, got {len(tokens) - 1}", line_no, line)
        links = tuple(tokens[1 : 1 + count])
        rest = tokens[1 + count :]
        if len(rest) > len(extra_columns):
            if not extra_columns:
                raise ParseError(what, "more columns than the header names", line_no, line)
            rest = [*rest[: len(extra_columns) - 1], " ".join(rest[len(extra_columns) - 1 :])]
        extras = tuple(rest) + ("",) * (len(extra_columns) - len(rest))
        by_label[label] = (links, extras)
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
