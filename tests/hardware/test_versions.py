"""Version/info file parsers and the Ascend version ordering: real captures, garbage, and fuzzing."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.hardware.versions import (
    AscendVersion,
    parse_ascend_install_info,
    parse_ascend_version,
    parse_driver_version_info,
    parse_firmware_version_info,
    parse_key_value_lines,
    parse_toolkit_install_info,
)
from npuops.parsing import ParseError
from tests.support.captures import capture
from tests.support.paths import ASCEND_FIXTURES

# ---------------------------------------------------------------------------------------------------------------
# driver version.info
# ---------------------------------------------------------------------------------------------------------------


def test_driver_version_info_doc() -> None:
    info = parse_driver_version_info(capture("driver-version-info_doc_1.txt"))
    assert info.version == "24.1.rc1"
    assert info.package_version is None  # this older file has no package_version line
    assert info.inner_version == "V100R001C15SPC006B220"
    assert info.compatible_firmware == ("7.0.0", "7.2.99")
    assert info.compatible_versions == ("V100R001C30", "V100R001C13", "V100R001C15", "V100R001C17")
    assert len(info.raw) == 11
    assert info.raw[0] == ("Version", "24.1.rc1")
    assert ("ascendhal_version", "7.35.19") in info.raw
    assert ("tsfw_version", "1.0") in info.raw
    assert info.ascend_version == parse_ascend_version("24.1.RC1")


def test_driver_version_info_25_0_rc1_1() -> None:
    info = parse_driver_version_info(capture("driver-version-info_25.0.rc1.1_1.txt"))
    assert info.version == "25.0.rc1.1"
    assert info.package_version == "25.0.rc1.1"
    assert info.inner_version == "V100R001C21SPC002B220"
    assert info.compatible_firmware == ("7.0.0", "7.7.99")
    assert info.compatible_versions == ("V100R001C17", "V100R001C18", "V100R001C19", "V100R001C20", "V100R001C21")
    assert ("ascendhal_version", "7.35.23") in info.raw
    assert len(info.raw) == 12
    assert info.ascend_version is not None
    assert info.ascend_version > parse_ascend_version("25.0.rc1")


def test_driver_version_info_24_1_rc2_2() -> None:
    info = parse_driver_version_info(capture("driver-version-info_24.1.rc2.2_1.txt"))
    assert info.version == "24.1.rc2.2"
    assert info.package_version == "24.1.rc2.2"
    assert info.inner_version == "V100R001C18SPC001B233"
    assert info.compatible_firmware == ("7.0.0", "7.2.99")
    assert info.compatible_versions[-1] == "V100R001C18"
    assert len(info.compatible_versions) == 5


def test_driver_version_info_tolerates_crlf_indent_blank_lines_unknown_keys_and_redaction() -> None:
    text = "\r\n  Version=xxx\r\n\r\n\tnew_key_2030 = a=b \r\n...\r\ncompatible_version_fw=[xxx]\r\n"
    info = parse_driver_version_info(text)
    assert info.version == "xxx"
    assert info.ascend_version is None
    assert info.compatible_firmware is None
    assert info.raw == (("Version", "xxx"), ("new_key_2030", "a=b"), ("compatible_version_fw", "[xxx]"))


def test_driver_version_info_without_version_is_an_error() -> None:
    with pytest.raises(ParseError, match="missing Version= line"):
        parse_driver_version_info("package_version=25.0.rc1.1\n")


# ---------------------------------------------------------------------------------------------------------------
# firmware version.info
# ---------------------------------------------------------------------------------------------------------------


def test_firmware_version_info_doc() -> None:
    info = parse_firmware_version_info(capture("firmware-version-info_doc_1.txt"))
    assert info.version == "7.1.0.11.220"
    assert info.package_version == "23.0.7"
    assert info.compatible_driver == ("23.0.rc3", "23.0.0")
    assert info.compatible_driver_ranges == (("23.0.rc3", "23.0.rc3."), ("23.0.0", "23.0.0."))
    assert ("firmware_version", "1.0") in info.raw
    assert info.ascend_version == parse_ascend_version("7.1.0.11.220")


def test_firmware_version_info_without_compatibility_line() -> None:
    info = parse_firmware_version_info("Version=7.1.0.7.220\n")
    assert info.compatible_driver is None
    assert info.compatible_driver_ranges == ()
    assert info.package_version is None


# ---------------------------------------------------------------------------------------------------------------
# /etc/ascend_install.info (no capture: the shape is what the driver installer writes, KEY=VALUE)
# ---------------------------------------------------------------------------------------------------------------


def test_ascend_install_info() -> None:
    text = (
        "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\nFirmware_Install_Type=full\n"
        "Firmware_Install_Path_Param=/usr/local/Ascend\nDriver_Install_Type=full\n"
        "Driver_Install_Path_Param=/usr/local/Ascend\nDriver_Install_For_All=no\nDriver_Install_Mode=normal\n"
    )
    info = parse_ascend_install_info(text)
    assert info.driver_install_path == "/usr/local/Ascend"
    assert info.firmware_install_path == "/usr/local/Ascend"
    assert info.user_name == "HwHiAiUser"
    assert info.user_group == "HwHiAiUser"
    assert info.driver_install_type == "full"
    assert info.driver_install_mode == "normal"
    assert ("Driver_Install_For_All", "no") in info.raw


def test_ascend_install_info_partial() -> None:
    info = parse_ascend_install_info("Driver_Install_Path_Param=/opt/Ascend\n")
    assert info.driver_install_path == "/opt/Ascend"
    assert info.user_name is None
    assert info.firmware_install_path is None


# ---------------------------------------------------------------------------------------------------------------
# ascend_toolkit_install.info
# ---------------------------------------------------------------------------------------------------------------

TOOLKIT_EXPECTED = {
    "ascend_toolkit_install-info_1.txt": (
        "8.0.0",
        "V100R001C20SPC001B251",
        "aarch64",
        "/usr/local/Ascend/ascend-toolkit/8.0.0/aarch64-linux",
    ),
    "ascend_toolkit_install-info_2.txt": (
        "8.2.RC1",
        "V100R001C22SPC001B231",
        "aarch64",
        "/usr/local/Ascend/ascend-toolkit/8.2.RC1/aarch64-linux",
    ),
    "ascend_toolkit_install-info_3.txt": (
        "8.5.0",
        "V100R001C25B048",
        "aarch64",
        "/usr/local/Ascend/ascend-toolkit/8.5.0/aarch64-linux",
    ),
    "ascend_toolkit_install-info_aarch64_3.txt": (
        "8.3.RC1",
        "V100R001C23SPC002B201",
        "aarch64",
        "/usr/local/Ascend/ascend-toolkit/8.3.RC1/aarch64-linux",
    ),
    "ascend_toolkit_install-info_doc_1.txt": (
        "8.5.0",
        "V100R001C25SPC001B212",
        "aarch64",
        "/usr/local/Ascend/cann-8.5.0/aarch64-linux",
    ),
    "ascend_toolkit_install-info_x86_1.txt": (
        "8.3.RC2",
        "V100R001C23SPC002B210",
        "x86_64",
        "/usr/local/Ascend/ascend-toolkit/8.3.RC2/x86_64-linux",
    ),
}


def test_every_toolkit_capture_is_covered() -> None:
    assert {p.name for p in ASCEND_FIXTURES.glob("ascend_toolkit_install-info_*.txt")} == set(TOOLKIT_EXPECTED)


@pytest.mark.parametrize("name", sorted(TOOLKIT_EXPECTED))
def test_toolkit_install_info(name: str) -> None:
    version, inner, arch, path = TOOLKIT_EXPECTED[name]
    info = parse_toolkit_install_info(capture(name))
    assert info.package_name == "Ascend-cann-toolkit"
    assert info.version == version
    assert info.inner_version == inner
    assert info.arch == arch
    assert info.os == "linux"
    assert info.path == path
    assert info.compatible_versions[0] == "V100R001C15"
    assert len(info.raw) == 7
    assert info.ascend_version == parse_ascend_version(version)


def test_toolkit_install_info_compatible_versions_of_cann_8_0_0() -> None:
    info = parse_toolkit_install_info(capture("ascend_toolkit_install-info_1.txt"))
    assert info.compatible_versions == ("V100R001C15", "V100R001C17", "V100R001C18", "V100R001C19", "V100R001C20")


def test_toolkit_versions_order_like_their_releases() -> None:
    versions = [parse_toolkit_install_info(capture(name)).ascend_version for name in TOOLKIT_EXPECTED]
    assert None not in versions
    texts = [str(v) for v in sorted(v for v in versions if v is not None)]
    assert texts == ["8.0.0", "8.2.RC1", "8.3.RC1", "8.3.RC2", "8.5.0", "8.5.0"]


def test_toolkit_install_info_without_version_is_an_error() -> None:
    with pytest.raises(ParseError, match="missing version= line"):
        parse_toolkit_install_info("package_name=Ascend-cann-nnal\narch=aarch64\n")


# ---------------------------------------------------------------------------------------------------------------
# parse_key_value_lines and garbage
# ---------------------------------------------------------------------------------------------------------------


def test_key_value_lines_keep_order_and_duplicates() -> None:
    assert parse_key_value_lines("# c\na=1\nb = 2\na=3\n", "x") == (("a", "1"), ("b", "2"), ("a", "3"))


ALL_FILE_PARSERS: list[Callable[[str], object]] = [
    parse_driver_version_info,
    parse_firmware_version_info,
    parse_ascend_install_info,
    parse_toolkit_install_info,
    lambda text: parse_key_value_lines(text, "some.info"),
]


@pytest.mark.parametrize("parse", ALL_FILE_PARSERS)
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty output"),
        ("  \n\t\r\n", "empty output"),
        ("bash: cat: command not found\n", "command not found"),
        ("cat: /usr/local/Ascend/driver/version.info: No such file or directory\n", "No such file or directory"),
        ("\x7fELF\x02\x01\x01\x00\x00\x00=\x00", "binary data"),
        ("PK\x03\x04\ufffd\ufffd=1", "binary data"),
        ("hello world\n", "expected a KEY=VALUE line"),
        ("Version : 24.1.rc1\n", "expected a KEY=VALUE line"),
        ("bad key=1\n", "plain key"),
    ],
)
def test_garbage_raises_parse_error_naming_the_problem(parse: Callable[[str], object], text: str, problem: str) -> None:
    with pytest.raises(ParseError) as err:
        parse(text)
    assert problem in str(err.value)


def test_parse_error_points_at_the_line() -> None:
    with pytest.raises(ParseError) as err:
        parse_driver_version_info("Version=24.1.rc1\nthis is not a pair\n")
    assert err.value.line_no == 2
    assert err.value.line == "this is not a pair"


def test_comments_only_is_an_error() -> None:
    with pytest.raises(ParseError, match="no KEY=VALUE lines"):
        parse_key_value_lines("# just a comment\n...\n", "x")


# ---------------------------------------------------------------------------------------------------------------
# Fuzzing: nothing but ParseError, whatever the input
# ---------------------------------------------------------------------------------------------------------------

VERSION_CAPTURES = [
    capture(p.name)
    for pattern in ("driver-version-info_*.txt", "firmware-version-info_*.txt", "ascend_toolkit_install-info_*.txt")
    for p in sorted(ASCEND_FIXTURES.glob(pattern))
]


@st.composite
def mutated_capture(draw: st.DrawFn) -> str:
    """A real capture with a few random edits: cut, insert, duplicate or drop characters and lines."""
    text = draw(st.sampled_from(VERSION_CAPTURES))
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
            text = text[:pos] + draw(st.sampled_from(["=", "[", "]", ",", "\n", "...", "xxx", " "])) + text[pos + 1 :]
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


@pytest.mark.parametrize("parse", ALL_FILE_PARSERS)
@FUZZ
@given(text=st.text())
def test_fuzz_text(parse: Callable[[str], object], text: str) -> None:
    _only_parse_error(parse, text)


@pytest.mark.parametrize("parse", ALL_FILE_PARSERS)
@FUZZ
@given(text=mutated_capture())
def test_fuzz_mutated_captures(parse: Callable[[str], object], text: str) -> None:
    _only_parse_error(parse, text)


@FUZZ
@given(text=st.text())
def test_fuzz_version_strings(text: str) -> None:
    _only_parse_error(parse_ascend_version, text)


@FUZZ
@given(text=st.text(alphabet="0123456789.rcRCalphbetT ", max_size=30))
def test_fuzz_version_like_strings(text: str) -> None:
    _only_parse_error(parse_ascend_version, text)


# ---------------------------------------------------------------------------------------------------------------
# Version ordering
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "chain",
    [
        ["8.0.RC1", "8.0.RC2", "8.0.0", "8.1.RC1", "8.3.RC2", "8.5.0", "9.0.0"],
        ["23.0.rc2", "23.0.7", "24.1.rc1", "25.0.rc1.1", "25.2.0", "25.5.2", "26.0.rc1"],
        ["8.0.RC3.alpha003", "8.0.RC3"],
        ["23.0.rc2.b090", "23.0.rc2"],
        ["8.0.RC3.alpha001", "8.0.RC3.alpha003", "8.0.RC3.beta1", "8.0.RC3", "8.0.RC3.1", "8.0.0"],
        ["8.0.T6", "8.0.RC1"],
        ["24.1.rc1", "24.1.rc2", "24.1.rc2.2", "24.1.0"],
        ["7.1.0.7.220", "7.1.0.11.220", "7.7.99"],
    ],
)
def test_version_chains_are_strictly_increasing(chain: list[str]) -> None:
    versions = [parse_ascend_version(text) for text in chain]
    for low, high in itertools.pairwise(versions):
        assert low < high, (low.text, high.text)
        assert high > low
        assert low != high
    shuffled = list(reversed(versions))
    assert [v.text for v in sorted(shuffled)] == chain


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("8.0.RC1", "8.0.rc1"),
        ("8.0", "8.0.0"),
        ("25.0.rc1", "25.0.RC1.0"),
        ("v8.0.0", "8.0.0"),
        (" 8.1.RC1 ", "8.1.RC1"),
    ],
)
def test_version_equality_ignores_case_and_trailing_zeros(a: str, b: str) -> None:
    va, vb = parse_ascend_version(a), parse_ascend_version(b)
    assert va == vb
    assert hash(va) == hash(vb)
    assert va <= vb <= va


def test_version_properties() -> None:
    v = parse_ascend_version("25.0.rc1.1")
    assert (v.major, v.minor) == (25, 0)
    assert v.is_release_candidate
    assert v.is_prerelease
    assert str(v) == "25.0.rc1.1"
    final = parse_ascend_version("25.2.0")
    assert not final.is_prerelease
    assert parse_ascend_version("8.0.RC3.alpha003").is_prerelease
    assert parse_ascend_version("9").minor == 0


@pytest.mark.parametrize("text", ["", "   ", "xxx", "...", "rc1.8", "8..0", "8.0.", ".8", "8.0.RC1-1", "V100R001C15"])
def test_bad_versions(text: str) -> None:
    with pytest.raises(ParseError):
        parse_ascend_version(text)


def test_version_does_not_compare_with_strings() -> None:
    assert parse_ascend_version("8.0.0") != "8.0.0"
    with pytest.raises(TypeError):
        _ = parse_ascend_version("8.0.0") < "8.0.1"  # type: ignore[operator]


version_components = st.one_of(
    st.integers(0, 12).map(str),
    st.integers(0, 4).map(lambda n: f"RC{n}"),
    st.integers(0, 4).map(lambda n: f"rc{n}"),
    st.sampled_from(["alpha", "beta", "b", "T"]).flatmap(lambda k: st.integers(0, 120).map(lambda n: f"{k}{n:03d}")),
)
version_strings = st.builds(
    lambda major, rest: ".".join([str(major), *rest]),
    st.integers(0, 30),
    st.lists(version_components, max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(a=version_strings, b=version_strings, c=version_strings)
def test_version_order_is_total(a: str, b: str, c: str) -> None:
    va, vb, vc = (parse_ascend_version(x) for x in (a, b, c))
    # exactly one of <, ==, >
    assert [va < vb, va == vb, va > vb].count(True) == 1
    # antisymmetric, and equality is consistent with hashing
    if va <= vb and vb <= va:
        assert va == vb
        assert hash(va) == hash(vb)
    # transitive
    if va <= vb and vb <= vc:
        assert va <= vc
    if va < vb and vb < vc:
        assert va < vc
    assert (va <= vb) == (not va > vb)
    assert (va >= vb) == (vb <= va)


@settings(max_examples=200, deadline=None)
@given(versions=st.lists(version_strings, min_size=2, max_size=8))
def test_version_sorting_is_consistent(versions: list[str]) -> None:
    parsed = sorted(parse_ascend_version(v) for v in versions)
    for low, high in itertools.pairwise(parsed):
        assert low <= high
    again = sorted(reversed(parsed))
    assert [v.components for v in again] == [v.components for v in parsed]


@settings(max_examples=200, deadline=None)
@given(base=version_strings, label=st.sampled_from(["alpha", "beta", "b", "T"]), n=st.integers(0, 999))
def test_prerelease_builds_sort_before_their_release(base: str, label: str, n: int) -> None:
    release = parse_ascend_version(base)
    build = parse_ascend_version(f"{base}.{label}{n:03d}")
    assert build < release
    assert release < parse_ascend_version(f"{base}.1")


def test_version_type_is_frozen() -> None:
    v = parse_ascend_version("8.0.0")
    with pytest.raises(AttributeError):
        v.text = "9"  # type: ignore[misc]
    assert isinstance(v, AscendVersion)
