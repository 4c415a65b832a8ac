"""The service-environment checks, on env files that are right and wrong and on a prepared Ascend tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npuops.checks.environment import AllocConf, AscendEnv, LaunchBlockingGraph, ThreadLimits, parse_alloc_conf
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.errors import BadInputError
from npuops.hardware.probe import Probe
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.fake_commands import FakeRunner
from tests.support.host_tree import put
from tests.support.paths import REPO

ENV_IDS = ("ascend-env", "thread-limits", "launch-blocking-graph", "alloc-conf")
TOOLKIT = "/usr/local/Ascend/ascend-toolkit/latest"
DRIVER = "/usr/local/Ascend/driver"
ATB = "/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1"

# What `source ascend-toolkit/set_env.sh; source nnal/atb/set_env.sh` exports, rendered for systemd, with the
# thread limits and the allocator setting of vllm-ascend's tutorials and CI configs.
GOOD_ENV = f"""# rendered by npuops launch
ASCEND_TOOLKIT_HOME="{TOOLKIT}"
ASCEND_HOME_PATH="{TOOLKIT}"
ASCEND_OPP_PATH="{TOOLKIT}/opp"
ATB_HOME_PATH="{ATB}"
LD_LIBRARY_PATH="{ATB}/lib:{TOOLKIT}/lib64:{TOOLKIT}/lib64/plugin/opskernel:{DRIVER}/lib64/driver:{DRIVER}/lib64/common"
OMP_NUM_THREADS="1"
OPENBLAS_NUM_THREADS="1"
PYTORCH_NPU_ALLOC_CONF="expandable_segments:True"
TASK_QUEUE_ENABLE="1"
"""


def ascend_tree(root: Path, *, nnal: bool = True) -> None:
    """An x86 node with CANN 8.3.RC2 (ascend-toolkit layout, latest -> 8.3.RC2), NNAL and the driver's libraries."""
    real = root / "usr/local/Ascend/ascend-toolkit/8.3.RC2"
    put(root, "/usr/local/Ascend/ascend-toolkit/8.3.RC2/x86_64-linux/ascend_toolkit_install.info",
        capture("ascend_toolkit_install-info_x86_1.txt"))
    (real / "lib64").mkdir(parents=True)
    (root / "usr/local/Ascend/ascend-toolkit/latest").symlink_to("8.3.RC2")
    put(root, "/usr/local/Ascend/ascend-toolkit/set_env.sh", "# set_env\n")
    if nnal:
        put(root, "/usr/local/Ascend/nnal/atb/latest/version.info", capture("nnal-atb-version-info_8.2.RC2_1.txt"))
        put(root, f"{ATB}/lib/libatb.so", "")
        put(root, "/usr/local/Ascend/nnal/atb/set_env.sh", "# set_env\n")
    put(root, f"{DRIVER}/lib64/driver/libascend_hal.so", "")
    (root / "usr/local/Ascend/driver/lib64/common").mkdir(parents=True)


# The env checks judge an NPU host's service environment: a node whose npu-smi lists chips (a recorded A3).
NPU_SMI_INFO = capture("npu-smi-info_a3-ascend910-2chip_1.txt")


def env_context(root: Path, tmp_path: Path, env_text: str | None, *, environ: dict[str, str] | None = None,
                graph_mode: bool = True, npus: bool = True) -> CheckContext:
    env_file = None
    if env_text is not None:
        env_file = tmp_path / "env"
        env_file.write_text(env_text, encoding="utf-8")
    answers = {("npu-smi", "info"): (0, NPU_SMI_INFO, "")} if npus else {}
    probe = Probe(Settings(root=root, environ=environ or {}), runner=FakeRunner(answers, passthrough_python=False),
                  machine=lambda: "x86_64")
    return CheckContext(probe, DoctorOptions(env_file=env_file, graph_mode=graph_mode))


def without(text: str, name: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(f"{name}=")) + "\n"


def replaced(text: str, name: str, value: str) -> str:
    return without(text, name) + f'{name}="{value}"\n'


def test_environment_checks_are_discovered_with_pages() -> None:
    found = {c.id: c for c in discover_checks()}
    for check_id in ENV_IDS:
        assert found[check_id].area == "environment"
        page = (REPO / "checks" / "docs" / f"{check_id}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {check_id}: ")
        for section in ("**What it checks.**", "**Why it matters.**", "**How to fix.**"):
            assert section in page


