"""Vendor-style Ascend ``.run`` installers, built by the tests themselves (no NPU, no Huawei packages needed).

Each installer is a real makeself archive whose embedded ``install.sh`` behaves like the vendor package of its kind
closely enough for ``npuops provision`` (Ansible roles that run the installers) to be tested end to end: it takes the
vendor's flags, refuses what the vendor refuses, writes the files the vendor package leaves behind -- in the exact
format of the real captures in ``tests/fixtures/ascend`` (a capture is copied and only its version values are
changed) -- and can fail on demand. It is NOT a Huawei script and installs nothing but placeholders.

API
---
``build_installer(kind, version, out_dir, *, arch="x86_64", chip="910b", fail_env=None, hdk_version=None,
file_name=None) -> Path``
    Build ``out_dir/<vendor file name>``. ``kind`` is one of :data:`KINDS`: ``driver``, ``firmware``, ``toolkit``,
    ``kernels`` (CANN <= 8.3), ``ops`` (CANN >= 8.5), ``nnal``. ``version`` is the package's own version (for the
    firmware its firmware version, e.g. ``7.7.0.6.236``). ``fail_env`` names the environment variable that makes
    the installer fail (default ``NPUOPS_TEST_FAIL_<KIND>``). ``hdk_version`` is recorded by the firmware as its
    ``package_version``/``compatible_version_drv`` (default: the capture's values). ``file_name`` overrides the
    vendor name (to test name variants).
``installer_file_name(kind, version, *, arch="x86_64", chip="910b") -> str``
    The vendor file name (as Huawei's download site and ascend-deployer name them):
    ``Ascend-hdk-910b-npu-driver_25.2.0_linux-x86-64.run`` (the driver
    spells x86 ``x86-64``), ``Ascend-hdk-910b-npu-firmware_7.7.0.6.236.run`` (the firmware's own version, no arch),
    ``Ascend-cann-toolkit_8.2.RC1_linux-x86_64.run``, ``Ascend-cann-kernels-910b_8.2.RC1_linux-x86_64.run``,
    ``Ascend-cann-910b-ops_8.5.0_linux-x86_64.run``, ``Ascend-cann-nnal_8.2.RC1_linux-x86_64.run``.
``build_package_set(out_dir, *, driver="25.2.0", firmware="7.7.0.6.236", cann="8.2.RC1", arch="x86_64",
chip="910b") -> dict[Kind, Path]``
    A consistent set: driver + its firmware, toolkit, kernels (or ops from 8.5) and NNAL of one CANN version.
``run_installer(run_file, *args, env=None, stdin="", timeout=60.0) -> subprocess.CompletedProcess[str]``
    Run a ``.run`` in a minimal environment (PATH, HOME, LC_ALL=C, a TMPDIR of its own; plus ``env``), stdout and
    stderr captured.
``sha256_of(path) -> str`` and ``write_sha256sums(directory, *, pattern="*") -> Path``
    The tests' own ``SHA256SUMS`` writer (``<hex>  <name>`` lines, as ``sha256sum`` prints them, sorted by name),
    independent of ``npuops packages index``.
``makeself_available() -> bool``
    Whether ``makeself`` (Debian package ``makeself``) and its header are installed.

The embedded installer
----------------------
Flags (the vendor's per kind; anything else exits 1 naming the flag, with the driver's message
``ERR_NO:0x0004;ERR_DES: Unrecognized parameters: <flag>``):

* driver: ``--full`` / ``--run`` (install), ``--upgrade``, ``--uninstall``; firmware: ``--full``, ``--upgrade``,
  ``--uninstall``; toolkit/kernels/ops: ``--install`` / ``--full``, ``--upgrade``, ``--uninstall``; nnal:
  ``--install``, ``--upgrade``, ``--uninstall``. All: ``--install-for-all``, ``--quiet``, ``--nox11``,
  ``--install-path=DIR`` (relative paths are taken from the caller's directory), ``--version`` (prints the version),
  ``--check``. So the driver refuses ``--install`` like the real one.
* makeself's own options still work before any vendor flag: ``--check`` (checksums), ``--info``, ``--list``,
  ``--noexec``, ``--keep``, ``--target DIR``; the patched header adds ``--extract=DIR`` (extract, do not install) and
  hands ``--quiet``/``--nox11`` on to the script as well, so ``--quiet --full`` and ``--full --quiet`` both reach it.
* Like the real driver (verylucky01/driver ``scripts/package/driver/common/scripts/install.sh``): ``--upgrade``
  together with ``--install-path`` is refused (``install-path param need used with full/run/docker/devel``); without
  ``--install-path`` the driver/firmware install path comes from ``Driver_Install_Path_Param`` of the install record
  (see ``ASCEND_INSTALL_INFO``), else ``/usr/local/Ascend``; a missing parent of the install path is refused; without
  ``--quiet`` it warns ``There is no chip matching the driver package.`` and asks ``[y/n]`` on stdin (``n`` stops
  with rc 0; end of input fails with rc 1 -- the real one would wait forever).
* toolkit/kernels/ops without ``--quiet`` ask to accept the EULA on stdin (modelled; the wording is not the
  vendor's). NNAL does not ask (the real ATB ``install.sh`` does not).

What an install leaves under ``--install-path=P`` (placeholders are empty files, named as the real libraries):

* driver: ``P/driver/version.info`` (capture driver-version-info_25.0.rc1.1_1.txt, ``Version``/``package_version``
  changed), ``P/driver/lib64/driver/libascend_hal.so`` (placeholder), ``P/driver/lib64/common/``,
  ``P/driver/tools/``.
* firmware: ``P/firmware/version.info`` (capture firmware-version-info_doc_1.txt).
* toolkit <= 8.3: ``P/ascend-toolkit/<ver>/<arch>-linux/ascend_toolkit_install.info`` (capture
  ascend_toolkit_install-info_x86_1.txt or _aarch64_3.txt), ``P/ascend-toolkit/<ver>/version.cfg`` (capture
  ascend-toolkit-version-cfg_8.2.RC2_1.txt without its ``opp_kernel`` lines), placeholder ``lib64/libascendcl.so``,
  ``P/ascend-toolkit/latest -> <ver>`` and ``P/ascend-toolkit/set_env.sh``. Real CANN >= 7 makes ``latest/`` a
  directory of per-component links (with its own version.cfg); a single link reads the same through ``latest/``.
* toolkit >= 8.5: ``P/cann-<ver>/<arch>-linux/ascend_toolkit_install.info`` (capture
  ascend_toolkit_install-info_doc_1.txt, whose ``path=`` is ``/usr/local/Ascend/cann-8.5.0/...``),
  ``P/cann-<ver>/set_env.sh`` and ``P/cann -> cann-<ver>``.
* kernels (<= 8.3): the ``opp_kernel_{running,upgrade,installed}_version`` lines in the toolkit's version.cfg --
  where the real kernels package records itself (the toolkit-only version.cfg has no such lines, the one after
  the kernels package has them) -- plus ``<ver>/opp_kernel/`` and a placeholder kernel dir under ``<ver>/opp/``.
* ops (>= 8.5): ``P/cann-<ver>/<arch>-linux/ascend_ops_install.info`` (no capture of this file was found: it is
  the toolkit info capture with ``package_name=Ascend-cann-<chip>-ops``; public records show these keys), plus a
  placeholder kernel dir under ``opp/``.
* nnal: ``P/nnal/atb/<ver>/version.info`` (capture nnal-atb-version-info_8.2.RC2_1.txt),
  ``P/nnal/atb/<ver>/atb/cxx_abi_{0,1}/lib/libatb.so`` (placeholders), ``P/nnal/atb/<ver>/atb/set_env.sh``,
  ``P/nnal/atb/latest -> <ver>`` and ``P/nnal/atb/set_env.sh`` (sources ``latest/atb/set_env.sh``).

Order and upgrade rules: kernels/ops refuse without a toolkit of the same version under P; NNAL refuses unless the
toolkit's environment is set (``ASCEND_HOME_PATH`` and ``ASCEND_TOOLKIT_HOME``: source the toolkit's set_env.sh
first), with the messages of the real ATB ``install.sh``. Installing another toolkit/NNAL version keeps both version
directories and repoints ``latest`` (``cann``); ``--upgrade`` removes the version ``latest`` pointed to and needs an
existing install; ``--uninstall`` removes this package's version and repoints or removes the link; the driver's
``--upgrade``/``--full`` replace ``P/driver``; kernels/ops ``--upgrade`` installs like ``--install`` (onto the
same-version toolkit). Reinstalling a toolkit version replaces its directory (kernels inside it included).

Environment variables read by the installer:

* ``NPUOPS_TEST_FAIL_<KIND>`` (or the ``fail_env`` name): when set and not ``0``, the install copies its files but
  not its version/info files, prints an ``[ERROR]... install failed`` line and exits 1 -- a partial install.
* ``ASCEND_INSTALL_INFO``: the file playing ``/etc/ascend_install.info``; the driver sets ``Driver_Install_Path_Param``
  (and UserName, UserGroup, Driver_Install_Type, Driver_Install_For_All, Driver_Install_Mode), the firmware
  ``Firmware_Install_Path_Param``/``Firmware_Install_Type``, uninstall removes them. Unset: no record is written.
* ``NPUOPS_TEST_ASCEND_LOG_DIR``: the directory playing ``/var/log/ascend_seclog``; each installer appends to its log
  there (driver and firmware ``ascend_install.log`` as the real driver does, toolkit ``ascend_toolkit_install.log``
  as the vendor documents, kernels/ops/nnal ``ascend_<pkg>_install.log``). Unset: no log.
* ``NPUOPS_TEST_ALLOW_REAL_PATHS=1``: without it the installer refuses to write ``/usr/local/Ascend``,
  ``/etc/ascend_install.info`` or ``/var/log/ascend_seclog`` (the default install path included), so a test that
  forgets ``--install-path`` cannot touch the machine. Set it only inside a throwaway root (overlay, namespace).

Sources: the driver's flag handling, messages and install record come from verylucky01/driver (Huawei's open driver
packaging scripts, ``scripts/package/driver/common/scripts/install.sh``); the NNAL checks, layout, ``latest`` link and
``set_env.sh`` placement from hicann/ascend-transformer-boost ``scripts/install.sh``; the toolkit message format
(``[Toolkit] [YYYYMMDD-HH:MM:SS] [INFO] ...``) from the installer output quoted in PaddlePaddle/PaddleCustomDevice
PR #291; the install log and info paths from the CANN installation guide "File Paths" page
(hiascend.com .../canncommercial/800|850/softwareinst/instg/instg_0044.html). The set_env.sh sources are cited next to
their templates below.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, get_args

__all__ = [
    "ALLOW_REAL_PATHS_ENV",
    "INSTALL_INFO_ENV",
    "KINDS",
    "LOG_DIR_ENV",
    "Kind",
    "build_installer",
    "build_package_set",
    "default_fail_env",
    "installer_file_name",
    "makeself_available",
    "run_installer",
    "sha256_of",
    "uses_cann_layout",
    "write_sha256sums",
]

Kind = Literal["driver", "firmware", "toolkit", "kernels", "ops", "nnal"]
KINDS: tuple[Kind, ...] = get_args(Kind)

INSTALL_INFO_ENV = "ASCEND_INSTALL_INFO"
LOG_DIR_ENV = "NPUOPS_TEST_ASCEND_LOG_DIR"
ALLOW_REAL_PATHS_ENV = "NPUOPS_TEST_ALLOW_REAL_PATHS"

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ascend"
STOCK_HEADER = Path("/usr/share/makeself/makeself-header.sh")
INSTALL_PATH_TOKEN = "@INSTALL_PATH@"

_ARCHES = ("x86_64", "aarch64")
_VERSION_RE = re.compile(r"[0-9][0-9A-Za-z.\-]*")
_CHIP_RE = re.compile(r"[0-9a-z][0-9a-z_]*")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]*")

# Inner versions seen in real captures, by CANN release (ascend_toolkit_install.info `innerversion=`). Other
# releases keep the capture's inner version: npuops reads the release, not this.
_TOOLKIT_INNER = {
    "8.0.0": "V100R001C20SPC001B251",  # ascend_toolkit_install-info_1.txt
    "8.2.RC1": "V100R001C22SPC001B231",  # ascend_toolkit_install-info_2.txt
    "8.3.RC1": "V100R001C23SPC002B201",  # ascend_toolkit_install-info_aarch64_3.txt
    "8.3.RC2": "V100R001C23SPC002B210",  # ascend_toolkit_install-info_x86_1.txt
    "8.5.0": "V100R001C25SPC001B212",  # ascend_toolkit_install-info_doc_1.txt
}
# The `[inner:release]` inner part of version.cfg, where a real one was seen; others keep the capture's.
_VERSION_CFG_INNER = {
    "8.0.0": "7.6.0.1.220",  # vllm-project/vllm-ascend#451
    "8.2.RC2": "8.2.0.2.220",  # ascend-toolkit-version-cfg_8.2.RC2_1.txt
}

# How each kind talks: message prefix and time format (see the module docstring for the sources).
_STYLE: dict[Kind, tuple[str, str]] = {
    "driver": ("Driver", "hdk"),
    "firmware": ("Firmware", "hdk"),
    "toolkit": ("Toolkit", "cann"),
    "kernels": ("Kernels", "cann"),
    "ops": ("Ops", "cann"),
    "nnal": ("NNAL", "cann"),
}
_LOG_NAME: dict[Kind, str] = {
    "driver": "ascend_install.log",
    "firmware": "ascend_install.log",
    "toolkit": "ascend_toolkit_install.log",
    "kernels": "ascend_kernels_install.log",
    "ops": "ascend_ops_install.log",
    "nnal": "ascend_nnal_install.log",
}
_INSTALL_FLAGS: dict[Kind, str] = {
    "driver": "--full --run",
    "firmware": "--full",
    "toolkit": "--install --full",
    "kernels": "--install --full",
    "ops": "--install --full",
    "nnal": "--install",
}


# ----------------------------------------------------------------------------------------------------------------
# Names and versions
# ----------------------------------------------------------------------------------------------------------------


def uses_cann_layout(cann_version: str) -> bool:
    """True from CANN 8.5 on (``<path>/cann/`` layout, ``ops`` package), False up to 8.3 (``ascend-toolkit/``)."""
    match = re.match(r"(\d+)\.(\d+)", cann_version)
    if not match:
        raise ValueError(f"not a CANN version: {cann_version!r}")
    return (int(match.group(1)), int(match.group(2))) >= (8, 5)


def default_fail_env(kind: Kind) -> str:
    return f"NPUOPS_TEST_FAIL_{kind.upper()}"


def installer_file_name(kind: Kind, version: str, *, arch: str = "x86_64", chip: str = "910b") -> str:
    """The vendor's file name for this package (as Huawei's download site names it)."""
    _check_common(kind, version, arch, chip)
    cann_arch = f"linux-{arch}"
    if kind == "driver":
        driver_arch = "linux-x86-64" if arch == "x86_64" else "linux-aarch64"
        return f"Ascend-hdk-{chip}-npu-driver_{version}_{driver_arch}.run"
    if kind == "firmware":
        return f"Ascend-hdk-{chip}-npu-firmware_{version}.run"
    if kind == "toolkit":
        return f"Ascend-cann-toolkit_{version}_{cann_arch}.run"
    if kind == "kernels":
        return f"Ascend-cann-kernels-{chip}_{version}_{cann_arch}.run"
    if kind == "ops":
        return f"Ascend-cann-{chip}-ops_{version}_{cann_arch}.run"
    return f"Ascend-cann-nnal_{version}_{cann_arch}.run"


def _check_common(kind: str, version: str, arch: str, chip: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown package kind {kind!r}; use one of {', '.join(KINDS)}")
    if not _VERSION_RE.fullmatch(version):
        raise ValueError(f"not a package version: {version!r}")
    if arch not in _ARCHES:
        raise ValueError(f"unknown architecture {arch!r}; use one of {', '.join(_ARCHES)}")
    if not _CHIP_RE.fullmatch(chip):
        raise ValueError(f"not a chip name: {chip!r}")
    if kind == "kernels" and uses_cann_layout(version):
        raise ValueError(f"CANN {version} ships an `ops` package, not `kernels` (kernels is CANN <= 8.3)")
    if kind == "ops" and not uses_cann_layout(version):
        raise ValueError(f"CANN {version} ships a `kernels` package, not `ops` (ops is CANN >= 8.5)")


# ----------------------------------------------------------------------------------------------------------------
# The files a package writes, copied from the real captures
# ----------------------------------------------------------------------------------------------------------------


def _capture(name: str) -> str:
    """A capture from tests/fixtures/ascend without its `# source:` line."""
    first, _, rest = (FIXTURES / name).read_text(encoding="utf-8").partition("\n")
    if not first.startswith("# source:"):
        raise RuntimeError(f"capture {name} lacks its source line")
    return rest


def _set_key(text: str, key: str, value: str, sep: str = "=") -> str:
    """Replace the value of one existing ``key<sep>value`` line (exactly one must exist)."""
    pattern = re.compile(rf"(?m)^(\s*{re.escape(key)}{re.escape(sep)}).*$")
    new, count = pattern.subn(lambda m: m.group(1) + value, text)
    if count != 1:
        raise RuntimeError(f"expected one {key!r} line in the capture, found {count}")
    return new


def _driver_version_info(version: str) -> str:
    # Capture driver-version-info_25.0.rc1.1_1.txt; only Version and package_version change.
    text = _capture("driver-version-info_25.0.rc1.1_1.txt")
    text = _set_key(text, "Version", version)
    return _set_key(text, "package_version", version)


def _firmware_version_info(version: str, hdk_version: str | None) -> str:
    # Capture firmware-version-info_doc_1.txt; Version, and with an HDK version its package_version and the
    # driver range (one `[X,X.]` group, the capture's form), change.
    text = _set_key(_capture("firmware-version-info_doc_1.txt"), "Version", version)
    if hdk_version is not None:
        text = _set_key(text, "package_version", hdk_version)
        text = _set_key(text, "compatible_version_drv", f"[{hdk_version},{hdk_version}.]")
    return text


def _toolkit_install_info(version: str, arch: str, *, package_name: str | None = None) -> str:
    """ascend_toolkit_install.info (and, with package_name, the >= 8.5 ops info of the same shape)."""
    if uses_cann_layout(version):
        text = _capture("ascend_toolkit_install-info_doc_1.txt")  # CANN 8.5.0 "cann" layout
        path = f"{INSTALL_PATH_TOKEN}/cann-{version}/{arch}-linux"
    else:
        text = _capture("ascend_toolkit_install-info_x86_1.txt" if arch == "x86_64"
                        else "ascend_toolkit_install-info_aarch64_3.txt")
        path = f"{INSTALL_PATH_TOKEN}/ascend-toolkit/{version}/{arch}-linux"
    if package_name is not None:
        text = _set_key(text, "package_name", package_name)
    text = _set_key(text, "version", version)
    if version in _TOOLKIT_INNER:
        text = _set_key(text, "innerversion", _TOOLKIT_INNER[version])
    text = _set_key(text, "arch", arch)
    return _set_key(text, "path", path)


def _version_cfg(version: str, *, with_kernels: bool) -> str:
    # Capture ascend-toolkit-version-cfg_8.2.RC2_1.txt (toolkit + kernels installed). The toolkit alone writes it
    # without the opp_kernel lines (a toolkit-only 8.0.0 version.cfg published with `cat .../latest/version.cfg`
    # has none, GitHub code index file id 65941102474); the kernels package adds them (vllm-ascend#451 shows the
    # same 8.0.0 file with them).
    text = _capture("ascend-toolkit-version-cfg_8.2.RC2_1.txt")
    inner = _VERSION_CFG_INNER.get(version)
    text = re.sub(r"\[([^\]:]*):([^\]]*)\]", lambda m: f"[{inner or m.group(1)}:{version}]", text)
    if not with_kernels:
        text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("opp_kernel_"))
    return text


def _nnal_version_info(version: str, arch: str) -> str:
    # Capture nnal-atb-version-info_8.2.RC2_1.txt (`Key : Value`, 4-space indent); the release, the build
    # version (the capture's build suffix kept) and the platform change.
    text = _capture("nnal-atb-version-info_8.2.RC2_1.txt")
    build = re.search(r"(?m)^\s*Ascend-cann-atb Version : \S+?(\.B\d+)\s*$", text)
    suffix = build.group(1) if build else ""
    text = _set_key(text, "Ascend-cann-atb", version, sep=" : ")
    text = _set_key(text, "Ascend-cann-atb Version", version + suffix, sep=" : ")
    return _set_key(text, "Platform", arch, sep=" : ")


# The toolkit's set_env.sh up to CANN 8.3, with /usr/local/Ascend replaced by the install path. The lines are the
# vendor's as published with `cat /usr/local/Ascend/ascend-toolkit/set_env.sh` (CANN 8.0.0; GitHub code index file
# id 65941102474, repository not resolvable with the available tools; the same lines appear in the env dump of
# vllm-project/vllm-ascend#4744 and in the list of variables the toolkit installer prints, PaddlePaddle/
# PaddleCustomDevice#291).
_TOOLKIT_SET_ENV = """\
export LD_LIBRARY_PATH={P}/driver/lib64:{P}/driver/lib64/common:{P}/driver/lib64/driver:$LD_LIBRARY_PATH
export ASCEND_TOOLKIT_HOME={HOME}
export LD_LIBRARY_PATH=${{ASCEND_TOOLKIT_HOME}}/lib64:${{ASCEND_TOOLKIT_HOME}}/lib64/plugin/opskernel:\
${{ASCEND_TOOLKIT_HOME}}/lib64/plugin/nnengine:\
${{ASCEND_TOOLKIT_HOME}}/opp/built-in/op_impl/ai_core/tbe/op_tiling/lib/linux/$(arch):$LD_LIBRARY_PATH
export LD_LIBRARY_PATH=${{ASCEND_TOOLKIT_HOME}}/tools/aml/lib64:${{ASCEND_TOOLKIT_HOME}}/tools/aml/lib64/plugin:\
$LD_LIBRARY_PATH
export PYTHONPATH=${{ASCEND_TOOLKIT_HOME}}/python/site-packages:\
${{ASCEND_TOOLKIT_HOME}}/opp/built-in/op_impl/ai_core/tbe:$PYTHONPATH
export PATH=${{ASCEND_TOOLKIT_HOME}}/bin:${{ASCEND_TOOLKIT_HOME}}/compiler/ccec_compiler/bin:\
${{ASCEND_TOOLKIT_HOME}}/tools/ccec_compiler/bin:$PATH
export ASCEND_AICPU_PATH=${{ASCEND_TOOLKIT_HOME}}
export ASCEND_OPP_PATH=${{ASCEND_TOOLKIT_HOME}}/opp
export TOOLCHAIN_HOME=${{ASCEND_TOOLKIT_HOME}}/toolkit
export ASCEND_HOME_PATH=${{ASCEND_TOOLKIT_HOME}}
"""

# The inner ATB set_env.sh (<nnal>/atb/<ver>/atb/set_env.sh): the logic of the real one (the NNAL/ATB set_env.sh of
# hicann/ascend-transformer-boost, CANN Open Software License 2.0 edition; GitHub code index file id 27604453922):
# ATB_HOME_PATH is the script's directory + cxx_abi_<0|1>, chosen by --cxx_abi= or by the installed torch's ABI.
# vllm-project/vllm-ascend#4744 shows the result: ATB_HOME_PATH=/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1.
_ATB_SET_ENV = r"""#!/bin/bash
# npuops test double of the NNAL/ATB set_env.sh (see tests/support/vendor_installers.py).
function get_cxx_abi_option()
{
    cxx_abi=""
    until [[ -z "$1" ]]
    do {
        case "$1" in
        "--cxx_abi=1")
            cxx_abi=1
            ;;
        "--cxx_abi=0")
            cxx_abi=0
            ;;
        esac
        shift
    }
    done
    if [[ "$cxx_abi" == "" ]]; then
        res=$(python3 -c "import torch" &> /dev/null || echo "torch_not_exist")
        if [[ "$res" == "torch_not_exist" ]]; then
            cxx_abi=1
        else
            if [[ $(python3 -c 'import torch; print(torch.compiled_with_cxx11_abi())') == "True" ]]; then
                cxx_abi=1
            else
                cxx_abi=0
            fi
        fi
    fi
}

