"""npu-smi info -t <type> parsers: every real capture, targeted shapes, garbage, and fuzzing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.hardware.npu_smi_detail import (
    parse_npu_smi_board,
    parse_npu_smi_common,
    parse_npu_smi_ecc,
    parse_npu_smi_health,
    parse_npu_smi_kv,
    parse_npu_smi_memory,
    parse_npu_smi_topo,
    parse_npu_smi_usages,
)
from npuops.parsing import ParseError
from tests.conftest import ASCEND_FIXTURES, capture

# ---------------------------------------------------------------------------------------------------------------
# Generic Key : Value
# ---------------------------------------------------------------------------------------------------------------


def test_kv_common_blocks_and_mcu() -> None:
    kv = parse_npu_smi_kv(capture("npu-smi-info-t-common_910-32g_1.txt"), "npu-smi info -t common")
    assert len(kv.pairs) == 13
    assert [len(block) for block in kv.blocks] == [2, 9, 2]
    assert kv.mcu == (("Chip Name", "mcu"), ("Temperature(C)", "40"))
    assert kv.get("Temperature(C)") == "46"  # the chip's, not the mcu's
    assert kv.get_all("Temperature(C)") == ("46", "40")  # duplicates kept
    assert kv.mcu_get("temperature(c)") == "40"
    assert kv.get("NPU ID") == "1"
    assert kv.get("nonexistent") is None


def test_kv_mcu_without_blank_line_still_splits() -> None:
    text = "NPU ID : 0\nTemperature(C) : 50\nChip Name : mcu\nTemperature(C) : 41\n"
    kv = parse_npu_smi_kv(text)
    assert kv.mcu == (("Chip Name", "mcu"), ("Temperature(C)", "41"))
    assert kv.get("Temperature(C)") == "50"


def test_kv_values_with_colons_and_redactions() -> None:
    kv = parse_npu_smi_kv(capture("npu-smi-info-t-board-c0_910a_doc_1.txt"))
    assert kv.get("PCIe Bus Info") == "0000:61:00.0"
    assert kv.get("Chip Name") == "xxx"
    assert kv.get("VDie ID") == "42C711D4 20B03704 4A10C8D4 14CC040A D2102003"
    assert kv.mcu is None


def test_kv_flash_bonus_type() -> None:
    kv = parse_npu_smi_kv(capture("npu-smi-info-t-flash_910-32g_1.txt"), "npu-smi info -t flash")
    assert [len(block) for block in kv.blocks] == [2, 1, 4]
    assert kv.get("Flash Count") == "1"
    assert kv.get("Flash ID") == "1730504"
    assert kv.get("Manufacturer ID") == "0xC8"
    assert kv.get("Capacity(MB)") == "64"


def test_kv_crlf_tabs_elision() -> None:
    kv = parse_npu_smi_kv("\tNPU ID   :  3\r\n...\r\n\r\n   Chip Count : 1 \r\n")
    assert kv.pairs == (("NPU ID", "3"), ("Chip Count", "1"))
    assert len(kv.blocks) == 2


# ---------------------------------------------------------------------------------------------------------------
# -t common
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "npu", "hbm", "aicore", "cur_freq", "count", "temp", "power", "mcu_temp"),
    [
        ("npu-smi-info-t-common_910-32g_1.txt", 1, 91, 6, 1800, 20, 46, 130.4, 40),
        ("npu-smi-info-t-common_910-32g_2.txt", 7, 82, 70, 1800, 20, 66, 331.1, 58),
        ("npu-smi-info-t-common_910b1_1.txt", 1, 4, 0, 800, 24, 46, 93.4, 38),
    ],
)
def test_common(
    name: str, npu: int, hbm: int, aicore: int, cur_freq: int, count: int, temp: int, power: float, mcu_temp: int
) -> None:
    common = parse_npu_smi_common(capture(name))
    assert common.npu_id == npu
    assert common.chip_count == 1
    assert common.chip_id == 0
    assert common.memory_usage_percent == 0
    assert common.hbm_usage_percent == hbm
    assert common.aicore_usage_percent == aicore
    assert common.aicore_freq_mhz == 1800
    assert common.aicore_cur_freq_mhz == cur_freq
    assert common.aicore_count == count
    assert common.temperature_c == temp
    assert common.power_w == power
    assert common.mcu_temperature_c == mcu_temp


def test_common_na_values_are_none() -> None:
    common = parse_npu_smi_common("NPU ID : 0\nTemperature(C) : NA\nNPU Real-time Power(W) : NA\nAicore Count : 20\n")
    assert common.temperature_c is None
    assert common.power_w is None
    assert common.aicore_count == 20
    assert common.raw.get("Temperature(C)") == "NA"


# ---------------------------------------------------------------------------------------------------------------
# -t usages
# ---------------------------------------------------------------------------------------------------------------


def test_usages_910_32g_unindented() -> None:
    usages = parse_npu_smi_usages(capture("npu-smi-info-t-usages_910-32g_1.txt"))
    assert usages.npu_id == 1
    assert usages.chip_id == 0
    assert usages.ddr_capacity_mb == 15079
    assert usages.ddr_usage_percent == 14
    assert usages.hbm_capacity_mb == 32768
    assert usages.hbm_usage_percent == 0
    assert usages.aicore_usage_percent == 0
    assert usages.aivector_usage_percent is None  # not printed by the old 910
    assert usages.aicpu_usage_percent == 0
    assert usages.ctrlcpu_usage_percent == 0
    assert usages.ddr_bandwidth_usage_percent == 0
    assert usages.hbm_bandwidth_usage_percent == 0
    assert usages.hbm_used_mb == 0
    assert usages.raw.get("DDR Hugepages Total(page)") == "0"


def test_usages_910a_doc() -> None:
    usages = parse_npu_smi_usages(capture("npu-smi-info-t-usages_910a_doc_1.txt"))
    assert usages.npu_id == 0
    assert usages.ddr_capacity_mb == 13553
    assert usages.ddr_usage_percent == 6
    assert usages.hbm_capacity_mb == 32768
    assert usages.hbm_usage_percent == 0


def test_usages_910b1_with_aivector() -> None:
    usages = parse_npu_smi_usages(capture("npu-smi-info-t-usages_910b1_1.txt"))
    assert usages.npu_id == 0
    assert usages.ddr_capacity_mb == 0
    assert usages.hbm_capacity_mb == 65536
    assert usages.hbm_usage_percent == 4
    assert usages.aivector_usage_percent == 0
    assert usages.hbm_used_mb == pytest.approx(2621.44)
    assert len(usages.raw.pairs) == 15


# ---------------------------------------------------------------------------------------------------------------
# -t memory / board / health / ecc
# ---------------------------------------------------------------------------------------------------------------


def test_memory_910_32g() -> None:
    memory = parse_npu_smi_memory(capture("npu-smi-info-t-memory_910-32g_1.txt"))
    assert memory.npu_id == 1
    assert memory.chip_count == 1
    assert memory.chip_id == 0
    assert memory.ddr_capacity_mb == 0
    assert memory.ddr_clock_mhz == 0
    assert memory.hbm_capacity_mb == 32768
    assert memory.hbm_clock_mhz == 1600
    assert memory.hbm_temperature_c == 35
    assert memory.hbm_manufacturer_id == "0x57"


def test_board_card_level() -> None:
    board = parse_npu_smi_board(capture("npu-smi-info-t-board_910a_doc_1.txt"))
    assert board.npu_id == 0
    assert board.software_version == "23.0.5"
    assert board.firmware_version == "7.1.0.7.220"
    assert board.compatibility == "OK"
    assert board.board_id == "0x02"
    assert board.pcb_id == "A"
    assert board.bom_id == "1"
    assert board.pcie_bus_info == "0000:61:00.0"
    assert board.slot_id == 0
    assert board.chip_count == 1
    assert board.chip_id is None
    assert board.raw.get("PCI Device ID") == "0xD801"
    assert board.raw.get("Class ID") == "NA"


def test_board_chip_level() -> None:
    board = parse_npu_smi_board(capture("npu-smi-info-t-board-c0_910a_doc_1.txt"))
    assert board.npu_id == 0
    assert board.chip_id == 0
    assert board.chip_type == "Ascend"
    assert board.chip_name == "xxx"
    assert board.chip_version == "V1"
    assert board.pcb_id == "NA"
    assert board.firmware_version == "7.1.0.7.220"
    assert board.software_version is None
    assert board.raw.get("NDie ID") == "27216594 20401010 4E10C8D4 14CC040A A4102003"


def test_health_doc() -> None:
    health = parse_npu_smi_health(capture("npu-smi-info-t-health_doc_1.txt"))
    assert health.health == "OK"
    assert health.healthy is True
    assert health.error_codes == ()
    assert health.error_information is None


def test_health_with_error_codes() -> None:
    health = parse_npu_smi_health(
        "Health Status : Alarm\nError Code : 80E18005 80CB8009\nError Information : something broke\n"
    )
    assert health.health == "Alarm"
    assert health.healthy is False
    assert health.error_codes == ("80E18005", "80CB8009")
    assert health.error_information == "something broke"


def test_health_missing_status_is_an_error() -> None:
    with pytest.raises(ParseError, match="no 'Health Status' line"):
        parse_npu_smi_health(capture("npu-smi-info-t-memory_910-32g_1.txt"))


def test_ecc_doc() -> None:
    ecc = parse_npu_smi_ecc(capture("npu-smi-info-t-ecc_doc_1.txt"))
    assert ecc.single_bit_errors == 0
    assert ecc.double_bit_errors == 0
    assert ecc.has_uncorrectable_errors is False
    assert ecc.raw.pairs == (("Single-bit Error Count", "0"), ("Double-bit Error Count", "0"))


def test_ecc_counts() -> None:
    ecc = parse_npu_smi_ecc("Single-bit Error Count : 12\nDouble-bit Error Count : 1\n")
    assert (ecc.single_bit_errors, ecc.double_bit_errors) == (12, 1)
    assert ecc.has_uncorrectable_errors


def test_ecc_missing_counts_is_an_error() -> None:
    with pytest.raises(ParseError, match="Single-bit Error Count"):
        parse_npu_smi_ecc(capture("npu-smi-info-t-health_doc_1.txt"))


@pytest.mark.parametrize(
    ("parse", "fixture", "problem"),
    [
        (parse_npu_smi_usages, "npu-smi-info-t-health_doc_1.txt", "none of the expected fields"),
        (parse_npu_smi_common, "npu-smi-info-t-health_doc_1.txt", "none of the expected fields"),
        (parse_npu_smi_memory, "npu-smi-info-t-health_doc_1.txt", "none of the expected fields"),
        (parse_npu_smi_board, "npu-smi-info-t-health_doc_1.txt", "none of the expected fields"),
    ],
)
def test_wrong_type_output_is_rejected(parse: Callable[[str], object], fixture: str, problem: str) -> None:
    with pytest.raises(ParseError, match=problem):
        parse(capture(fixture))


# ---------------------------------------------------------------------------------------------------------------
# -t topo
# ---------------------------------------------------------------------------------------------------------------


def test_topo_910b1_8dev() -> None:
    topo = parse_npu_smi_topo(capture("npu-smi-info-t-topo_910b1_8dev_1.txt"))
    assert topo.devices == tuple(f"NPU{i}" for i in range(8))
    assert len(topo.matrix) == 8
    for i, row in enumerate(topo.matrix):
        assert len(row) == 8
        assert row[i] == "X"
        assert all(link == "HCCS" for j, link in enumerate(row) if j != i)
    assert topo.extra_columns == ("CPU Affinity",)
    assert topo.cpu_affinity == ("144-167", "0-23", "144-167", "0-23", "96-119", "48-71", "96-119", "48-71")
    assert topo.link("NPU0", "NPU5") == "HCCS"
    assert topo.link("NPU3", "NPU3") == "X"
    assert topo.link("NPU0", "NPU9") is None
    assert dict(topo.legend) == {
        "X": "Self",
        "SYS": "Path traversing PCIe and NUMA nodes. Nodes are connected through SMP, such as QPI, UPI.",
        "PHB": "Path traversing PCIe and the PCIe host bridge of a CPU.",
        "PIX": "Path traversing a single PCIe switch",
        "PXB": "Path traversing multipul PCIe switches",
        "HCCS": "Connection traversing HCCS.",
    }
    assert hash(topo) == hash(parse_npu_smi_topo(capture("npu-smi-info-t-topo_910b1_8dev_1.txt")))


def test_topo_without_legend_or_affinity() -> None:
    topo = parse_npu_smi_topo("NPU0 NPU1\nNPU0 X PIX\nNPU1 PIX X\n")
    assert topo.devices == ("NPU0", "NPU1")
    assert topo.matrix == (("X", "PIX"), ("PIX", "X"))
    assert topo.cpu_affinity == (None, None)
    assert dict(topo.legend) == {}


def test_topo_missing_row_is_an_error() -> None:
    text = "\n".join(capture("npu-smi-info-t-topo_910b1_8dev_1.txt").split("\n")[:5])
    with pytest.raises(ParseError, match="not square"):
        parse_npu_smi_topo(text)


def test_topo_short_row_is_an_error() -> None:
    with pytest.raises(ParseError, match="expected 2 link columns") as err:
        parse_npu_smi_topo("NPU0 NPU1\nNPU0 X\nNPU1 PIX X\n")
    assert err.value.line_no == 2


# ---------------------------------------------------------------------------------------------------------------
# Garbage and fuzzing
# ---------------------------------------------------------------------------------------------------------------

PARSERS: dict[str, Callable[[str], object]] = {
    "kv": parse_npu_smi_kv,
    "health": parse_npu_smi_health,
    "usages": parse_npu_smi_usages,
    "common": parse_npu_smi_common,
    "memory": parse_npu_smi_memory,
    "board": parse_npu_smi_board,
    "ecc": parse_npu_smi_ecc,
    "topo": parse_npu_smi_topo,
}


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty output"),
        ("   \r\n\n", "empty output"),
        ("bash: npu-smi: command not found\n", "command not found"),
        ("\x00\x01\x02ELF\x7f", "binary data"),
        ("\ufffd\ufffdsome : thing", "binary data"),
        (capture("npu-smi-info_error-8005_container_1.txt"), "error message"),
        ("This device does not support querying ecc.\n", "error message"),
    ],
)
def test_garbage_raises_parse_error_naming_the_problem(name: str, text: str, problem: str) -> None:
    with pytest.raises(ParseError) as err:
        PARSERS[name](text)
    assert problem in str(err.value)


def test_error_capture_points_at_the_error_line() -> None:
    with pytest.raises(ParseError) as err:
        parse_npu_smi_kv(capture("npu-smi-info_error-8005_container_1.txt"))
    assert err.value.line_no == 2
    assert err.value.line == "dcmi module initialize failed. ret is -8005"


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_prose_is_not_accepted(name: str) -> None:
    with pytest.raises(ParseError):
        PARSERS[name]("hello world\nthis is not npu-smi output\n")


def test_summary_table_is_not_key_value() -> None:
    with pytest.raises(ParseError, match="expected a 'Key : Value' line"):
        parse_npu_smi_kv(capture("npu-smi-info_910b3_1.txt"))


DETAIL_CAPTURES = [capture(p.name) for p in sorted(ASCEND_FIXTURES.glob("npu-smi-info-t-*.txt"))]


@st.composite
def mutated_capture(draw: st.DrawFn) -> str:
    """A real npu-smi -t capture with a few random edits."""
    text = draw(st.sampled_from(DETAIL_CAPTURES))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["insert", "delete", "truncate", "drop_line", "dup_line", "crlf", "replace"]))
        pos = draw(st.integers(0, max(len(text), 1)))
        if op == "insert":
            text = text[:pos] + draw(st.text(min_size=1, max_size=8)) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 20)) :]
        elif op == "truncate":
            text = text[:pos]
        elif op == "replace":
            piece = draw(st.sampled_from([":", " : ", "=", "\n", "...", "xxx", "NA", "Chip Name : mcu\n", "Legend:\n"]))
            text = text[:pos] + piece + text[pos + 1 :]
        else:
            lines = text.split("\n")
            i = pos % len(lines)
            if op == "drop_line":
                del lines[i]
            elif op == "dup_line":
                lines.insert(i, lines[i])
            text = "\r\n".join(lines) if op == "crlf" else "\n".join(lines)
    return text


def _only_parse_error(parse: Callable[[str], object], text: str) -> None:
    with contextlib.suppress(ParseError):
        parse(text)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", sorted(PARSERS))
@FUZZ
@given(text=st.text())
def test_fuzz_text(name: str, text: str) -> None:
    _only_parse_error(PARSERS[name], text)


@pytest.mark.parametrize("name", sorted(PARSERS))
@FUZZ
@given(text=mutated_capture())
def test_fuzz_mutated_captures(name: str, text: str) -> None:
    _only_parse_error(PARSERS[name], text)


@pytest.mark.parametrize("name", sorted(PARSERS))
@FUZZ
@given(text=st.text(alphabet="NPU0123456789 :=\n\tXHCS-Legend()%.", max_size=300))
def test_fuzz_structured_alphabet(name: str, text: str) -> None:
    _only_parse_error(PARSERS[name], text)
