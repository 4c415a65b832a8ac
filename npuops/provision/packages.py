"""The packages a provisioning run installs: vendor `.run` files recognised by name, checked against SHA256SUMS.

Pure parts: `classify_package` reads kind, chip, version and architecture from a vendor file name (the patterns and
their real-world variants are those of Huawei's download site and ascend-deployer, e.g. `..._linux-x86-64.run` for
the driver but `..._linux-x86_64.run` for CANN), and `parse_sha256sums`/`render_sha256sums` handle the
`sha256sum` format. `index_packages` writes a manifest; `verify_packages` refuses a directory whose files do not
match theirs, before any host is touched. `missing_wheels` says which pinned requirements a wheelhouse cannot serve
(the hosts install from it with --no-index, so it must hold them all).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError
from npuops.inputfiles import MIB, read_input_text

MANIFEST = "SHA256SUMS"
KINDS = ("driver", "firmware", "toolkit", "kernels", "nnal")

# Architecture spellings: the driver's `linux-x86-64`, CANN's `linux-x86_64`, both `aarch64`.
_ARCH = r"(?:linux-(?P<arch>x86[-_]64|aarch64)|linux)"
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("driver", re.compile(rf"^Ascend-hdk-(?P<chip>[0-9a-z]+)-npu-driver_(?P<version>[^_]+)_{_ARCH}\.run$")),
    ("firmware", re.compile(r"^Ascend-hdk-(?P<chip>[0-9a-z]+)-npu-firmware_(?P<version>[^_]+)\.run$")),
    ("toolkit", re.compile(rf"^Ascend-cann-toolkit_(?P<version>[^_]+)_{_ARCH}\.run$")),
    # <= 8.3 "kernels" (A3: Atlas-A3-cann-kernels), >= 8.5 "ops"; some older kernels files carry no arch.
    ("kernels", re.compile(rf"^Ascend-cann-kernels-(?P<chip>[0-9a-z]+)_(?P<version>[^_]+)_{_ARCH}\.run$")),
    ("kernels", re.compile(rf"^(?P<chip>Atlas-A3)-cann-kernels_(?P<version>[^_]+)_{_ARCH}\.run$")),
    ("kernels", re.compile(rf"^Ascend-cann-(?P<chip>[0-9a-z]+)-ops_(?P<version>[^_]+)_{_ARCH}\.run$")),
    ("nnal", re.compile(rf"^Ascend-cann-nnal_(?P<version>[^_]+)_{_ARCH}\.run$")),
)
# A wheel's file name (PEP 427): distribution-version(-build)?-python-abi-platform.whl.
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-[0-9][^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
# A requirement npuops can match against file names: a bare name or name==version (no extras, markers, wildcards).
_PIN = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(?P<version>[A-Za-z0-9.+!_-]+))?\s*$")
_SUM_LINE = re.compile(r"^(?P<digest>[0-9a-fA-F]{64}) [ *](?P<name>.+)$")


@dataclass(frozen=True)
class PackageFile:
    kind: str
    name: str
    version: str
    arch: str | None  # "x86_64" or "aarch64"; None when the name carries none
    chip: str | None  # "910b", "310p", "Atlas-A3", ...


def classify_package(name: str) -> PackageFile | None:
    """What a vendor file is, from its name alone; None for anything else."""
    for kind, pattern in _PATTERNS:
        match = pattern.match(name)
        if match:
            groups = match.groupdict()
            arch = groups.get("arch")
            return PackageFile(kind, name, groups["version"], arch.replace("-", "_") if arch else None,
                               groups.get("chip"))
    return None


def parse_sha256sums(text: str, what: str = MANIFEST) -> dict[str, str]:
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _SUM_LINE.match(line.rstrip("\n"))
        if not match or "/" in match.group("name"):
            raise BadInputError(f"{what} line {number} is not `<sha256>  <file name>`: {line[:80]!r}",
                                "regenerate it with `npuops packages index DIR`")
        sums[match.group("name")] = match.group("digest").lower()
    return sums


def render_sha256sums(sums: Mapping[str, str]) -> str:
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items()))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise BadInputError(f"cannot read the package {path}: {exc.strerror}",
                            "make it readable by this user (or run as root), or remove it from the directory") from None
    return digest.hexdigest()


def _package_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.is_file() and (p.suffix in (".run", ".whl")))
    except OSError as exc:
        raise BadInputError(f"cannot read the packages directory {directory}: {exc.strerror}",
                            "pass --packages DIR with the vendor .run files (and wheels)") from None


def index_packages(directory: Path) -> dict[str, str]:
    """Write DIR/SHA256SUMS for every .run and .whl in DIR (atomically); returns name -> sha256."""
    sums = {p.name: sha256_file(p) for p in _package_files(directory)}
    if not sums:
        raise BadInputError(f"no .run or .whl files in {directory}", "put the vendor packages there first")
    write_text_atomic(directory / MANIFEST, render_sha256sums(sums), mode=0o644)
    return sums


@dataclass(frozen=True)
class VerifiedPackage:
    file: PackageFile
    path: Path
    sha256: str


@dataclass(frozen=True)
class PackageSet:
    directory: Path
    packages: Mapping[str, VerifiedPackage]  # kind -> package (one per kind)
    wheels: tuple[Path, ...]

    def versions(self) -> dict[str, str]:
        return {kind: p.file.version for kind, p in self.packages.items()}


def verify_packages(directory: Path, *, arch: str | None = None, kinds: Iterable[str] = KINDS) -> PackageSet:
    """Every package in DIR checked against DIR/SHA256SUMS; one package per kind. Refuses (BadInputError) on a
    missing manifest, a file not listed, a checksum that differs, or two packages of one kind."""
    manifest = directory / MANIFEST
    fix = (f"write it with `npuops packages index {directory}` (after checking the files against the vendor's "
           "published checksums)")
    if not manifest.exists() and not manifest.is_symlink():
        raise BadInputError(f"{manifest} is missing", fix)
    sums = parse_sha256sums(read_input_text(manifest, "checksum list", max_bytes=MIB, fix=fix), str(manifest))
    chosen: dict[str, VerifiedPackage] = {}
    wheels = []
    for path in _package_files(directory):
        expected = sums.get(path.name)
        if expected is None:
            raise BadInputError(f"{path.name} is not listed in {manifest}",
                                f"check it and re-run `npuops packages index {directory}`, or remove it")
        actual = sha256_file(path)
        if actual != expected:
            raise BadInputError(f"{path.name} does not match its sha256 in {manifest} "
                                f"(expected {expected[:12]}..., got {actual[:12]}...)",
                                "download it again from the vendor and compare with the published checksum")
        if path.suffix == ".whl":
            wheels.append(path)
            continue
        package = classify_package(path.name)
        if package is None:
            raise BadInputError(f"{path.name} is not a package npuops knows by name",
                                "use the vendor's file names (Ascend-hdk-..., Ascend-cann-...), or remove it")
        if package.kind not in kinds:
            continue
        if arch and package.arch and package.arch != arch:
            continue
        if package.kind in chosen:
            other = chosen[package.kind].file
            if other.arch and package.arch and other.arch != package.arch:
                raise BadInputError(f"{package.kind} packages for {other.arch} and {package.arch} in {directory}",
                                    "say which the hosts need with --arch (provision hosts of one architecture "
                                    "per run, e.g. with --limit)")
            raise BadInputError(f"two {package.kind} packages in {directory}: {chosen[package.kind].path.name} and "
                                f"{path.name}", "keep one version per component in the packages directory")
        chosen[package.kind] = VerifiedPackage(package, path, actual)
    missing_listed = sorted(set(sums) - {p.name for p in _package_files(directory)})
    if missing_listed:
        raise BadInputError(f"{manifest} lists {missing_listed[0]} but the file is missing",
                            f"restore it, or re-run `npuops packages index {directory}`")
    return PackageSet(directory, chosen, tuple(wheels))


# --- wheels ------------------------------------------------------------------------------------------------------

def canonical_name(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): vllm_router, vllm-router and Vllm.Router are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(filename: str) -> tuple[str, str] | None:
    """(canonical name, version) from a wheel's file name; None for a name that is not a wheel's."""
    match = _WHEEL.match(filename)
    return (canonical_name(match.group("name")), match.group("version").lower()) if match else None


def _serves(wheel: tuple[str, str], name: str, version: str | None) -> bool:
    wheel_name, wheel_version = wheel
    if wheel_name != name:
        return False
    # ==2.5.1 also takes a local build (2.5.1+cpu), as pip does; ==2.5.1+cpu only that build.
    return version is None or wheel_version == version or ("+" not in version
                                                             and wheel_version.split("+", 1)[0] == version)


def missing_wheels(requirements: Iterable[str], wheels: Iterable[Path | str]) -> list[str]:
    """The requirements (bare names or name==version) no wheel in the list serves, in their order. A requirement
    npuops cannot match against file names (extras, markers, ranges, a file) is left to pip on the host."""
    served = [d for d in (wheel_distribution(Path(w).name) for w in wheels) if d is not None]
    missing = []
    for requirement in requirements:
        match = _PIN.match(requirement)
        if match is None:
            continue
        name, version = canonical_name(match.group("name")), match.group("version")
        if not any(_serves(wheel, name, version.lower() if version else None) for wheel in served):
            missing.append(requirement.strip())
    return missing


def check_wheelhouse(packages: PackageSet, requirements: Iterable[str]) -> None:
    """Refuse (BadInputError) a packages directory with wheels that lacks one for a requirement: the hosts install
    from the wheelhouse alone (--no-index), so pip would fail there, after the run has started."""
    if not packages.wheels:
        return  # no wheelhouse: the hosts install from the index
    missing = missing_wheels(requirements, packages.wheels)
    if missing:
        directory = packages.directory
        raise BadInputError(
            f"the wheelhouse {directory} has no wheel for {', '.join(missing)} (with wheels in --packages the hosts "
            "install from it alone, with --no-index)",
            f"add them and their dependencies (`pip download -d {directory} {' '.join(missing)}`, for the hosts' "
            f"Python and platform), then run `npuops packages index {directory}`")