set_env_path="${BASH_SOURCE[0]}"
if [[ -n "$ZSH_VERSION" ]]; then
    set_env_path="$0"
fi

if [[ -f "$set_env_path" ]] && [[ "$set_env_path" =~ (^|/)set_env\.sh$ ]];then
    atb_path=$(cd $(dirname $set_env_path); pwd)
    get_cxx_abi_option "$@"
    export ATB_HOME_PATH="${atb_path}/cxx_abi_${cxx_abi}"
    export LD_LIBRARY_PATH=$ATB_HOME_PATH/lib:$ATB_HOME_PATH/examples:$ATB_HOME_PATH/tests/atbopstest:$LD_LIBRARY_PATH
    export PATH=$ATB_HOME_PATH/bin:$PATH
    export ATB_STREAM_SYNC_EVERY_KERNEL_ENABLE=0
    export ATB_STREAM_SYNC_EVERY_RUNNER_ENABLE=0
    export ATB_STREAM_SYNC_EVERY_OPERATION_ENABLE=0
    export ATB_OPSRUNNER_KERNEL_CACHE_LOCAL_COUNT=1
    export ATB_OPSRUNNER_KERNEL_CACHE_GLOABL_COUNT=5
    export ATB_WORKSPACE_MEM_ALLOC_ALG_TYPE=1
    export ATB_COMPARE_TILING_EVERY_KERNEL=0
    export ATB_SHARE_MEMORY_NAME_SUFFIX=""
    export ATB_MATMUL_SHUFFLE_K_ENABLE=1
    export LCCL_DETERMINISTIC=0
    export LCCL_PARALLEL=0
