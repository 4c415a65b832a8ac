"""npu-smi info -t <type> parsers: every real capture, targeted shapes, garbage, and fuzzing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.hardware.npu_smi_detail import (
    parse_npu_smi_ecc,
    parse_npu_smi_health,
    parse_npu_smi_kv,
    parse_npu_smi_topo,
)
from npuops.parsing import ParseError
from tests.support.captures import capture
from tests.support.paths import ASCEND_FIXTURES

# ---------------------------------------------------------------------------------------------------------------
# Generic Key : Value
# ---------------------------------------------------------------------------------------------------------------


def test_kv_common_blocks_and_mcu() -> None:
    kv = parse_npu_smi_kv(capture("npu-smi-info-t-common_910-32g_1.txt"), "npu-smi info -t common")
    assert len(kv.pairs) == 13
    assert [len(block) for block in kv.blocks] == [2, 9, 2]
    assert kv.mcu == (("Chip Name", "mcu"), ("Temperature(C)", "40"))
    assert kv.get("Temperature(C)") == "46"  # the chip's, not the mcu's
    assert [v for k, v in kv.pairs if k == "Temperature(C)"] == ["46", "40"]  # duplicates kept
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
# -t health / ecc
# ---------------------------------------------------------------------------------------------------------------


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
