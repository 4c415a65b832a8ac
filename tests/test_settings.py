from __future__ import annotations

from pathlib import Path

import pytest

from npuops.errors import ConfigError, ExitCode
from npuops.settings import Settings, load_settings


def test_defaults_without_any_source(tmp_path: Path) -> None:
    s = load_settings({}, home=tmp_path, system_config=tmp_path / "none.toml")
    assert s.ascend_root == Path("/usr/local/Ascend")
    assert s.npu_smi == "npu-smi"
    assert s.command_timeout_s == Settings().command_timeout_s


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    system = tmp_path / "system.toml"
    system.write_text('ascend_root = "/sys-level"\nnpu_smi = "/sys/npu-smi"\ncommand_timeout_s = 3\n')
    user = tmp_path / ".config" / "npuops" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[npuops]\nascend_root = "/user-level"\nhccn_tool = "/user/hccn"\n')
    explicit = tmp_path / "explicit.toml"
    explicit.write_text('ascend_root = "/explicit-level"\nstack_python = "/x/python"\n')
    env = {"NPUOPS_ASCEND_ROOT": "/env-level", "NPUOPS_COMMAND_TIMEOUT_S": "7.5", "PATH": "/bin"}

    s = load_settings(env, config_file=explicit, home=tmp_path, system_config=system,
                      flags={"ascend_root": Path("/flag-level"), "npu_smi": None})
    assert s.ascend_root == Path("/flag-level")  # flag beats env
    assert s.command_timeout_s == 7.5  # env beats system file
    assert s.stack_python == "/x/python"  # explicit file
    assert s.hccn_tool == "/user/hccn"  # user file
    assert s.npu_smi == "/sys/npu-smi"  # system file, flag None does not override
    assert s.environ["PATH"] == "/bin"

    s2 = load_settings(env, config_file=explicit, home=tmp_path, system_config=system)
    assert s2.ascend_root == Path("/env-level")
    s3 = load_settings({}, config_file=explicit, home=tmp_path, system_config=system)
    assert s3.ascend_root == Path("/explicit-level")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("ascend_root = [1, 2]", "not a valid path"),
        ("command_timeout_s = 'soon'", "not a valid float"),
        ("command_timeout_s = -1", "outside its range"),
        ("no_such_key = 1", "unknown setting 'no_such_key'"),
        ("ascend_root = ", "not valid TOML"),
    ],
)
def test_bad_config_file_is_a_config_error(tmp_path: Path, content: str, fragment: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_settings({}, config_file=cfg, home=tmp_path, system_config=tmp_path / "none")
    assert fragment in info.value.one_line()
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert "\n" not in info.value.one_line()


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings({}, config_file=tmp_path / "nope.toml", home=tmp_path, system_config=tmp_path / "none")


def test_host_path_maps_under_root(tmp_path: Path) -> None:
    s = Settings(root=tmp_path)
    assert s.host_path("/etc/os-release") == tmp_path / "etc" / "os-release"
    assert s.ascend_path("driver", "version.info") == tmp_path / "usr/local/Ascend/driver/version.info"


def test_search_path_appends_vendor_tool_dirs() -> None:
    s = Settings(environ={"PATH": "/usr/bin:/bin"})
    assert s.search_path().split(":")[:2] == ["/usr/bin", "/bin"]
    assert "/usr/local/Ascend/driver/tools" in s.search_path().split(":")


def test_other_tools_npuops_variables_are_ignored(tmp_path: Path) -> None:
    s = load_settings({"NPUOPS_REFRESH_GOLDEN": "1", "NPUOPS_ENGINE_PYTHON": "/x"}, home=tmp_path,
                      system_config=tmp_path / "none")
    assert s.ascend_root == Path("/usr/local/Ascend")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5", "0", "1e9"])
def test_a_timeout_outside_its_range_names_the_variable_and_the_range(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"NPUOPS_COMMAND_TIMEOUT_S": value}, system_config=tmp_path / "none.toml")
    assert "NPUOPS_COMMAND_TIMEOUT_S" in refused.value.problem and "outside its range" in refused.value.problem
    assert "above 0 and at most 86400" in refused.value.fix
    assert load_settings({"NPUOPS_COMMAND_TIMEOUT_S": "2.5"},
                         system_config=tmp_path / "none.toml").command_timeout_s == 2.5