else
    echo "There is no 'set_env.sh' to import"
fi
"""

# <nnal>/atb/set_env.sh: the ATB installer moves the package's top-level set_env.sh there (ascend-transformer-boost
# scripts/install.sh, install_to_path). Its content is not published; this one hands over to latest/atb/set_env.sh,
# which gives the ATB_HOME_PATH seen in vllm-ascend#4744.
_NNAL_SET_ENV = f"""\
#!/bin/bash
# npuops test double of <install path>/nnal/atb/set_env.sh (see tests/support/vendor_installers.py).
_npuops_atb_set_env="{INSTALL_PATH_TOKEN}/nnal/atb/latest/atb/set_env.sh"
if [ -f "$_npuops_atb_set_env" ]; then
    . "$_npuops_atb_set_env" "$@"
fi
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _placeholder(path: Path) -> None:
    """An empty file standing for a vendor binary (a placeholder: nothing loads it)."""
    _write(path, "")


def _render_payload(kind: Kind, version: str, arch: str, chip: str, hdk_version: str | None, root: Path) -> None:
    """The package's files: data/ is copied as is, info/ (version and info files, set_env.sh) is rendered with the
    install path and written last, so a failed install leaves data/ without info/."""
    data, info = root / "data", root / "info"
    data.mkdir(parents=True)
    info.mkdir(parents=True)
    kernel_dir = f"opp/built-in/op_impl/ai_core/tbe/kernel/ascend{chip}"
    if kind == "driver":
        _placeholder(data / "driver/lib64/driver/libascend_hal.so")
        (data / "driver/lib64/common").mkdir(parents=True)
        (data / "driver/tools").mkdir(parents=True)
        _write(info / "driver/version.info", _driver_version_info(version))
    elif kind == "firmware":
        (data / "firmware").mkdir(parents=True)
        _write(info / "firmware/version.info", _firmware_version_info(version, hdk_version))
    elif kind == "toolkit":
        if uses_cann_layout(version):
            top = f"cann-{version}"
            home = f"{INSTALL_PATH_TOKEN}/{top}"
            # Modelled on the <= 8.3 script: no published copy of the >= 8.5 cann/set_env.sh was found; an env dump
            # of a CANN 9.0.0 node shows ASCEND_TOOLKIT_HOME=ASCEND_HOME_PATH=/usr/local/Ascend/cann-9.0.0.
            set_env_rel = f"{top}/set_env.sh"
        else:
            top = f"ascend-toolkit/{version}"
            home = f"{INSTALL_PATH_TOKEN}/ascend-toolkit/latest"
            set_env_rel = "ascend-toolkit/set_env.sh"
        vdir = data / top
        _placeholder(vdir / f"{arch}-linux/lib64/libascendcl.so")
        (vdir / f"{arch}-linux/bin").mkdir(parents=True)
        (vdir / "lib64").symlink_to(f"{arch}-linux/lib64")
        (vdir / "bin").symlink_to(f"{arch}-linux/bin")
        (vdir / "opp/built-in/op_impl/ai_core/tbe").mkdir(parents=True)
        (vdir / "python/site-packages").mkdir(parents=True)
        _write(info / f"{top}/{arch}-linux/ascend_toolkit_install.info", _toolkit_install_info(version, arch))
        if not uses_cann_layout(version):
            _write(info / f"{top}/version.cfg", _version_cfg(version, with_kernels=False))
        _write(info / set_env_rel, _TOOLKIT_SET_ENV.format(P=INSTALL_PATH_TOKEN, HOME=home))
    elif kind == "kernels":
        vdir = data / f"ascend-toolkit/{version}"
        _placeholder(vdir / kernel_dir / ".npuops-placeholder")
        (vdir / "opp_kernel").mkdir(parents=True)
        _write(info / f"ascend-toolkit/{version}/version.cfg", _version_cfg(version, with_kernels=True))
    elif kind == "ops":
        vdir = data / f"cann-{version}"
        _placeholder(vdir / kernel_dir / ".npuops-placeholder")
        _write(info / f"cann-{version}/{arch}-linux/ascend_ops_install.info",
               _toolkit_install_info(version, arch, package_name=f"Ascend-cann-{chip}-ops"))
    else:  # nnal
        vdir = data / f"nnal/atb/{version}"
        for abi in ("cxx_abi_0", "cxx_abi_1"):
            _placeholder(vdir / f"atb/{abi}/lib/libatb.so")
        _write(info / f"nnal/atb/{version}/version.info", _nnal_version_info(version, arch))
        _write(info / f"nnal/atb/{version}/atb/set_env.sh", _ATB_SET_ENV)
        _write(info / "nnal/atb/set_env.sh", _NNAL_SET_ENV)