def test_a_right_env_file_passes_every_check(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    ctx = env_context(fake_root, tmp_path, GOOD_ENV)
    checks = [c for c in discover_checks() if c.id in ENV_IDS]
    report = run_checks(checks, ctx)
    statuses = {o.check_id: o.result.status for o in report.outcomes}
    assert statuses == {i: Status.PASS for i in ENV_IDS}, [o.result for o in report.outcomes]


# --- ascend-env --------------------------------------------------------------------------------------------------


def test_ascend_env_passes_and_shows_what_it_read(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    result = AscendEnv().run(env_context(fake_root, tmp_path, GOOD_ENV))
    assert result.status is Status.PASS
    assert (result.evidence["home_var"], result.evidence["ascend_home"], result.evidence["nnal"]) == (
        "ASCEND_HOME_PATH", TOOLKIT, True)
    assert result.evidence["driver_lib_dirs"] == [f"{DRIVER}/lib64/driver"]
    assert result.evidence["env_source"].endswith("/env")


def test_ascend_env_follows_the_latest_symlink(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    text = GOOD_ENV.replace(f"{TOOLKIT}/lib64:", "/usr/local/Ascend/ascend-toolkit/8.3.RC2/lib64:")
    assert AscendEnv().run(env_context(fake_root, tmp_path, text)).status is Status.PASS


def test_ascend_env_accepts_the_toolkit_home_variable(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    result = AscendEnv().run(env_context(fake_root, tmp_path, without(GOOD_ENV, "ASCEND_HOME_PATH")))
    assert result.status is Status.PASS and result.evidence["home_var"] == "ASCEND_TOOLKIT_HOME"


def test_ascend_env_fails_when_nothing_is_set(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    result = AscendEnv().run(env_context(fake_root, tmp_path, "OMP_NUM_THREADS=1\n"))
    assert result.status is Status.FAIL
    assert result.evidence["problem_kinds"] == ["home-unset", "nnal", "driver"]
    # The fix names the env file to edit and the script whose values to copy into it.
    assert str(tmp_path / "env") in (result.remediation or "")
    assert "/usr/local/Ascend/ascend-toolkit/set_env.sh" in (result.remediation or "")


def test_ascend_env_fails_on_a_home_that_does_not_exist(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    text = replaced(GOOD_ENV, "ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/8.0.0")
    result = AscendEnv().run(env_context(fake_root, tmp_path, text))
    assert result.status is Status.FAIL and "home-missing" in result.evidence["problem_kinds"]
    assert result.evidence["ascend_home"] == "/usr/local/Ascend/ascend-toolkit/8.0.0"


def test_ascend_env_fails_without_the_driver_libraries(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    text = GOOD_ENV.replace(f":{DRIVER}/lib64/driver:{DRIVER}/lib64/common", "")
    result = AscendEnv().run(env_context(fake_root, tmp_path, text))
    assert result.status is Status.FAIL and result.evidence["problem_kinds"] == ["driver"]
    assert result.evidence["driver_lib_dirs"][0] == f"{DRIVER}/lib64/driver"


def test_ascend_env_accepts_driver_libraries_from_ld_so_conf(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    put(fake_root, "/etc/ld.so.conf.d/ascend-driver.conf", f"# driver\n{DRIVER}/lib64/driver\n")
    text = GOOD_ENV.replace(f":{DRIVER}/lib64/driver:{DRIVER}/lib64/common", "")
    assert AscendEnv().run(env_context(fake_root, tmp_path, text)).status is Status.PASS


def test_ascend_env_fails_without_the_toolkit_lib64(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    result = AscendEnv().run(env_context(fake_root, tmp_path, replaced(GOOD_ENV, "LD_LIBRARY_PATH",
                                                                       f"{ATB}/lib:{DRIVER}/lib64/driver")))
    assert result.status is Status.FAIL and result.evidence["problem_kinds"] == ["toolkit-lib64"]


def test_ascend_env_fails_on_unexpanded_variables_in_an_env_file(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    text = GOOD_ENV.replace(f'{DRIVER}/lib64/common"', f'{DRIVER}/lib64/common:$LD_LIBRARY_PATH"')
    result = AscendEnv().run(env_context(fake_root, tmp_path, text))
    assert result.status is Status.FAIL and result.evidence["problem_kinds"] == ["unexpanded"]
    assert result.evidence["ld_library_path"][-1] == "$LD_LIBRARY_PATH"


def test_ascend_env_does_not_ask_for_nnal_when_it_is_not_installed(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root, nnal=False)
    text = replaced(GOOD_ENV, "LD_LIBRARY_PATH", f"{TOOLKIT}/lib64:{DRIVER}/lib64/driver")
    result = AscendEnv().run(env_context(fake_root, tmp_path, text))
    assert result.status is Status.PASS and result.evidence["nnal"] is False


def test_ascend_env_reads_the_current_environment_without_an_env_file(fake_root: Path, tmp_path: Path) -> None:
    ascend_tree(fake_root)
    environ = {"ASCEND_HOME_PATH": TOOLKIT, "LD_LIBRARY_PATH": f"{ATB}/lib:{TOOLKIT}/lib64:{DRIVER}/lib64/driver"}
    result = AscendEnv().run(env_context(fake_root, tmp_path, None, environ=environ))
    assert result.status is Status.PASS and result.evidence["env_source"] == "the current environment"
    bad = AscendEnv().run(env_context(fake_root, tmp_path, None, environ={}))
    assert bad.status is Status.FAIL and bad.evidence["env_source"] == "the current environment"
    assert (bad.remediation or "").startswith("export ASCEND_HOME_PATH")  # no env file: how to set them in the shell


def test_ascend_env_skips_without_cann(fake_root: Path, tmp_path: Path) -> None:
    result = AscendEnv().run(env_context(fake_root, tmp_path, GOOD_ENV))
    assert result.status is Status.SKIP
    assert result.evidence["toolkit_path"].startswith("/usr/local/Ascend/ascend-toolkit/latest/")
    assert "`npuops provision --tags cann`" in (result.remediation or "")


def test_an_unreadable_env_file_is_bad_input(fake_root: Path, tmp_path: Path) -> None:
    probe = Probe(Settings(root=fake_root), runner=FakeRunner(passthrough_python=False))
    ctx = CheckContext(probe, DoctorOptions(env_file=tmp_path / "missing.env"))
    with pytest.raises(BadInputError):
        ThreadLimits().run(ctx)


# --- thread-limits -----------------------------------------------------------------------------------------------


def test_thread_limits_pass(fake_root: Path, tmp_path: Path) -> None:
    result = ThreadLimits().run(env_context(fake_root, tmp_path, GOOD_ENV))
    assert result.status is Status.PASS
    assert (result.evidence["OMP_NUM_THREADS"], result.evidence["OPENBLAS_NUM_THREADS"]) == ("1", "1")


def test_thread_limits_warn_when_unset_with_the_values_to_set(fake_root: Path, tmp_path: Path) -> None:
    result = ThreadLimits().run(env_context(fake_root, tmp_path, without(GOOD_ENV, "OPENBLAS_NUM_THREADS")))
    assert result.status is Status.WARN
    assert (result.evidence["OMP_NUM_THREADS"], result.evidence["OPENBLAS_NUM_THREADS"]) == ("1", None)
    env_file = tmp_path / "env"
    assert result.remediation == f"set OPENBLAS_NUM_THREADS=1 in {env_file} (or re-render it with `npuops launch`)"


def test_thread_limits_warn_on_values_that_are_not_positive(fake_root: Path, tmp_path: Path) -> None:
    text = replaced(replaced(GOOD_ENV, "OMP_NUM_THREADS", "0"), "OPENBLAS_NUM_THREADS", "all")
    result = ThreadLimits().run(env_context(fake_root, tmp_path, text))
    assert result.status is Status.WARN
    assert (result.evidence["OMP_NUM_THREADS"], result.evidence["OPENBLAS_NUM_THREADS"]) == ("0", "all")
    assert "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1" in (result.remediation or "")  # the values to set


def test_thread_limits_in_the_current_environment(fake_root: Path, tmp_path: Path) -> None:
    result = ThreadLimits().run(env_context(fake_root, tmp_path, None, environ={"OMP_NUM_THREADS": "4"}))
    assert result.status is Status.WARN and result.evidence["OPENBLAS_NUM_THREADS"] is None
    assert (result.remediation or "").startswith("export OPENBLAS_NUM_THREADS=1")


def test_thread_limits_on_a_host_without_npus_give_the_cpu_engines_advice(fake_root: Path, tmp_path: Path) -> None:
    """The vLLM CPU engine's OpenMP threads do the model's math: the NPU host's OMP_NUM_THREADS=1 would cripple it."""
    crippled = ThreadLimits().run(env_context(fake_root, tmp_path, None, environ={"OMP_NUM_THREADS": "1"}, npus=False))
    assert crippled.status is Status.WARN and crippled.evidence["engine"] == "cpu"
    assert "vLLM CPU engine's matrix math gets one thread" in crippled.message
    assert (crippled.remediation or "").startswith("unset OMP_NUM_THREADS for the CPU engine")
    assert "export OMP_NUM_THREADS=1" not in (crippled.remediation or "")
    for environ in ({}, {"OMP_NUM_THREADS": "8"}):
        fine = ThreadLimits().run(env_context(fake_root, tmp_path, None, environ=environ, npus=False))
        assert fine.status is Status.PASS and "VLLM_CPU_OMP_THREADS_BIND" in fine.message, environ


def test_alloc_conf_skips_without_npus(fake_root: Path, tmp_path: Path) -> None:
    result = AllocConf().run(env_context(fake_root, tmp_path, None, npus=False))
    assert result.status is Status.SKIP and result.message.startswith("no NPU")


# --- launch-blocking-graph ---------------------------------------------------------------------------------------


def test_launch_blocking_with_graph_mode_fails(fake_root: Path, tmp_path: Path) -> None:
    result = LaunchBlockingGraph().run(env_context(fake_root, tmp_path, GOOD_ENV + "ASCEND_LAUNCH_BLOCKING=1\n"))
    assert result.status is Status.FAIL
    assert (result.evidence["ASCEND_LAUNCH_BLOCKING"], result.evidence["graph_mode"]) == ("1", True)
    assert "remove ASCEND_LAUNCH_BLOCKING" in (result.remediation or "")


def test_launch_blocking_in_eager_mode_warns(fake_root: Path, tmp_path: Path) -> None:
    ctx = env_context(fake_root, tmp_path, GOOD_ENV + "ASCEND_LAUNCH_BLOCKING=1\n", graph_mode=False)
    result = LaunchBlockingGraph().run(ctx)
    assert result.status is Status.WARN
    assert (result.evidence["ASCEND_LAUNCH_BLOCKING"], result.evidence["graph_mode"]) == ("1", False)


@pytest.mark.parametrize("extra", ["", "ASCEND_LAUNCH_BLOCKING=0\n"])
def test_launch_blocking_off_passes(fake_root: Path, tmp_path: Path, extra: str) -> None:
    assert LaunchBlockingGraph().run(env_context(fake_root, tmp_path, GOOD_ENV + extra)).status is Status.PASS


# --- alloc-conf --------------------------------------------------------------------------------------------------


def test_parse_alloc_conf() -> None:
    assert parse_alloc_conf("expandable_segments:True, page_size:1g,") == (
        {"expandable_segments": "True", "page_size": "1g"}, [])
    assert parse_alloc_conf("expandable_segments=True") == ({}, ["expandable_segments=True"])


def test_alloc_conf_mixing_fails_and_says_what_to_keep(fake_root: Path, tmp_path: Path) -> None:
    text = replaced(GOOD_ENV, "PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:512")
    result = AllocConf().run(env_context(fake_root, tmp_path, text))
    assert result.status is Status.FAIL
    assert result.evidence["clashing"] == ["max_split_size_mb"]
    # What to keep: the value without the clashing option.
    assert (result.remediation or "").startswith(
        "drop max_split_size_mb: set PYTORCH_NPU_ALLOC_CONF=expandable_segments:True")


def test_alloc_conf_warns_when_unset(fake_root: Path, tmp_path: Path) -> None:
    result = AllocConf().run(env_context(fake_root, tmp_path, without(GOOD_ENV, "PYTORCH_NPU_ALLOC_CONF")))
    assert result.status is Status.WARN
    assert result.remediation is not None and "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in result.remediation


@pytest.mark.parametrize("value", ["max_split_size_mb:512", "expandable_segments:False,max_split_size_mb:512",
                                   "page_size:1g"])
def test_alloc_conf_warns_without_expandable_segments(fake_root: Path, tmp_path: Path, value: str) -> None:
    result = AllocConf().run(env_context(fake_root, tmp_path, replaced(GOOD_ENV, "PYTORCH_NPU_ALLOC_CONF", value)))
    assert result.status is Status.WARN
    assert result.evidence["PYTORCH_NPU_ALLOC_CONF"] == value and "malformed" not in result.evidence
    if "max_split" in value:
        assert result.remediation is not None and "drop max_split_size_mb" in result.remediation


def test_alloc_conf_warns_on_malformed_items(fake_root: Path, tmp_path: Path) -> None:
    text = replaced(GOOD_ENV, "PYTORCH_NPU_ALLOC_CONF", "expandable_segments=True")
    result = AllocConf().run(env_context(fake_root, tmp_path, text))
    assert result.status is Status.WARN and result.evidence["malformed"] == ["expandable_segments=True"]


# --- on this machine, as it is ----------------------------------------------------------------------------------


def test_environment_checks_on_this_machine_never_error() -> None:
    checks = [c for c in discover_checks() if c.id in ENV_IDS]
    ctx = CheckContext(Probe(Settings(environ=dict(os.environ))))
    report = run_checks(checks, ctx)
    by_id = {o.check_id: o.result for o in report.outcomes}
    assert all(r.status is not Status.ERROR for r in by_id.values()), by_id
    if not ctx.node.cann.toolkit.installed:
        assert by_id["ascend-env"].status is Status.SKIP
