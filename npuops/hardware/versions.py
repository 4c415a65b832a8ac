"""Pure parsers of Ascend version/info files, and an ordering for Ascend version strings.

Every file handled here is a list of ``KEY=VALUE`` lines:

* ``/usr/local/Ascend/driver/version.info``    -> :func:`parse_driver_version_info`
* ``/usr/local/Ascend/firmware/version.info``  -> :func:`parse_firmware_version_info`
* ``/etc/ascend_install.info``                 -> :func:`parse_ascend_install_info`
* ``.../ascend_toolkit_install.info`` (and the NNAL/kernels/ops ``*_install.info`` files of the same shape)
  -> :func:`parse_toolkit_install_info`

:func:`parse_ascend_version` turns a version string (``8.0.RC1``, ``25.0.rc1.1``, ``23.0.rc2.b090``) into an
ordered value so driver/CANN versions can be compared.

Everything is pure: text in, frozen dataclass out. The only exception raised is
:class:`npuops.parsing.ParseError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from npuops.parsing import (
    Pairs,
    ParseError,
    content_lines,
    error_line_pattern,
    first_value,
    is_elision,
    numbered_lines,
    split_pair,
)

__all__ = [
    "AscendInstallInfo",
    "AscendVersion",
    "DriverVersionInfo",
    "FirmwareVersionInfo",
    "NnalVersionInfo",
    "ToolkitInstallInfo",
    "ToolkitVersionCfg",
    "parse_ascend_install_info",
    "parse_ascend_version",
    "parse_driver_version_info",
    "parse_firmware_version_info",
    "parse_key_value_lines",
    "parse_nnal_version_info",
    "parse_toolkit_install_info",
    "parse_version_cfg",
]

# ----------------------------------------------------------------------------------------------------------------
# Shared text handling
# ----------------------------------------------------------------------------------------------------------------

# Besides the shell's errors: `cat` of a directory.
_ERRORS = error_line_pattern(r"is a directory")
_INSTEAD_OF = "the file content"
_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_BRACKET_LIST_RE = re.compile(r"\[[^\[\]]*\](?:\s*,\s*\[[^\[\]]*\])*")


def _optional(value: str | None) -> str | None:
    return value if value else None


def _bracket_groups(value: str | None) -> tuple[tuple[str, ...], ...] | None:
    """``[a,b],[c]`` -> ``(("a", "b"), ("c",))``; None when the value is not such a list."""
    if value is None or not _BRACKET_LIST_RE.fullmatch(value.strip()):
        return None
    groups = re.findall(r"\[([^\[\]]*)\]", value)
    return tuple(tuple(item.strip() for item in group.split(",")) for group in groups)


def parse_key_value_lines(text: str, what: str) -> Pairs:
    """Parse ``KEY=VALUE`` lines into ordered (key, value) pairs; duplicates are kept.

    Blank lines, ``#`` comments and elision lines (``...``) are skipped; keys and values are stripped; the value
    is everything after the first ``=`` (values may contain ``=``). Any other line is a ParseError.
    """
    pairs: list[tuple[str, str]] = []
    for line_no, line in numbered_lines(text, what, errors=_ERRORS, instead_of=_INSTEAD_OF):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or is_elision(stripped):
            continue
        key, sep, value = stripped.partition("=")
        key = key.strip()
        if not sep:
            raise ParseError(what, "expected a KEY=VALUE line", line_no, line)
        if not _KEY_RE.fullmatch(key):
            raise ParseError(what, "expected a KEY=VALUE line with a plain key", line_no, line)
        pairs.append((key, value.strip()))
    if not pairs:
        raise ParseError(what, "no KEY=VALUE lines found")
    return tuple(pairs)


def _required(pairs: Pairs, what: str, *keys: str) -> str:
    value = first_value(pairs, *keys)
    if value is None:
        raise ParseError(what, f"missing {keys[0]}= line")
    if not value:
        raise ParseError(what, f"{keys[0]}= is empty")
    return value


def _version_or_none(text: str) -> AscendVersion | None:
    try:
        return parse_ascend_version(text)
    except ParseError:
        return None


# ----------------------------------------------------------------------------------------------------------------
# The files
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriverVersionInfo:
    """``/usr/local/Ascend/driver/version.info``."""

    version: str  # Version=24.1.rc1
    package_version: str | None  # package_version=25.0.rc1.1 (absent in older drivers)
    inner_version: str | None  # Innerversion=V100R001C15SPC006B220
    compatible_firmware: tuple[str, str] | None  # compatible_version_fw=[7.0.0,7.7.99] -> (low, high)
    compatible_versions: tuple[str, ...]  # compatible_version=[V100R001C17],[V100R001C18] (inner versions)
    raw: Pairs  # every KEY=VALUE line, in order

    @property
    def ascend_version(self) -> AscendVersion | None:
        """``version`` as an ordered :class:`AscendVersion`, or None when it is not a version (e.g. redacted)."""
        return _version_or_none(self.version)


@dataclass(frozen=True)
class FirmwareVersionInfo:
    """``/usr/local/Ascend/firmware/version.info``."""

    version: str  # Version=7.1.0.11.220 (the firmware's own version)
    package_version: str | None  # package_version=23.0.7 (the driver/firmware package it shipped in)
    # compatible_version_drv=[23.0.rc3,23.0.rc3.],[23.0.0,23.0.0.] -> ("23.0.rc3", "23.0.0"): the driver version
    # each group names; compatible_driver_ranges keeps each group's (first, last) bound verbatim.
    compatible_driver: tuple[str, ...] | None
    compatible_driver_ranges: tuple[tuple[str, str], ...]
    raw: Pairs

    @property
    def ascend_version(self) -> AscendVersion | None:
        return _version_or_none(self.version)


@dataclass(frozen=True)
class AscendInstallInfo:
    """``/etc/ascend_install.info``, written by the driver/firmware installers.

    The format is ``KEY=VALUE`` lines: the driver package's installer writes them with
    ``echo "${_key}=${_val}" >> /etc/ascend_install.info`` and reads them back with
    ``grep "${_key}=" | cut -d"=" -f2-``; its known keys are Driver_Install_Type, UserName, UserGroup,
    Driver_Install_Path_Param, Firmware_Install_Path_Param, Firmware_Install_Type, Driver_Install_For_All and
    Driver_Install_Mode (``updateInstallParam`` / ``getInstallParam`` in
    https://github.com/verylucky01/driver/blob/aff951586fcabb1e6c8140c7d14fa056c93eef06/scripts/package/driver/common/scripts/common.sh).
    """

    driver_install_path: str | None  # Driver_Install_Path_Param=/usr/local/Ascend
    firmware_install_path: str | None  # Firmware_Install_Path_Param
    driver_install_type: str | None  # Driver_Install_Type
    driver_install_mode: str | None  # Driver_Install_Mode (e.g. vnpu_guest)
    user_name: str | None  # UserName
    user_group: str | None  # UserGroup
    raw: Pairs


@dataclass(frozen=True)
class ToolkitInstallInfo:
    """``ascend_toolkit_install.info`` (and NNAL/kernels/ops install-info files of the same shape)."""

    package_name: str | None  # package_name=Ascend-cann-toolkit
    version: str  # version=8.0.0
    inner_version: str | None  # innerversion=V100R001C20SPC001B251
    arch: str | None  # arch=aarch64
    os: str | None  # os=linux
    path: str | None  # path=/usr/local/Ascend/ascend-toolkit/8.0.0/aarch64-linux
    compatible_versions: tuple[str, ...]  # compatible_version=[V100R001C15],[V100R001C17]
    raw: Pairs

    @property
    def ascend_version(self) -> AscendVersion | None:
        return _version_or_none(self.version)


def _flat(groups: tuple[tuple[str, ...], ...] | None) -> tuple[str, ...]:
    if groups is None:
        return ()
    return tuple(item for group in groups for item in group if item)


def parse_driver_version_info(text: str) -> DriverVersionInfo:
    what = "driver version.info"
    pairs = parse_key_value_lines(text, what)
    firmware = _bracket_groups(first_value(pairs, "compatible_version_fw"))
    compatible_firmware: tuple[str, str] | None = None
    if firmware is not None and len(firmware) == 1 and len(firmware[0]) == 2 and all(firmware[0]):
        compatible_firmware = (firmware[0][0], firmware[0][1])
    return DriverVersionInfo(
        version=_required(pairs, what, "Version"),
        package_version=_optional(first_value(pairs, "package_version")),
        inner_version=_optional(first_value(pairs, "Innerversion", "inner_version")),
        compatible_firmware=compatible_firmware,
        compatible_versions=_flat(_bracket_groups(first_value(pairs, "compatible_version"))),
        raw=pairs,
    )


def parse_firmware_version_info(text: str) -> FirmwareVersionInfo:
    what = "firmware version.info"
    pairs = parse_key_value_lines(text, what)
    groups = _bracket_groups(first_value(pairs, "compatible_version_drv"))
    compatible_driver: tuple[str, ...] | None = None
    ranges: tuple[tuple[str, str], ...] = ()
    if groups is not None:
        compatible_driver = tuple(group[0] for group in groups if group[0])
        ranges = tuple((group[0], group[-1]) for group in groups if group[0])
    return FirmwareVersionInfo(
        version=_required(pairs, what, "Version"),
        package_version=_optional(first_value(pairs, "package_version")),
        compatible_driver=compatible_driver,
        compatible_driver_ranges=ranges,
        raw=pairs,
    )


def parse_ascend_install_info(text: str) -> AscendInstallInfo:
    what = "/etc/ascend_install.info"
    pairs = parse_key_value_lines(text, what)
    return AscendInstallInfo(
        driver_install_path=_optional(first_value(pairs, "Driver_Install_Path_Param")),
        firmware_install_path=_optional(first_value(pairs, "Firmware_Install_Path_Param")),
        driver_install_type=_optional(first_value(pairs, "Driver_Install_Type")),
        driver_install_mode=_optional(first_value(pairs, "Driver_Install_Mode")),
        user_name=_optional(first_value(pairs, "UserName")),
        user_group=_optional(first_value(pairs, "UserGroup")),
        raw=pairs,
    )


def parse_toolkit_install_info(text: str) -> ToolkitInstallInfo:
    what = "ascend_toolkit_install.info"
    pairs = parse_key_value_lines(text, what)
    return ToolkitInstallInfo(
        package_name=_optional(first_value(pairs, "package_name")),
        version=_required(pairs, what, "version"),
        inner_version=_optional(first_value(pairs, "innerversion", "inner_version")),
        arch=_optional(first_value(pairs, "arch")),
        os=_optional(first_value(pairs, "os")),
        path=_optional(first_value(pairs, "path")),
        compatible_versions=_flat(_bracket_groups(first_value(pairs, "compatible_version"))),
        raw=pairs,
    )


# ----------------------------------------------------------------------------------------------------------------
# Version ordering
# ----------------------------------------------------------------------------------------------------------------

# A component is (rank, kind, number). Ranks order the kinds found at one position:
#   pre-release build (T/alpha/beta/B) < release candidate (RCn) < number.
# A version is compared as if padded with number 0, so "8.0" == "8.0.0", "X.alpha1" < "X" (= "X.0") < "X.1",
# and "8.0.RC2" < "8.0.0" (RC2 < 0 at the third position).
_PRE, _RC, _NUM = 0, 1, 2
# Order among pre-release labels of the same position (a convention; Huawei does not document one):
# T (test) builds < alpha < beta < B (build) numbers.
_PRE_KINDS = {"t": 0, "alpha": 1, "beta": 2, "b": 3}
_ZERO = (_NUM, 0, 0)
_MAX_COMPONENTS = 32
_NUM_RE = re.compile(r"[0-9]{1,18}")
_RC_RE = re.compile(r"rc([0-9]{1,18})?", re.IGNORECASE)
_PRE_RE = re.compile(r"(t|alpha|beta|b)([0-9]{1,18})?", re.IGNORECASE)

Component = tuple[int, int, int]


def _component(part: str) -> Component | None:
    if _NUM_RE.fullmatch(part):
        return (_NUM, 0, int(part))
    rc = _RC_RE.fullmatch(part)
    if rc:
        return (_RC, 0, int(rc.group(1) or 0))
    pre = _PRE_RE.fullmatch(part)
    if pre:
        return (_PRE, _PRE_KINDS[pre.group(1).lower()], int(pre.group(2) or 0))
    return None


@dataclass(frozen=True, eq=False)
class AscendVersion:
    """An Ascend driver/CANN/firmware version, totally ordered.

    ``8.0.RC1 < 8.0.RC2 < 8.0.0 < 8.1.RC1``; ``23.0.rc2 < 23.0.7 < 24.1.rc1 < 25.0.rc1.1 < 25.2.0``;
    ``8.0.RC3.alpha003 < 8.0.RC3`` and ``23.0.rc2.b090 < 23.0.rc2``. "rc"/"RC" and trailing ``.0`` components do
    not matter for equality (``8.0.rc1 == 8.0.RC1``, ``8.0 == 8.0.0``); ``text`` keeps the original spelling.
    """

    text: str
    components: tuple[Component, ...]  # canonical: no trailing number-0 components

    @property
    def major(self) -> int:
        return self.components[0][2] if self.components else 0

    @property
    def minor(self) -> int:
        return self.components[1][2] if len(self.components) > 1 and self.components[1][0] == _NUM else 0

    @property
    def is_release_candidate(self) -> bool:
        return any(rank == _RC for rank, _, _ in self.components)

    @property
    def is_prerelease(self) -> bool:
        """True for RCs and for T/alpha/beta/B builds: anything ordered before a final release of its line."""
        return any(rank in (_RC, _PRE) for rank, _, _ in self.components)

    def _compare(self, other: AscendVersion) -> int:
        mine, theirs = self.components, other.components
        for i in range(max(len(mine), len(theirs))):
            a = mine[i] if i < len(mine) else _ZERO
            b = theirs[i] if i < len(theirs) else _ZERO
            if a != b:
                return -1 if a < b else 1
        return 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AscendVersion):
            return NotImplemented
        return self.components == other.components

    def __hash__(self) -> int:
        return hash(self.components)

    def __lt__(self, other: AscendVersion) -> bool:
        if not isinstance(other, AscendVersion):
            return NotImplemented
        return self._compare(other) < 0

    def __le__(self, other: AscendVersion) -> bool:
        if not isinstance(other, AscendVersion):
            return NotImplemented
        return self._compare(other) <= 0

    def __gt__(self, other: AscendVersion) -> bool:
        if not isinstance(other, AscendVersion):
            return NotImplemented
        return self._compare(other) > 0

    def __ge__(self, other: AscendVersion) -> bool:
        if not isinstance(other, AscendVersion):
            return NotImplemented
        return self._compare(other) >= 0

    def __str__(self) -> str:
        return self.text


def parse_ascend_version(s: str) -> AscendVersion:
    """Parse ``8.0.RC1``, ``25.0.rc1.1``, ``7.1.0.11.220``, ``8.0.RC3.alpha003``, ``23.0.rc2.b090`` (an optional
    leading ``v`` is allowed). Components are dot-separated: numbers, ``RCn``, or ``T``/``alpha``/``beta``/``B``
    builds; the first must be a number."""
    what = "Ascend version"
    if not isinstance(s, str):
        raise ParseError(what, f"expected text, got {type(s).__name__}")
    text = s.strip()
    if not text:
        raise ParseError(what, "empty version string")
    body = text[1:] if text[:1] in ("v", "V") and text[1:2].isdigit() else text
    parts = body.split(".")
    if len(parts) > _MAX_COMPONENTS:
        raise ParseError(what, f"too many components ({len(parts)}) in {text[:80]!r}")
    components: list[Component] = []
    for part in parts:
        component = _component(part)
        if component is None:
            raise ParseError(what, f"unrecognised component {part[:40]!r} in {text[:80]!r}")
        components.append(component)
    if components[0][0] != _NUM:
        raise ParseError(what, f"{text[:80]!r} does not start with a number")
    while components and components[-1] == _ZERO:
        components.pop()
    return AscendVersion(text=text, components=tuple(components))


# ----------------------------------------------------------------------------------------------------------------
# CANN side files: NNAL/ATB version.info ("Key : Value") and the toolkit's version.cfg (component versions)
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NnalVersionInfo:
    """``/usr/local/Ascend/nnal/atb/latest/version.info`` (fixture nnal-atb-version-info_8.2.RC2_1.txt)."""

    version: str  # "Ascend-cann-atb : 8.2.RC2": the CANN release NNAL must match
    build_version: str | None  # "Ascend-cann-atb Version : 8.2.RC2.B030"
    platform: str | None
    raw: Pairs


def parse_nnal_version_info(text: str) -> NnalVersionInfo:
    what = "NNAL version.info"
    pairs: list[tuple[str, str]] = []
    for line_no, line in content_lines(text, what, errors=_ERRORS, instead_of=_INSTEAD_OF):
        pair = split_pair(line)
        if pair is None:
            raise ParseError(what, "expected a 'Key : Value' line", line_no, line)
        pairs.append(pair)
    raw = tuple(pairs)
    version = _required(raw, what, "Ascend-cann-atb")
    return NnalVersionInfo(
        version=version,
        build_version=_optional(first_value(raw, "Ascend-cann-atb Version")),
        platform=_optional(first_value(raw, "Platform")),
        raw=raw,
    )


@dataclass(frozen=True)
class ToolkitVersionCfg:
    """``ascend-toolkit/latest/version.cfg``: per component, ``<name>_installed_version=[inner:release]``."""

    installed: dict[str, str]  # component -> release, e.g. {"toolkit": "8.2.RC2", "opp_kernel": "8.2.RC2"}
    raw: Pairs


def parse_version_cfg(text: str) -> ToolkitVersionCfg:
    what = "toolkit version.cfg"
    raw = parse_key_value_lines(text, what)
    installed: dict[str, str] = {}
    for key, value in raw:
        if not key.endswith("_installed_version"):
            continue
        # One [inner:release] per installed version: a node with several toolkits lists them all, the newest
        # install last.
        if not re.fullmatch(r"(?:\[\s*[^:\]]*\s*:\s*[^\]]+?\s*\])+", value):
            raise ParseError(what, f"{key} is not [inner:release]", None, None)
        releases = re.findall(r"\[\s*[^:\]]*\s*:\s*([^\]]+?)\s*\]", value)
        installed[key[: -len("_installed_version")]] = releases[-1]
    if not installed:
        raise ParseError(what, "no <component>_installed_version lines")
    return ToolkitVersionCfg(installed=installed, raw=raw)