# ----------------------------------------------------------------------------------------------------------------
# The embedded install script
# ----------------------------------------------------------------------------------------------------------------

_INSTALL_SH = r"""#!/bin/bash
# npuops test double of an Ascend vendor installer (tests/support/vendor_installers.py). NOT a Huawei script:
# it installs placeholders and the version/info files npuops reads. See the module docstring for what it models.
set -u
PKG_DIR=$(cd "$(dirname "$0")" && pwd)
. "$PKG_DIR/package.conf"

LOG_FILE=""
ts() { if [ "$TS_STYLE" = cann ]; then date +%Y%m%d-%H:%M:%S; else date +"%Y-%m-%d %H:%M:%S"; fi; }
line() {
    if [ "$TS_STYLE" = hdk ]; then printf '[%s] [%s] [%s]%s\n' "$PREFIX" "$(ts)" "$1" "$2"
    else printf '[%s] [%s] [%s] %s\n' "$PREFIX" "$(ts)" "$1" "$2"; fi
}
log() { if [ -n "$LOG_FILE" ]; then line "$1" "$2" >> "$LOG_FILE"; fi; return 0; }
say() { line "$1" "$2"; log "$1" "$2"; }
die() { say ERROR "$1"; exit 1; }

is_real_path() {
    case "$1" in
        /|/usr/local/Ascend|/usr/local/Ascend/*|/etc/ascend_install.info) return 0 ;;
        /var/log/ascend_seclog|/var/log/ascend_seclog/*) return 0 ;;
    esac
    return 1
}
guard() {
    if is_real_path "$1" && [ "${NPUOPS_TEST_ALLOW_REAL_PATHS:-}" != 1 ]; then
        die "this is an npuops test installer: it refuses to write $2 $1 on this machine; pass"\
" --install-path=<temp dir> (and point ASCEND_INSTALL_INFO / NPUOPS_TEST_ASCEND_LOG_DIR into it),"\
" or set NPUOPS_TEST_ALLOW_REAL_PATHS=1 inside a throwaway root"
    fi
}
in_words() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }
abs_path() { case "$1" in /*) realpath -m -- "$1" ;; *) realpath -m -- "${USER_PWD:-$PWD}/$1" ;; esac; }

# --- arguments -------------------------------------------------------------------------------------------------
if [ $# -eq 0 ]; then
    die "ERR_NO:0x0004;ERR_DES: Unrecognized parameters. Try './xxx.run --help' for more information."
fi
RUN_ARGS="$*"
mode=""; quiet=n; for_all=n; install_path=""; path_given=n; want_version=n; want_check=n
set_mode() {
    if [ -n "$mode" ] && [ "$mode" != "$1" ]; then
        die "ERR_NO:0x0004;ERR_DES:only support one operation:"\
" ${INSTALL_FLAGS// //}/--upgrade/--uninstall, operation failed!"
    fi
    mode=$1
}
for arg in "$@"; do
    case "$arg" in
        --upgrade) set_mode upgrade ;;
        --uninstall) set_mode uninstall ;;
        --install-for-all) for_all=y ;;
        --quiet) quiet=y ;;
        --nox11) ;;
        --install-path=*)
            install_path=${arg#--install-path=}; path_given=y
            [ -n "$install_path" ] || die "ERR_NO:0x0003;ERR_DES:install path is null, install failed" ;;
        --version) want_version=y ;;
        --check) want_check=y ;;
        *)
            if in_words "$arg" "$INSTALL_FLAGS"; then
                set_mode install
            else
                die "ERR_NO:0x0004;ERR_DES: Unrecognized parameters: ${arg}."\
" Try './xxx.run --help' for more information."
            fi ;;
    esac
done
if [ "$want_version" = y ] || [ "$want_check" = y ]; then
    if [ -n "$mode" ] || { [ "$want_version" = y ] && [ "$want_check" = y ]; }; then
        die "ERR_NO:0x0004;ERR_DES:version/uninstall/check can't use with other parameters."
    fi
    if [ "$want_version" = y ]; then echo "$VERSION"; exit 0; fi
    say INFO "$PKG_NAME $VERSION: package check success"
    exit 0
fi
[ -n "$mode" ] || die "ERR_NO:0x0004;ERR_DES:param need used with ${INSTALL_FLAGS// //}/--upgrade/--uninstall."

# --- where --------------------------------------------------------------------------------------------------------
INSTALL_INFO="${ASCEND_INSTALL_INFO:-}"
if [ -n "$INSTALL_INFO" ]; then INSTALL_INFO=$(abs_path "$INSTALL_INFO"); guard "$INSTALL_INFO" "the install record"; fi
get_param() {
    if [ -n "$INSTALL_INFO" ] && [ -f "$INSTALL_INFO" ]; then
        grep "^$1=" "$INSTALL_INFO" | tail -n 1 | cut -d"=" -f2-
    fi
}
set_param() {
    [ -n "$INSTALL_INFO" ] || return 0
    mkdir -p "$(dirname "$INSTALL_INFO")" && touch "$INSTALL_INFO"
    sed -i "/^$1=/d" "$INSTALL_INFO" && echo "$1=$2" >> "$INSTALL_INFO"
}
del_params() {
    [ -n "$INSTALL_INFO" ] && [ -f "$INSTALL_INFO" ] || return 0
    for key in "$@"; do sed -i "/^$key=/d" "$INSTALL_INFO"; done
    grep -q -i "Install_Path_Param" "$INSTALL_INFO" || rm -f "$INSTALL_INFO"
}

IS_HDK=n; case "$KIND" in driver|firmware) IS_HDK=y ;; esac
if [ "$IS_HDK" = y ] && [ "$mode" = upgrade ] && [ "$path_given" = y ]; then
    die "ERR_NO:0x0004;ERR_DES:install-path param need used with full/run/docker/devel."
fi
if [ "$path_given" = y ]; then
    install_path=$(abs_path "$install_path")
elif [ "$IS_HDK" = y ]; then
    recorded=""
    [ "$KIND" = firmware ] && recorded=$(get_param Firmware_Install_Path_Param)
    [ -n "$recorded" ] || recorded=$(get_param Driver_Install_Path_Param)
    install_path=$(abs_path "${recorded:-/usr/local/Ascend}")
else
    install_path=/usr/local/Ascend
fi
guard "$install_path" "into"

if [ -n "${NPUOPS_TEST_ASCEND_LOG_DIR:-}" ]; then
    log_dir=$(abs_path "$NPUOPS_TEST_ASCEND_LOG_DIR")
    guard "$log_dir" "the install log into"
    mkdir -p "$log_dir" && LOG_FILE="$log_dir/$LOG_NAME"
fi
log INFO "UserCommand: $RUN_NAME $RUN_ARGS"
log INFO "install path: $install_path"

# --- common steps --------------------------------------------------------------------------------------------------
should_fail() { eval "_fail=\${$FAIL_ENV:-}"; [ -n "$_fail" ] && [ "$_fail" != 0 ]; }
ask_yes_no() {
    while :; do
        if ! read -r yn; then
            die "ERR_NO:0x0002;ERR_DES:no answer on stdin; pass --quiet (the real installer would wait here)"
        fi
        case "$yn" in
            y|Y) return 0 ;;
            n|N) say INFO "Stop installation!"; exit 0 ;;
            *) say ERROR "ERR_NO:0x0002;ERR_DES:input error, please input again!" ;;
        esac
    done
}
accept_eula() {
    [ "$quiet" = y ] && return 0
    say INFO "Do you accept the EULA to $mode this package ($PKG_NAME $VERSION)? [y/n]"
    ask_yes_no
}
render() {  # template destination: the file with the install path filled in
    mkdir -p "$(dirname "$2")"
    content=$(cat "$1"; printf x); content=${content%x}
    printf '%s' "${content//@INSTALL_PATH@/"$install_path"}" > "$2"
}
copy_data() {
    mkdir -p "$install_path"
    cp -a "$PKG_DIR/payload/data/." "$install_path/" || die "copy files into $install_path failed"
}
copy_info() {
    (cd "$PKG_DIR/payload/info" && find . -type f) | while IFS= read -r rel; do
        rel=${rel#./}
        render "$PKG_DIR/payload/info/$rel" "$install_path/$rel"
    done
}
fail_now() {  # the on-demand failure: data copied, info files not written
    log ERROR "$FAIL_ENV is set: simulating a failed installation"
    die "$PKG_NAME $mode failed ($FAIL_ENV is set), details in : ${LOG_FILE:-<no log>}"
}
link_to() {  # link target: point a version link (latest, cann) at a version directory
    if [ -d "$1" ] && [ ! -L "$1" ]; then die "softlink existed dir $1!"; fi
    ln -sfn "$2" "$1"
}
relink_highest() {  # link dir prefix: after an uninstall, point the link at the highest remaining version
    local best
    best=$(cd "$2" 2>/dev/null && ls -1 | grep "^$3" | grep -v -x -e latest -e set_env.sh -e cann | sort -V | tail -n 1)
    if [ -n "$best" ]; then link_to "$1" "$best"; else rm -f "$1"; fi
}

check_parent() {  # the driver/firmware create one directory level at most
    local parent; parent=$(dirname "$install_path")
    if [ ! -d "$install_path" ] && [ ! -d "$parent" ]; then
        die "ERR_NO:0x0003;ERR_DES:install path $parent not exists,runpackage only support create one level of"\
" directory,need create $parent."
    fi
}

# --- the kinds -----------------------------------------------------------------------------------------------------
do_driver() {
    local dir="$install_path/driver"
    if [ "$mode" = uninstall ]; then
        [ -d "$dir" ] || die "ERR_NO:0x0090;ERR_DES:uninstall driver failed, no driver in $install_path"
        rm -rf "$dir"
        del_params Driver_Install_Path_Param Driver_Install_Type Driver_Install_Mode Driver_Install_For_All
        say INFO "Driver package uninstalled successfully! Reboot needed for uninstallation to take effect!"; return
    fi
    if [ "$mode" = upgrade ] && [ ! -f "$dir/version.info" ]; then
        die "Upgrade failed, the driver is not installed in $install_path."
    fi
    check_parent
    say WARNING "There is no chip matching the driver package."
    if [ "$quiet" = n ]; then
        say INFO "You are going to install a driver package which does not have a matching chip in the"\
" environment, do you want to continue? [y/n]"
        ask_yes_no
    fi
    rm -rf "$dir"; copy_data
    should_fail && fail_now
    copy_info
    set_param UserName HwHiAiUser; set_param UserGroup HwHiAiUser
    set_param Driver_Install_Type full; set_param Driver_Install_Path_Param "$install_path"
    set_param Driver_Install_For_All "$([ "$for_all" = y ] && echo yes || echo no)"
    set_param Driver_Install_Mode normal
    local done_word=installed; [ "$mode" = upgrade ] && done_word=upgraded
    say INFO "Driver package $done_word successfully! Reboot needed for installation/upgrade to take effect!"
}

do_firmware() {
    local dir="$install_path/firmware"
    if [ "$mode" = uninstall ]; then
        [ -d "$dir" ] || die "ERR_NO:0x0090;ERR_DES:uninstall firmware failed, no firmware in $install_path"
        rm -rf "$dir"; del_params Firmware_Install_Path_Param Firmware_Install_Type
        say INFO "Firmware package uninstalled successfully!"; return
    fi
    if [ "$mode" = upgrade ] && [ ! -f "$dir/version.info" ]; then
        die "Upgrade failed, the firmware is not installed in $install_path."
    fi
    check_parent
    rm -rf "$dir"; copy_data
    should_fail && fail_now
    copy_info
    set_param Firmware_Install_Type full; set_param Firmware_Install_Path_Param "$install_path"
    local done_word=installed; [ "$mode" = upgrade ] && done_word=upgraded
    say INFO "Firmware package $done_word successfully! Reboot needed for installation/upgrade to take effect!"
}

toolkit_paths() {  # sets base, link, vname, prefix for this package's CANN version
    if [ "$LAYOUT" = cann ]; then
        base="$install_path"; link="$install_path/cann"; vname="cann-$VERSION"; prefix="cann-"
    else
        base="$install_path/ascend-toolkit"; link="$base/latest"; vname="$VERSION"; prefix=""
    fi
}

do_toolkit() {
    local base link vname prefix old
    toolkit_paths
    if [ "$mode" = uninstall ]; then
        [ -d "$base/$vname" ] || die "Uninstall failed, can not find the path of $PKG_NAME $VERSION in $install_path."
        rm -rf "${base:?}/$vname"
        if [ ! -e "$link" ] || [ "$(readlink "$link")" = "$vname" ]; then relink_highest "$link" "$base" "$prefix"; fi
        if [ "$LAYOUT" != cann ] && [ ! -e "$link" ]; then
            rm -f "$base/set_env.sh"; rmdir "$base" 2>/dev/null
        fi
        say INFO "$PKG_NAME uninstall success"; return
    fi
    accept_eula
    if [ "$mode" = upgrade ]; then
        [ -L "$link" ] || die "Upgrade failed, can not find the path of $PKG_NAME in $install_path."
        old=$(readlink "$link")
        if [ -n "$old" ] && [ "$old" != "$vname" ]; then
            rm -rf "${base:?}/$old"; log INFO "removed the old version $old"
        fi
    fi
    rm -rf "${base:?}/$vname"; copy_data
    should_fail && fail_now
    copy_info
    link_to "$link" "$vname"
    say INFO "$PKG_NAME $mode success, the install path is $base/$vname"
    local set_env="$base/set_env.sh"; [ "$LAYOUT" = cann ] && set_env="$install_path/cann/set_env.sh"
    say INFO "If your service is started using the shell script, you can call the $set_env script to"\
" configure environment variables."
}

do_kernels() {  # kernels (<= 8.3) and ops (>= 8.5)
    local base link vname prefix toolkit_info
    toolkit_paths
    toolkit_info="$base/$vname/$ARCH-linux/ascend_toolkit_install.info"
    if [ "$mode" = uninstall ]; then
        if [ "$LAYOUT" = cann ]; then
            [ -f "$base/$vname/$ARCH-linux/ascend_ops_install.info" ] \
                || die "Uninstall failed, $PKG_NAME $VERSION is not installed in $install_path."
            rm -f "$base/$vname/$ARCH-linux/ascend_ops_install.info"
        else
            grep -q '^opp_kernel_' "$base/$vname/version.cfg" 2>/dev/null \
                || die "Uninstall failed, $PKG_NAME $VERSION is not installed in $install_path."
            sed -i '/^opp_kernel_/d' "$base/$vname/version.cfg"; rm -rf "${base:?}/$vname/opp_kernel"
        fi
        rm -rf "${base:?}/$vname/$KERNEL_DIR"
        say INFO "$PKG_NAME uninstall success"; return
    fi
    if [ ! -f "$toolkit_info" ] || ! grep -q -x "version=$VERSION" "$toolkit_info"; then
        die "$PKG_NAME $VERSION needs Ascend-cann-toolkit $VERSION installed first, but $toolkit_info is"\
" missing or of another version; install the toolkit package first."
    fi
    accept_eula
    copy_data
    should_fail && fail_now
    copy_info
    say INFO "$PKG_NAME $mode success, the install path is $base/$vname"
}

do_nnal() {
    local base="$install_path/nnal/atb" old cur_owner cann_owner
    if [ "$mode" = uninstall ]; then
        [ -d "$base" ] || die "Uninstall failed, can not find the path of Ascend-cann-atb."
        say INFO "Ascend-cann-atb $VERSION uninstall start!"
        rm -rf "${base:?}/$VERSION"
        if [ ! -e "$base/latest" ] || [ "$(readlink "$base/latest")" = "$VERSION" ]; then
            relink_highest "$base/latest" "$base" ""
        fi
        if [ ! -e "$base/latest" ]; then rm -f "$base/set_env.sh"; rmdir "$base" "$install_path/nnal" 2>/dev/null; fi
        say INFO "Ascend-cann-atb $VERSION uninstall success!"; return
    fi
    # check_owner of the real ATB install.sh: the toolkit's set_env.sh must have been sourced.
    if [ "${ASCEND_TOOLKIT_HOME:-}" = "" ] && [ "${ASCEND_NNAE_HOME:-}" = "" ]; then
        die "Check owner failed, please check env ASCEND_TOOLKIT_HOME or ASCEND_NNAE_HOME is set."
    fi
    [ -n "${ASCEND_HOME_PATH:-}" ] || die "Check owner failed, please check env ASCEND_HOME_PATH is set."
    [ -d "$ASCEND_HOME_PATH" ] || die "Check owner failed, can not find cann in ${ASCEND_HOME_PATH}."
    cur_owner=$(id -un); cann_owner=$(stat -c %U "$ASCEND_HOME_PATH")
    [ "$cann_owner" = "$cur_owner" ] || die "Check owner failed, current owner is not same with CANN."
    say INFO "Check owner success!"
    if [ "$mode" = upgrade ]; then
        [ -d "$base" ] || die "Upgrade failed, can not find the path of Ascend-cann-atb."
        if [ ! -L "$base/latest" ] || [ ! -f "$base/set_env.sh" ]; then
            die "Can not find file set_env.sh or latest!"
        fi
        old=$(readlink "$base/latest")
        if [ -n "$old" ] && [ "$old" != "$VERSION" ]; then
            rm -rf "${base:?}/$old"; log INFO "removed the old version $old"
        fi
    fi
    if [ -d "$base/$VERSION" ]; then say INFO "The installation directory exists, uninstall first.."; fi
    rm -rf "${base:?}/$VERSION"; copy_data
    should_fail && fail_now
    copy_info
    link_to "$base/latest" "$VERSION"
    say INFO "Ascend-cann-atb $mode success!"
}

case "$KIND" in
    driver) do_driver ;;
    firmware) do_firmware ;;
    toolkit) do_toolkit ;;
    kernels|ops) do_kernels ;;
    nnal) do_nnal ;;
esac
exit 0
"""


