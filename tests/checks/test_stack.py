"""The Python stack checks: compat rows, the Python range, torch_npu's CANN, and the torch_npu import probe."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from npuops.checks.stack import (
    IMPORT_SCRIPT,
    PythonVersion,
    StackRowCheck,
    TorchNpuCann,
    TorchNpuImport,
    closest_row,
    family_of_soc,
    load_compat,
    public_version,
)
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Check, Result, Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.failures import classify_import_failure
from npuops.hardware.node import InstalledComponent, Node
from npuops.hardware.probe import RC_TIMEOUT, Probe
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.host_tree import put
from tests.support.nodes import ROW_0_13, VENV_PYTHON, bare_node, make_stack
from tests.support.paths import REPO

STACK_IDS = ("stack-row", "python-version", "torch-npu-cann", "torch-npu-import")


# --- building contexts ------------------------------------------------------------------------------------------


def with_cann(node: Node, version: str | None) -> Node:
    toolkit = InstalledComponent(version is not None, version,
                                 "/usr/local/Ascend/ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info")
    return dataclasses.replace(node, cann=dataclasses.replace(node.cann, toolkit=toolkit))


def context(root: Path, node: Node, *, settings: Settings | None = None, options: DoctorOptions | None = None,
            runner: FakeRunner | None = None) -> CheckContext:
    probe = Probe(settings or Settings(root=root), runner=runner or FakeRunner(passthrough_python=False))
    ctx = CheckContext(probe, options)
    ctx._node = node
    return ctx


def run_with(root: Path, check: type[Check],
             versions: dict[str, str] | None, *, cann: str | None = None, python: str = "3.11.7") -> Result:
    node = dataclasses.replace(bare_node(root), python_stack=make_stack(versions, python))
    return check().run(context(root, with_cann(node, cann)))


# --- the checks are found and documented -----------------------------------------------------------------------


def test_stack_checks_are_discovered_with_pages() -> None:
    found = {c.id: c for c in discover_checks()}
    for check_id in STACK_IDS:
        assert check_id in found
        assert found[check_id].area == "stack"
        page = (REPO / "checks" / "docs" / f"{check_id}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {check_id}: ")
        for section in ("**What it checks.**", "**Why it matters.**", "**How to fix.**"):
            assert section in page
    assert found["torch-npu-import"].level == 2


# --- versions ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "public"), [("2.5.1+cpu", "2.5.1"), ("0.9.1+empty", "0.9.1"),
                                               ("0.11.0rc1", "0.11.0rc1"), ("2.5.1.post1", "2.5.1.post1"),
                                               ("0.11.0RC1", "0.11.0rc1")])
def test_public_version_drops_local_labels(given: str, public: str) -> None:
    assert public_version(given) == public


def test_compat_rows_are_read_newest_first() -> None:
    compat = load_compat()
    assert compat.rows[0].name == "0.30.0rc2"
    assert [r.name for r in compat.rows].index("0.23.0") == 8
    row = next(r for r in compat.rows if r.name == "0.11.0")
    assert "triton_ascend" not in row.pins and row.python == ("3.9", "3.11") and row.cann == "8.3.RC2"


def test_closest_row_prefers_most_shared_pins() -> None:
    versions = {**ROW_0_13, "torch_npu": "2.8.0"}
    match = closest_row(versions, load_compat().rows)
    assert match is not None and match.row.name == "0.13.0"
    assert [(d.component, d.installed, d.wanted) for d in match.differences] == [("torch_npu", "2.8.0", "2.8.0.post2")]


# --- stack-row ---------------------------------------------------------------------------------------------------


def test_stack_row_passes_on_an_exact_row(fake_root: Path) -> None:
    result = run_with(fake_root, StackRowCheck, ROW_0_13)
    assert result.status is Status.PASS
    assert result.evidence["row"] == "0.13.0"
    assert result.evidence["installed"]["torch"] == "2.8.0+cpu"


def test_stack_row_ignores_components_a_row_does_not_pin(fake_root: Path) -> None:
    versions = {"torch": "2.7.1", "torch_npu": "2.7.1.post1", "vllm": "0.11.0", "vllm_ascend": "0.11.0",
                "triton_ascend": "3.2.0"}
    result = run_with(fake_root, StackRowCheck, versions)
    assert result.status is Status.PASS and result.evidence["row"] == "0.11.0"


def test_stack_row_fails_naming_the_differing_component_and_what_to_install(fake_root: Path) -> None:
    result = run_with(fake_root, StackRowCheck, {**ROW_0_13, "torch_npu": "2.8.0"})
    assert result.status is Status.FAIL and result.evidence["closest_row"] == "0.13.0"
    assert result.evidence["differences"] == [{"component": "torch-npu", "installed": "2.8.0",
                                               "wanted": "2.8.0.post2"}]
    # The fix is the command that installs the row's pin.
    assert "pip install 'torch-npu==2.8.0.post2'" in (result.remediation or "")


def test_stack_row_fails_when_vllm_ascend_lacks_torch_npu(fake_root: Path) -> None:
    result = run_with(fake_root, StackRowCheck, {"torch": "2.8.0", "vllm": "0.13.0", "vllm_ascend": "0.13.0",
                                                 "triton_ascend": "3.2.0"})
    assert result.status is Status.FAIL
    assert result.evidence["differences"] == [{"component": "torch-npu", "installed": None, "wanted": "2.8.0.post2"}]
    assert "pip install 'torch-npu==2.8.0.post2'" in (result.remediation or "")


def test_stack_row_fails_an_rc_of_a_known_release(fake_root: Path) -> None:
    # Field capture vllm-ascend#3865: vllm-ascend 0.11.0rc1 with CANN 8.2.RC1 - not the 0.11.0 row.
    versions = {"torch": "2.7.1", "torch_npu": "2.7.1.dev20250724", "vllm": "0.11.0", "vllm_ascend": "0.11.0rc1"}
    result = run_with(fake_root, StackRowCheck, versions)
    assert result.status is Status.FAIL
    assert result.evidence["closest_row"] == "0.11.0"


def test_stack_row_warns_on_a_vllm_ascend_newer_than_the_table(fake_root: Path) -> None:
    versions = {"torch": "2.11.0", "torch_npu": "2.11.0", "vllm": "0.30.0", "vllm_ascend": "0.30.0",
                "triton_ascend": "3.3.0"}
    result = run_with(fake_root, StackRowCheck, versions)
    assert result.status is Status.WARN and result.evidence["torch_pair_ok"] is True
    assert result.evidence["installed"]["vllm-ascend"] == "0.30.0"
    assert "versioning_policy" in (result.remediation or "")  # where the operator looks the pins up


def test_stack_row_fails_an_unknown_release_whose_torch_differs_from_torch_npu(fake_root: Path) -> None:
    versions = {"torch": "2.12.0", "torch_npu": "2.11.0", "vllm": "0.30.0", "vllm_ascend": "0.30.0"}
    result = run_with(fake_root, StackRowCheck, versions)
    assert result.status is Status.FAIL and result.evidence["torch_pair_ok"] is False
    assert (result.evidence["installed"]["torch"], result.evidence["installed"]["torch-npu"]) == ("2.12.0", "2.11.0")


def test_stack_row_skips_without_an_npu_stack(fake_root: Path) -> None:
    result = run_with(fake_root, StackRowCheck, {"torch": "2.13.0+cpu", "vllm": "0.32.0"})
    assert result.status is Status.SKIP and result.evidence == {"executable": VENV_PYTHON}
    assert "npuops provision --tags python" in (result.remediation or "")


def test_stack_row_fails_when_the_interpreter_cannot_run(fake_root: Path) -> None:
    node = dataclasses.replace(bare_node(fake_root), python_stack=make_stack(
        error="`/opt/npuops/venv/bin/python -I -c ...`: /opt/npuops/venv/bin/python: command not found"))
    result = StackRowCheck().run(context(fake_root, node))
    assert result.status is Status.FAIL
    assert result.evidence["error"] == node.python_stack.error
    assert "NPUOPS_STACK_PYTHON" in (result.remediation or "")  # the setting to fix


# --- python-version ----------------------------------------------------------------------------------------------


def test_python_version_inside_the_row(fake_root: Path) -> None:
    result = run_with(fake_root, PythonVersion, ROW_0_13, python="3.11.7")
    assert result.status is Status.PASS
    assert result.evidence["range"] == "3.10-3.11" and result.evidence["row"] == "0.13.0"


def test_python_version_outside_the_row_fails(fake_root: Path) -> None:
    result = run_with(fake_root, PythonVersion, ROW_0_13, python="3.12.3")
    assert result.status is Status.FAIL
    assert (result.evidence["python"], result.evidence["range"]) == ("3.12.3", "3.10-3.11")
    assert "python3.11" in (result.remediation or "")  # the interpreter to recreate the venv with


def test_python_version_uses_the_row_of_vllm_ascend_when_nothing_matches(fake_root: Path) -> None:
    result = run_with(fake_root, PythonVersion, {**ROW_0_13, "torch": "2.9.0", "vllm_ascend": "0.11.0"},
                      python="3.9.18")
    assert result.status is Status.PASS and result.evidence["row"] == "0.11.0"


def test_python_version_skips_without_an_npu_stack(fake_root: Path) -> None:
    result = run_with(fake_root, PythonVersion, {"torch": "2.13.0"})
    assert result.status is Status.SKIP and result.evidence == {"executable": VENV_PYTHON}


# --- torch-npu-cann ----------------------------------------------------------------------------------------------


def test_torch_npu_cann_passes_with_the_table_or_the_row(fake_root: Path) -> None:
    # torch_npu 2.9.0: the torch_npu table says CANN 8.5.0, the 0.19.1rc1 row says 8.5.1 - both are accepted.
    for cann in ("8.5.0", "8.5.1"):
        result = run_with(fake_root, TorchNpuCann, {"torch": "2.9.0", "torch_npu": "2.9.0"}, cann=cann)
        assert result.status is Status.PASS, result
    assert result.evidence["wanted"] == ["8.5.0", "8.5.1"]


def test_torch_npu_cann_compares_ascend_versions_not_strings(fake_root: Path) -> None:
    result = run_with(fake_root, TorchNpuCann, {"torch_npu": "2.7.1"}, cann="8.3.rc1")
    assert result.status is Status.PASS


def test_torch_npu_cann_fails_on_another_cann(fake_root: Path) -> None:
    # Field capture vllm-ascend#4930-like: CANN 8.2.RC1 on the node, torch_npu of the 8.3 line.
    result = run_with(fake_root, TorchNpuCann, {"torch": "2.7.1", "torch_npu": "2.7.1"}, cann="8.2.RC1")
    assert result.status is Status.FAIL
    assert (result.evidence["torch_npu"], result.evidence["cann"], result.evidence["wanted"]) == (
        "2.7.1", "8.2.RC1", ["8.3.RC1"])
    assert "install CANN 8.3.RC1" in (result.remediation or "")


def test_torch_npu_cann_reads_the_cann_of_a_real_install(fake_root: Path) -> None:
    put(fake_root, "/usr/local/Ascend/cann/aarch64-linux/ascend_toolkit_install.info",
        capture("ascend_toolkit_install-info_doc_1.txt"))
    node = bare_node(fake_root, machine="aarch64")
    assert node.cann.toolkit.version == "8.5.0"
    node = dataclasses.replace(node, python_stack=make_stack(ROW_0_13))
    result = TorchNpuCann().run(context(fake_root, node))
    assert result.status is Status.PASS and result.evidence["cann"] == "8.5.0"


def test_torch_npu_cann_falls_back_to_the_base_release(fake_root: Path) -> None:
    result = run_with(fake_root, TorchNpuCann, {"torch_npu": "2.5.1.dev20250218"}, cann="8.1.RC1")
    assert result.status is Status.PASS and "base release 2.5.1" in result.evidence["source"]


def test_torch_npu_cann_warns_on_an_unknown_torch_npu(fake_root: Path) -> None:
    result = run_with(fake_root, TorchNpuCann, {"torch_npu": "3.1.0"}, cann="9.1.0")
    assert result.status is Status.WARN and result.evidence["wanted"] == [] and result.evidence["cann"] == "9.1.0"


def test_torch_npu_cann_skips(fake_root: Path) -> None:
    no_npu = run_with(fake_root, TorchNpuCann, {"torch": "2.8.0"}, cann="8.5.0")
    assert no_npu.status is Status.SKIP and no_npu.evidence == {"torch_npu": None, "error": None}
    no_cann = run_with(fake_root, TorchNpuCann, ROW_0_13, cann=None)
    assert no_cann.status is Status.SKIP and no_cann.evidence["torch_npu"] == "2.8.0.post2"
    assert no_cann.evidence["cann_path"].endswith("/ascend_toolkit_install.info")
    assert "npuops provision --tags cann" in (no_cann.remediation or "")


# --- the import failure classifier, on real messages ------------------------------------------------------------

# `import torch_npu` (torch-npu 2.13.0 beside CPU torch 2.13.0, no CANN), run on a machine like CI's.
NO_CANN_IMPORT_TORCH_NPU = """Traceback (most recent call last):
  File "<string>", line 1, in <module>
  File "/tmp/npuvenv/lib/python3.11/site-packages/torch_npu/__init__.py", line 38, in <module>
    import torch_npu.utils.patch_getenv
  File "/tmp/npuvenv/lib/python3.11/site-packages/torch_npu/utils/__init__.py", line 4, in <module>
    from torch_npu.npu.utils import get_cann_version
  File "/tmp/npuvenv/lib/python3.11/site-packages/torch_npu/npu/__init__.py", line 164, in <module>
    from .utils import (obfuscation_initialize, obfuscation_calculate, obfuscation_finalize,
  File "/tmp/npuvenv/lib/python3.11/site-packages/torch_npu/npu/utils.py", line 8, in <module>
    import torch_npu._C
ImportError: libhccl.so: cannot open shared object file: No such file or directory
"""

# Same machine, plain `import torch`: torch autoloads torch_npu and wraps the failure.
NO_CANN_IMPORT_TORCH = """Traceback (most recent call last):
  File "/tmp/npuvenv/lib/python3.11/site-packages/torch/__init__.py", line 3030, in _import_device_backends
    entrypoint = backend_extension.load()
                 ^^^^^^^^^^^^^^^^^^^^^^^^
  File "/tmp/npuvenv/lib/python3.11/site-packages/torch_npu/npu/utils.py", line 8, in <module>
    import torch_npu._C
ImportError: libhccl.so: cannot open shared object file: No such file or directory

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "<string>", line 1, in <module>
  File "/tmp/npuvenv/lib/python3.11/site-packages/torch/__init__.py", line 3077, in <module>
    _import_device_backends()
  File "/tmp/npuvenv/lib/python3.11/site-packages/torch/__init__.py", line 3034, in _import_device_backends
    raise RuntimeError(
RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading with \
TORCH_DEVICE_BACKEND_AUTOLOAD=0.
"""

# vllm-ascend#152 (NNAL not installed).
LIBATB_MISSING = """Traceback (most recent call last):
  File "/home/ma-user/anaconda3/envs/PyTorch-2.1.0/lib/python3.9/site-packages/torch_npu/__init__.py", line 17, \
in <module>
    import torch_npu.npu
  File "/home/ma-user/anaconda3/envs/PyTorch-2.1.0/lib/python3.9/site-packages/torch_npu/utils/__init__.py", \
line 1, in <module>
    from torch_npu import _C
ImportError: libatb.so: cannot open shared object file: No such file or directory
"""

# vllm-ascend#117 (a torch_npu daily build against another NNAL/ATB).
UNDEFINED_ATB_SYMBOL = """  File "/usr/local/python3.10.14/lib/python3.10/site-packages/torch_npu/utils/__init__.py", \
line 1, in <module>
    from torch_npu import _C
ImportError: /usr/local/python3.10.14/lib/python3.10/site-packages/torch_npu/lib/libtorch_npu.so: undefined symbol: \
_ZN3atb15CreateOperationINS_5infer14GroupTopkParamEEEiRKT_PPNS_9OperationE
"""

# Ascend/pytorch#35 (torch and torch_npu from different builds).
UNDEFINED_TORCH_SYMBOL = ("WARNING: command error: 'Failed to import transformers.optimization because of the "
                          "following error (look up to see its traceback):\n"
                          "/home/ma-user/anaconda3/envs/PyTorch-2.1.0/lib/python3.9/site-packages/torch_npu/lib/"
                          "libtorch_npu.so: undefined symbol: "
                          "_ZN5torch10ValueErrorC1EPKcz'!\n")

# vllm-ascend's assertion with the A2 PyPI wheel on an A3 node.
DEVICE_TYPE = ("AssertionError: Current device type: AscendDeviceType.A3 does not match the installed version's device "
               "type: AscendDeviceType.A2, please check your installation package.\n")

# vllm-ascend#262: `vllm serve` when torch_npu cannot load.
INFER_DEVICE_TYPE = """   raise RuntimeError("Failed to infer device type")
   RuntimeError: Failed to infer device type
"""

DRIVER_LIBS = "ImportError: libascend_hal.so: cannot open shared object file: No such file or directory\n"

# Ascend/pytorch#7 (conda's libgomp on ARM).
STATIC_TLS = ("    import torch_npu._C\nImportError: /root/workspaces/mamba/envs/cann/bin/../lib/libgomp.so.1: cannot "
              "allocate memory in static TLS block\n")


@pytest.mark.parametrize(("output", "kind", "fix_part"), [
    (NO_CANN_IMPORT_TORCH_NPU, "cann-not-sourced", "set_env.sh"),
    (NO_CANN_IMPORT_TORCH, "cann-not-sourced", "ASCEND_HOME_PATH"),
    (LIBATB_MISSING, "nnal-missing", "nnal/atb/set_env.sh"),
    (UNDEFINED_ATB_SYMBOL, "undefined-symbol", "NNAL"),
    (UNDEFINED_TORCH_SYMBOL, "undefined-symbol", "one row as a unit"),
    (DEVICE_TYPE, "device-type", "vllm-ascend build for this chip family"),
    (INFER_DEVICE_TYPE, "cann-not-sourced", "set_env.sh"),
    (DRIVER_LIBS, "driver-libs-missing", "/usr/local/Ascend/driver/lib64/driver"),
    (STATIC_TLS, "static-tls", "LD_PRELOAD=/root/workspaces/mamba/envs/cann/bin/../lib/libgomp.so.1"),
    ("ModuleNotFoundError: No module named 'torch_npu'\n", "not-installed", "--tags python"),
    ("ImportError: libfoo_vendor.so.3: cannot open shared object file: No such file or directory\n",
     "missing-library", "libfoo_vendor.so.3"),
    ("Segmentation fault\n", "unknown", "by hand"),
])
def test_classify_import_failure_on_real_messages(output: str, kind: str, fix_part: str) -> None:
    failure = classify_import_failure(output, "/etc/npuops/qwen/env")
    assert failure.kind == kind
    assert fix_part in failure.remediation
    assert failure.line and failure.line in output.replace("\\\n", "")


def test_classifier_names_the_line_it_rests_on() -> None:
    failure = classify_import_failure(NO_CANN_IMPORT_TORCH)
    assert failure.line == "ImportError: libhccl.so: cannot open shared object file: No such file or directory"
    assert "libhccl.so" in failure.cause


def test_classifier_puts_the_env_file_in_the_fix() -> None:
    assert "/etc/npuops/qwen/env" in classify_import_failure(LIBATB_MISSING, "/etc/npuops/qwen/env").remediation


@pytest.mark.parametrize(("soc", "family"), [(223, "A2"), (253, "A3"), (202, "310P"), (260, "A5"), (100, None)])
def test_family_of_soc(soc: int, family: str | None) -> None:
    assert family_of_soc(soc) == family


# --- torch-npu-import end to end, with a fake stack interpreter ------------------------------------------------


def fake_interpreter(tmp_path: Path, versions: dict[str, str], *, stderr: str = "", stdout: str = "",
                     rc: int = 0, sleep: float = 0) -> Path:
    """A stand-in for the serving venv's python: answers npuops' metadata lookup (`-I -c ...`) like the real one,
    and the import probe with the given output; it records the environment the probe ran with."""
    packages = {c: {"version": v, "distribution": c.replace("_", "-")} for c, v in versions.items()}
    lookup = json.dumps({"python": "3.11.7", "executable": str(tmp_path / "python"), "packages": packages})
    (tmp_path / "lookup.json").write_text(lookup + "\n", encoding="utf-8")
    (tmp_path / "stderr.txt").write_text(stderr, encoding="utf-8")
    (tmp_path / "stdout.txt").write_text(stdout, encoding="utf-8")
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-I" ]; then cat "{tmp_path}/lookup.json"; exit 0; fi\n'
        f'env > "{tmp_path}/probe-env.txt"\n'
        f'printf "%s\\n" "$@" > "{tmp_path}/probe-argv.txt"\n'
        + (f"sleep {sleep}\n" if sleep else "")
        + f'cat "{tmp_path}/stdout.txt"\ncat "{tmp_path}/stderr.txt" >&2\nexit {rc}\n',
        encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def import_context(root: Path, python: Path, env_file: Path | None = None, npu_smi: str | None = None) -> CheckContext:
    answers: dict[tuple[str, ...], tuple[int, str, str]] = {("npu-smi", "info"): (0, npu_smi, "")} if npu_smi else {}
    settings = Settings(root=root, stack_python=str(python), environ={"PATH": os.environ.get("PATH", "")})

    class Runner(FakeRunner):
        """npu-smi from a capture; everything else (the fake interpreter) really runs."""

        def run(self, argv, *, timeout, env=None):  # type: ignore[no-untyped-def]
            if argv and argv[0] == "npu-smi":
                return super().run(argv, timeout=timeout, env=env)
            from npuops.hardware.probe import SubprocessRunner

            return SubprocessRunner(settings.search_path(), settings.environ).run(argv, timeout=timeout, env=env)

    return CheckContext(Probe(settings, runner=Runner(answers)), DoctorOptions(env_file=env_file))


def write_env_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "service.env"
    path.write_text(text, encoding="utf-8")
    return path


def test_torch_npu_import_fails_with_cann_not_sourced(fake_root: Path, tmp_path: Path) -> None:
    python = fake_interpreter(tmp_path, ROW_0_13, stderr=NO_CANN_IMPORT_TORCH, rc=1)
    env_file = write_env_file(tmp_path, 'OMP_NUM_THREADS=1\nTORCH_DEVICE_BACKEND_AUTOLOAD=0\n'
                                        'LD_LIBRARY_PATH="/usr/local/Ascend/driver/lib64/driver"\n')
    ctx = import_context(fake_root, python, env_file)
    result = TorchNpuImport().run(ctx)
    assert result.status is Status.FAIL
    assert result.evidence["kind"] == "cann-not-sourced"
    assert result.evidence["line"] == (
        "ImportError: libhccl.so: cannot open shared object file: No such file or directory")
    assert result.evidence["env_source"] == str(env_file)
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD removed" in result.evidence["note"]
    assert result.remediation is not None and str(env_file) in result.remediation
    # The probe ran with the env file's variables, autoload left on, and systemd's default PATH.
    seen = dict(line.split("=", 1) for line in (tmp_path / "probe-env.txt").read_text().splitlines() if "=" in line)
    assert seen["LD_LIBRARY_PATH"] == "/usr/local/Ascend/driver/lib64/driver"
    assert seen["OMP_NUM_THREADS"] == "1"
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in seen
    assert seen["PATH"].startswith("/usr/local/sbin:")
    argv = (tmp_path / "probe-argv.txt").read_text()
    assert argv.startswith("-c\n") and "import torch_npu" in argv


def test_torch_npu_import_fails_with_libatb_missing(fake_root: Path, tmp_path: Path) -> None:
    python = fake_interpreter(tmp_path, ROW_0_13, stderr=LIBATB_MISSING, rc=1)
    result = TorchNpuImport().run(import_context(fake_root, python))
    assert result.status is Status.FAIL and result.evidence["kind"] == "nnal-missing"
    assert result.evidence["line"] == LIBATB_MISSING.splitlines()[-1]
    assert result.evidence["env_source"] == "the current environment"


def test_torch_npu_import_passes_and_reports_the_devices(fake_root: Path, tmp_path: Path) -> None:
    out = json.dumps({"torch": "2.8.0+cpu", "torch_npu": "2.8.0.post2", "device_count": 8, "soc_version": 223,
                      "vllm_ascend_device_type": "A2"})
    python = fake_interpreter(tmp_path, ROW_0_13, stdout=out + "\n")
    result = TorchNpuImport().run(import_context(fake_root, python))
    assert result.status is Status.PASS
    assert (result.evidence["torch_npu"], result.evidence["device_count"]) == ("2.8.0.post2", 8)
    assert result.evidence["soc_version"] == 223


def test_torch_npu_import_fails_an_a2_wheel_on_a3_chips(fake_root: Path, tmp_path: Path) -> None:
    out = json.dumps({"torch_npu": "2.8.0.post2", "device_count": 16, "soc_version": 253,
                      "vllm_ascend_device_type": "A2"})
    python = fake_interpreter(tmp_path, ROW_0_13, stdout=out + "\n")
    result = TorchNpuImport().run(import_context(fake_root, python))
    assert result.status is Status.FAIL and result.evidence["kind"] == "device-type"
    assert (result.evidence["built_for"], result.evidence["chip_family"]) == ("A2", "A3")


def test_torch_npu_import_uses_the_chip_family_when_soc_is_unknown(fake_root: Path, tmp_path: Path) -> None:
    out = json.dumps({"torch_npu": "2.8.0.post2", "soc_error": "RuntimeError: ...", "vllm_ascend_device_type": "A2"})
    python = fake_interpreter(tmp_path, ROW_0_13, stdout=out + "\n")
    ctx = import_context(fake_root, python, npu_smi=capture("npu-smi-info_a3-ascend910-2chip_1.txt"))
    result = TorchNpuImport().run(ctx)
    assert result.status is Status.FAIL and result.evidence["kind"] == "device-type"
    assert (result.evidence["built_for"], result.evidence["chip_family"]) == ("A2", "A3")
    assert "soc_version" not in result.evidence  # the family came from npu-smi


def test_torch_npu_import_times_out(fake_root: Path, tmp_path: Path) -> None:
    python = fake_interpreter(tmp_path, ROW_0_13, sleep=5)
    ctx = import_context(fake_root, python)
    ctx._thresholds = {"torch_npu_import_timeout_s": 0.5}
    result = TorchNpuImport().run(ctx)
    assert result.status is Status.FAIL
    assert (result.evidence["returncode"], result.evidence["timeout_s"]) == (RC_TIMEOUT, 0.5)
    assert "`npu-smi info`" in (result.remediation or "")


def test_torch_npu_import_skips_without_torch_npu(fake_root: Path, tmp_path: Path) -> None:
    python = fake_interpreter(tmp_path, {"torch": "2.13.0+cpu"})
    result = TorchNpuImport().run(import_context(fake_root, python))
    assert result.status is Status.SKIP and result.evidence == {"torch_npu": None, "error": None}
    assert not (tmp_path / "probe-env.txt").exists()


def test_import_script_is_valid_python() -> None:
    compile(IMPORT_SCRIPT, "<import probe>", "exec")


# --- on this machine, as it is ----------------------------------------------------------------------------------


def test_stack_checks_on_this_machine_never_error() -> None:
    checks = [c for c in discover_checks() if c.id in STACK_IDS]
    ctx = CheckContext(Probe(Settings(environ=dict(os.environ), stack_python=sys.executable)))
    report = run_checks(checks, ctx)
    for outcome in report.outcomes:
        assert outcome.result.status is not Status.ERROR, outcome
    stack = ctx.node.python_stack
    if stack.version("torch_npu") is None and stack.version("vllm_ascend") is None:
        assert {o.check_id: o.result.status for o in report.outcomes} == {i: Status.SKIP for i in STACK_IDS}
