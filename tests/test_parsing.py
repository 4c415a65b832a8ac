"""The text handling every parser shares (npuops/parsing.py), on real captures and on garbage."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuops.parsing import (
    ERROR_LINES,
    ParseError,
    content_lines,
    error_line_pattern,
    first_value,
    is_elision,
    numbered_lines,
    parse_int,
    split_pair,
)
from tests.support.captures import capture


def test_numbered_lines_counts_from_one_and_unifies_line_ends() -> None:
    assert numbered_lines("\ufeffa\r\nb\rc\n", "x") == [(1, "a"), (2, "b"), (3, "c"), (4, "")]


@pytest.mark.parametrize(
    ("text", "problem", "line_no"),
    [
        (None, "expected text, got NoneType", None),
        (b"Version=1", "expected text, got bytes", None),
        ("", "empty output", None),
        (" \r\n\t\n", "empty output", None),
        ("ok : 1\n\x00\x01ELF", "binary data", 2),
        ("\ufffd\ufffdPNG", "binary data", 1),
        ("a : 1\nbash: hccn_tool: command not found\n", "error message, not x output", 2),
        ("cat: /etc/ascend_install.info: Permission denied\n", "error message", 1),
    ],
)
def test_numbered_lines_refuses_what_is_not_output(text: object, problem: str, line_no: int | None) -> None:
    with pytest.raises(ParseError) as err:
        numbered_lines(text, "x")
    assert problem in str(err.value)
    assert err.value.line_no == line_no


def test_the_error_points_at_the_vendor_error_line() -> None:
    """The real -8005 capture: npu-smi/dcmi's `ret is -8005` line is the one named."""
    with pytest.raises(ParseError) as err:
        numbered_lines(capture("npu-smi-info_error-8005_container_1.txt"), "npu-smi info -t health")
    assert (err.value.line_no, err.value.line) == (2, "dcmi module initialize failed. ret is -8005")


def test_a_module_adds_the_errors_its_tool_prints() -> None:
    unsupported = "This device does not support querying ecc.\n"
    assert numbered_lines(unsupported, "x")  # not an error for everyone
    with pytest.raises(ParseError, match="not the file content"):
        numbered_lines(unsupported, "x", errors=error_line_pattern(r"\bdoes not support\b"),
                       instead_of="the file content")
    assert error_line_pattern().pattern == ERROR_LINES.pattern


def test_content_lines_drop_blank_and_elided_lines() -> None:
    text = capture("hccn_tool-lldp_910b1_1.txt")  # the author elided part of it with a "..." line
    lines = content_lines(text, "hccn_tool -lldp -g")
    assert lines and all(line == line.strip() and line and not is_elision(line) for _, line in lines)
    numbers = [n for n, _ in lines]
    assert numbers == sorted(numbers) and len(numbers) < len(text.splitlines())


@pytest.mark.parametrize(("line", "elided"), [("...", True), ("......", True), ("\u2026", True), ("..", False),
                                              ("a...", False), ("", False)])
def test_is_elision(line: str, elided: bool) -> None:
    assert is_elision(line) is elided


@pytest.mark.parametrize(
    ("line", "sep", "pair"),
    [
        ("link  status : UP", ":", ("link status", "UP")),
        ("PCIe Bus Info : 0000:61:00.0", ":", ("PCIe Bus Info", "0000:61:00.0")),
        ("ipaddr:", ":", ("ipaddr", "")),
        ("Version=24.1.rc1=x", "=", ("Version", "24.1.rc1=x")),
        (": value", ":", None),
        ("no separator", ":", None),
    ],
)
def test_split_pair(line: str, sep: str, pair: tuple[str, str] | None) -> None:
    assert split_pair(line, sep) == pair


def test_first_value_ignores_case_and_takes_the_first() -> None:
    pairs = (("Version", "1"), ("version", "2"), ("Innerversion", "V1"))
    assert first_value(pairs, "VERSION") == "1"
    assert first_value(pairs, "inner_version", "innerversion") == "V1"
    assert first_value(pairs, "missing") is None
    assert first_value((("Key", ""),), "key") == ""  # present but empty is not missing


@pytest.mark.parametrize(("value", "number"), [("42", 42), (" -3 ", -3), ("+7", 7), ("NA", None), ("", None),
                                               ("4.5", None), (None, None), ("1" * 19, None)])
def test_parse_int(value: str | None, number: int | None) -> None:
    assert parse_int(value) == number


@given(st.text())
def test_helpers_are_total(text: str) -> None:
    """Any text: numbered_lines answers or raises ParseError; the others always answer."""
    with contextlib.suppress(ParseError):
        numbered_lines(text, "x")
    split_pair(text)
    is_elision(text)
    parse_int(text)