# ----------------------------------------------------------------------------------------------------------------
# makeself
# ----------------------------------------------------------------------------------------------------------------

# Patches to makeself 2.4.5's header (Debian). Each (old, new) must match exactly once.
_HEADER_PATCHES: tuple[tuple[str, str], ...] = (
    # Unknown flags stop makeself's option parsing and go to the embedded script (vendor flags such as --full).
    ('    -*)\n\techo Unrecognized flag : "\\$1" >&2\n\tMS_Help\n\texit 1\n\t;;\n',
     "    -*)\n\tbreak ;;\n"),
    # --quiet and --nox11 are makeself's and the vendor script's: keep them for the script too.
    ("    -q | --quiet)\n\tquiet=y\n\tnoprogress=y\n\tshift\n",
     '    -q | --quiet)\n\tquiet=y\n\tnoprogress=y\n\tvendorargs="\\$vendorargs --quiet"\n\tshift\n'),
    ("    --nox11)\n\tnox11=y\n\tshift\n",
     '    --nox11)\n\tnox11=y\n\tvendorargs="\\$vendorargs --nox11"\n\tshift\n'),
    # --extract=DIR (the vendors' packages have it): extract into DIR, run nothing. --version: the script prints
    # the version, and makeself stays silent so that the version is all there is on stdout.
    ("    --)\n\tshift\n\tbreak ;;\n",
     '    --extract=*)\n\tkeep=y\n\ttargetdir=\\`echo "\\$1" | cut -d"=" -f2-\\`\n\tscript=""\n\tcleanup_script=""\n'
     "\tshift\n\t;;\n    --version)\n\tquiet=y\n\tnoprogress=y\n\tbreak ;;\n    --)\n\tshift\n\tbreak ;;\n"),
    ('initargs="\\$@"\n', 'initargs="\\$@"\nvendorargs=""\n'),
)
_EXEC_OLD = 'eval "\\"\\$script\\" \\$scriptargs \\"\\\\\\$@\\""'
_EXEC_NEW = 'eval "\\"\\$script\\" \\$scriptargs \\$vendorargs \\"\\\\\\$@\\""'


