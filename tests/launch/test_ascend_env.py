from __future__ import annotations

from pathlib import Path

from npuops.hardware.probe import Probe
from npuops.launch.ascend_env import capture_set_env, env_changes, parse_env0
from npuops.settings import Settings


def test_parse_env0_and_changes() -> None:
    before = parse_env0("PATH=/bin\0HOME=/root\0")
    after = parse_env0("PATH=/opt/x/bin:/bin\0HOME=/root\0ASCEND_HOME_PATH=/a\0_=/usr/bin/env\0WEIRD=a=b\0")
    assert env_changes(before, after) == {"PATH": "/opt/x/bin:/bin", "ASCEND_HOME_PATH": "/a", "WEIRD": "a=b"}


def test_capture_runs_the_scripts_in_a_clean_shell(tmp_path: Path) -> None:
    # A set_env.sh shaped like CANN's: exports derived from its own location, appends to LD_LIBRARY_PATH.
    script = tmp_path / "usr/local/Ascend/ascend-toolkit/set_env.sh"
    script.parent.mkdir(parents=True)
    script.write_text(
        'export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest\n'
        'export ASCEND_HOME_PATH=${ASCEND_TOOLKIT_HOME}\n'
        'export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64:${LD_LIBRARY_PATH}\n'
        'echo "noise that must not leak into the capture"\n'
    )
    weird = tmp_path / "dir with space" / "set_env.sh"
    weird.parent.mkdir()
    weird.write_text("export ATB_HOME_PATH='/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1'\n")
    probe = Probe(Settings(root=tmp_path, environ={"PATH": "/usr/bin:/bin", "SECRET_OF_CALLER": "x"}))
    env, error = capture_set_env(probe, ["/usr/local/Ascend/ascend-toolkit/set_env.sh",
                                         "/dir with space/set_env.sh"])
    assert error is None
    assert env["ASCEND_HOME_PATH"] == "/usr/local/Ascend/ascend-toolkit/latest"
    assert env["LD_LIBRARY_PATH"].startswith("/usr/local/Ascend/ascend-toolkit/latest/lib64")
    assert env["ATB_HOME_PATH"].endswith("cxx_abi_1")
    assert "SECRET_OF_CALLER" not in env


def test_a_failing_script_is_reported_not_raised(tmp_path: Path) -> None:
    script = tmp_path / "set_env.sh"
    script.write_text("return 7\n")
    env, error = capture_set_env(Probe(Settings(root=tmp_path)), ["/set_env.sh"])
    assert env == {} and error and "set_env.sh" in error
