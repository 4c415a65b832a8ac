"""Why a torch_npu import (or an engine that imports it) failed, as an operator would fix it.

Pure functions over the text a failed import printed; shared by the doctor's `torch-npu-import` check and the
supervisor's diagnosis of a dead engine (npuops/service/diagnosis.py). The cases are the real messages of
vllm-ascend issues #262, #1440, #152, #117 and #11160, and of torch_npu installed without CANN: `ImportError:
libhccl.so` (as #262 shows) and `Failed to load the backend extension: torch_npu` (as #1440 shows), both also
captured on the test machines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROVISION_PYTHON = "`npuops provision --tags python`"
PROVISION_CANN = "`npuops provision --tags cann`"

_DRIVER_LIBS = ("libascend_hal.so", "libdrvdsmi_host.so", "libdcmi.so")
_NNAL_LIBS = ("libatb.so", "libasdops.so", "liblcal.so")
_CANN_LIB_PREFIXES = ("libhccl", "libascendcl", "libacl", "libge_", "libgraph", "libregister", "libruntime",
                      "libopapi", "libascend_protobuf", "liberror_manager", "libplatform", "libtiling_api", "libmmpa",
                      "libc_sec", "libprofapi", "libmsprofiler", "libascend_dump", "libfmk_")
# vllm-ascend's assertion when its wheel's __device_type__ is not the chips' family (vllm_ascend/utils.py).
DEVICE_TYPE_MESSAGE = "does not match the installed version's device type"
DEVICE_TYPE_FIX = ("install the vllm-ascend build for this chip family (A3 and 310P need their own wheel or a "
                   f"source build on the node): {PROVISION_PYTHON}")
_MISSING_LIB = re.compile(r"(lib[\w.+-]*?\.so(?:\.[\d.]+)?): cannot open shared object file")


@dataclass(frozen=True)
class ImportFailure:
    """Why `import torch_npu` failed, as an operator would fix it."""

    kind: str  # cann-not-sourced, driver-libs-missing, nnal-missing, undefined-symbol, device-type, ...
    cause: str
    line: str  # the line of the output the verdict rests on
    remediation: str


def _line_with(text: str, needle: str) -> str:
    for line in text.splitlines():
        if needle in line:
            return line.strip()
    return needle


def classify_import_failure(output: str, env_source: str = "the service's environment") -> ImportFailure:
    """Classify the output of a failed torch_npu import. Pure; the most specific cause wins.

    The cases are the real messages the module docstring cites: a missing
    libhccl.so/libascendcl.so or "Failed to infer device type" (CANN not sourced), libascend_hal.so (driver
    libraries), libatb.so (NNAL), `undefined symbol` (packages from different rows) and the vllm-ascend
    device-type assertion (an A2-only wheel on A3/310P).
    """
    text = output or ""
    source_fix = (f"add the variables of the CANN set_env.sh scripts to {env_source} (systemd does not source "
                  "them): re-render it with `npuops launch`, or copy ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME, "
                  "ASCEND_OPP_PATH and LD_LIBRARY_PATH from `bash -c 'source /usr/local/Ascend/ascend-toolkit/"
                  "set_env.sh && env'` (cann/set_env.sh from CANN 8.5)")
    if DEVICE_TYPE_MESSAGE in text:
        return ImportFailure(
            "device-type", "the vllm-ascend wheel was built for another chip family than this node's "
            "(the PyPI wheel is A2-only)", _line_with(text, DEVICE_TYPE_MESSAGE), DEVICE_TYPE_FIX)
    if "undefined symbol" in text:
        line = _line_with(text, "undefined symbol")
        symbol = line.rsplit("undefined symbol:", 1)[-1].strip()
        if "3atb" in symbol or "libatb" in line:
            return ImportFailure(
                "undefined-symbol", "torch_npu and NNAL/ATB come from different releases", line,
                f"install the NNAL of the same version as CANN and the torch_npu of that row ({PROVISION_CANN}, "
                f"then {PROVISION_PYTHON}); see `npuops doctor --only stack-row,torch-npu-cann`")
        return ImportFailure(
            "undefined-symbol", "torch, torch_npu, CANN and NNAL come from different rows of the compat matrix",
            line, "install one row as a unit (torch, torch-npu, vllm, vllm-ascend with the CANN of that row): "
            f"{PROVISION_PYTHON}; `npuops doctor --only stack-row,torch-npu-cann` names what differs")
    missing = _MISSING_LIB.findall(text)
    if missing:
        lib = missing[-1]
        line = _line_with(text, f"{lib}: cannot open shared object file")
        if lib.startswith(_NNAL_LIBS):
            return ImportFailure(
                "nnal-missing", "NNAL (ATB) is not installed or its set_env.sh is not in the environment", line,
                f"install NNAL of the CANN version ({PROVISION_CANN}) and add the variables of "
                "/usr/local/Ascend/nnal/atb/set_env.sh (ATB_HOME_PATH and its LD_LIBRARY_PATH entries) to "
                f"{env_source}")
        if lib.startswith(_DRIVER_LIBS):
            return ImportFailure(
                "driver-libs-missing", "the driver's libraries are not on the library path (or not mounted)", line,
                "add /usr/local/Ascend/driver/lib64/driver and /usr/local/Ascend/driver/lib64/common to "
                f"LD_LIBRARY_PATH in {env_source}; in a container mount /usr/local/Ascend/driver read-only")
        if lib.startswith(_CANN_LIB_PREFIXES):
            return ImportFailure("cann-not-sourced", f"CANN's libraries are not on the library path ({lib})", line,
                                 source_fix)
        return ImportFailure("missing-library", f"a shared library torch_npu needs is missing: {lib}", line,
                             f"find which package ships {lib} (`ldconfig -p | grep {lib.split('.so')[0]}`, "
                             f"`find / -name '{lib}*'`) and put its directory on LD_LIBRARY_PATH in {env_source}")
    if "cannot allocate memory in static TLS block" in text:
        line = _line_with(text, "cannot allocate memory in static TLS block")
        lib = line.split(":")[1].strip() if line.count(":") >= 2 else "the library named"
        return ImportFailure("static-tls", "a library (usually libgomp on ARM) was loaded too late for its TLS", line,
                             f"preload it: add LD_PRELOAD={lib} to {env_source}")
    for needle in ("Failed to infer device type", "No platform detected"):
        if needle in text:
            return ImportFailure("cann-not-sourced", "vLLM found no NPU platform: torch_npu could not load",
                                 _line_with(text, needle), source_fix)
    if re.search(r"No module named '?torch_npu'?(?!\.)", text):
        return ImportFailure("not-installed", "torch_npu is not importable from this interpreter",
                             _line_with(text, "No module named"), f"install the serving stack: {PROVISION_PYTHON}")
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "no output")
    return ImportFailure("unknown", "import torch_npu failed for a reason npuops does not recognise", last,
                         "run the import by hand with the service's environment (`python -c 'import torch_npu'`) "
                         "and read the first exception of the traceback; if it does not say why, `npuops collect` "
                         "gathers what a support case needs")