def makeself_available() -> bool:
    return shutil.which("makeself") is not None and STOCK_HEADER.is_file()


def _patched_header(directory: Path) -> Path:
    """A copy of makeself's header in which vendor flags reach the embedded script (absolute path)."""
    text = STOCK_HEADER.read_text(encoding="utf-8")
    for old, new in _HEADER_PATCHES:
        if text.count(old) != 1:
            raise RuntimeError(f"makeself header {STOCK_HEADER} is not the expected 2.4.x one: cannot patch {old!r}")
        text = text.replace(old, new)
    if text.count(_EXEC_OLD) != 2:
        raise RuntimeError(f"makeself header {STOCK_HEADER}: the script call lines were not found")
    text = text.replace(_EXEC_OLD, _EXEC_NEW)
    header = (directory / "makeself-header-vendor.sh").resolve()
    header.write_text(text, encoding="utf-8")
    return header


def build_installer(
    kind: Kind,
    version: str,
    out_dir: Path,
    *,
    arch: str = "x86_64",
    chip: str = "910b",
    fail_env: str | None = None,
    hdk_version: str | None = None,
    file_name: str | None = None,
) -> Path:
    """Build a vendor-style makeself ``.run`` for one package; returns its path in ``out_dir``."""
    name = file_name if file_name is not None else installer_file_name(kind, version, arch=arch, chip=chip)
    if not _FILE_NAME_RE.fullmatch(name):
        raise ValueError(f"not a plain file name: {name!r}")
    fail_name = fail_env if fail_env is not None else default_fail_env(kind)
    if not _ENV_NAME_RE.fullmatch(fail_name):
        raise ValueError(f"not an environment variable name: {fail_name!r}")
    if hdk_version is not None and not _VERSION_RE.fullmatch(hdk_version):
        raise ValueError(f"not an HDK version: {hdk_version!r}")
    makeself = shutil.which("makeself")
    if makeself is None or not STOCK_HEADER.is_file():
        raise RuntimeError("makeself is not installed: `apt-get install -y makeself`")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = (out_dir / name).resolve()
    prefix, ts_style = _STYLE[kind]
    pkg_name = {
        "driver": "Driver", "firmware": "Firmware", "toolkit": "Ascend-cann-toolkit",
        "kernels": f"Ascend-cann-kernels-{chip}", "ops": f"Ascend-cann-{chip}-ops", "nnal": "Ascend-cann-nnal",
    }[kind]
    conf = {
        "KIND": kind,
        "VERSION": version,
        "ARCH": arch,
        "CHIP": chip,
        "LAYOUT": "cann" if kind in ("toolkit", "kernels", "ops") and uses_cann_layout(version) else "toolkit",
        "PKG_NAME": pkg_name,
        "RUN_NAME": name,
        "PREFIX": prefix,
        "TS_STYLE": ts_style,
        "LOG_NAME": _LOG_NAME[kind],
        "INSTALL_FLAGS": _INSTALL_FLAGS[kind],
        "FAIL_ENV": fail_name,
        "KERNEL_DIR": f"opp/built-in/op_impl/ai_core/tbe/kernel/ascend{chip}",
    }
    with tempfile.TemporaryDirectory(prefix="npuops-run-") as tmp:
        work = Path(tmp)
        pkg = work / "pkg"
        _render_payload(kind, version, arch, chip, hdk_version, pkg / "payload")
        (pkg / "package.conf").write_text(
            "".join(f"{key}={shlex.quote(value)}\n" for key, value in conf.items()), encoding="utf-8")
        script = pkg / "install.sh"
        script.write_text(_INSTALL_SH, encoding="utf-8")
        script.chmod(0o755)
        header = _patched_header(work)
        label = f"{name} (npuops test double of the Ascend {kind} package)"
        result = subprocess.run(
            [makeself, "--nox11", "--noprogress", "--keep-umask", "--quiet", "--sha256", "--header", str(header),
             str(pkg), str(target), label, "./install.sh"],
            capture_output=True, text=True, check=False, timeout=120,
        )
        if result.returncode != 0 or not target.is_file():
            raise RuntimeError(f"makeself failed ({result.returncode}): {result.stdout}{result.stderr}")
    return target


def build_package_set(
    out_dir: Path,
    *,
    driver: str = "25.2.0",
    firmware: str = "7.7.0.6.236",
    cann: str = "8.2.RC1",
    arch: str = "x86_64",
    chip: str = "910b",
) -> dict[Kind, Path]:
    """A consistent package set: driver and its firmware, then the toolkit, kernels/ops and NNAL of one CANN.

    Defaults: CANN 8.2.RC1 needs HDK driver >= 25.2.0 (ascend-deployer's downloader/software/CANN_*.json;
    vllm-ascend#3865 runs exactly these two);
    driver 25.2.0 was published together with firmware 7.7.0.6.236 (a public deployment guide installs
    Ascend-hdk-910b-npu-driver_25.2.0_linux-aarch64.run and Ascend-hdk-910b-npu-firmware_7.7.0.6.236.run; GitHub code
    index file id 56794777464). Another real pair: driver 25.0.rc1.1 with firmware 7.7.0.1.231 (HDK 25.0.RC1.1),
    the driver of capture driver-version-info_25.0.rc1.1_1.txt.
    """
    kernels_kind: Kind = "ops" if uses_cann_layout(cann) else "kernels"
    return {
        "driver": build_installer("driver", driver, out_dir, arch=arch, chip=chip),
        "firmware": build_installer("firmware", firmware, out_dir, arch=arch, chip=chip, hdk_version=driver),
        "toolkit": build_installer("toolkit", cann, out_dir, arch=arch, chip=chip),
        kernels_kind: build_installer(kernels_kind, cann, out_dir, arch=arch, chip=chip),
        "nnal": build_installer("nnal", cann, out_dir, arch=arch, chip=chip),
    }


def run_installer(
    run_file: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: str = "",
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run a ``.run`` with ``args`` in a minimal environment plus ``env``; never raises on a non-zero exit.

    Each run extracts into a TMPDIR of its own: makeself unpacks into ``$TMPDIR/selfgz<PID>`` and refuses to start
    when that directory exists ("Cannot create target directory"), which a run killed earlier, or a process of a
    PID namespace (the systemd and sshd test hosts) with the same PID, can leave behind in a shared /tmp.
    """
    with tempfile.TemporaryDirectory(prefix="npuops-run-tmp-", dir=os.environ.get("TMPDIR", "/tmp")) as run_tmp:
        base = {
            "PATH": os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LC_ALL": "C",
            "TMPDIR": run_tmp,
        }
        return subprocess.run(
            [str(run_file), *args], input=stdin, capture_output=True, text=True, env={**base, **(env or {})},
            timeout=timeout, check=False,
        )


# ----------------------------------------------------------------------------------------------------------------
# SHA256SUMS
# ----------------------------------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sha256sums(directory: Path, *, pattern: str = "*") -> Path:
    """Write ``directory/SHA256SUMS`` for the regular files matching ``pattern`` (``sha256sum`` text format)."""
    lines = []
    for path in sorted(directory.glob(pattern), key=lambda p: p.name):
        if path.name == "SHA256SUMS" or path.is_symlink() or not path.is_file():
            continue
        if "\n" in path.name or "\\" in path.name:
            raise ValueError(f"sha256sum would escape this file name: {path.name!r}")
        lines.append(f"{sha256_of(path)}  {path.name}\n")
    manifest = directory / "SHA256SUMS"
    manifest.write_text("".join(lines), encoding="utf-8")
    return manifest
