"""Settings that name a path or a command, as root reads them: a path is absolute (a relative one would be resolved
against whatever directory root runs npuops from, and these paths go into units and removals), a command is not
empty (an empty systemctl was an IndexError in `stop`, and `list` took it without a word). Each refusal is one line
naming the setting where it was given (variable, config file, flag) and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuops.errors import ConfigError
from npuops.settings import load_settings
from tests.support.instance_node import Node, make_node, npuops_here

PATH_SETTINGS = ("root", "ascend_root", "venv", "state_dir", "unit_dir", "service_data_root")
COMMAND_SETTINGS = ("systemctl", "npu_smi", "hccn_tool")
RELATIVE = ("relative/dir", "dir", "./dir", "../dir", "~/dir", " /dir")


def _load(tmp_path: Path, environ: dict[str, str] | None = None, *, config: str | None = None,
          flags: dict[str, object] | None = None) -> object:
    config_file = None
    if config is not None:
        config_file = tmp_path / "config.toml"
        config_file.write_text(config, encoding="utf-8")
    return load_settings(environ or {}, config_file=config_file, flags=flags, home=tmp_path,
                         system_config=tmp_path / "none.toml")


def _refused(tmp_path: Path, *args: object, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, *args, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in refused.value.one_line()
    return refused.value


@pytest.mark.parametrize("name", PATH_SETTINGS)
@pytest.mark.parametrize("value", RELATIVE)
def test_a_relative_path_setting_is_refused_naming_where_it_was_given(tmp_path: Path, name: str,
                                                                      value: str) -> None:
    variable = f"NPUOPS_{name.upper()}"
    from_env = _refused(tmp_path, {variable: value})
    assert from_env.problem == f"environment {variable}: {name} = {value!r} is a relative path"
    assert from_env.fix.startswith(f"set {name} to an absolute path")
    from_file = _refused(tmp_path, config=f"{name} = {json.dumps(value)}\n")
    assert from_file.problem == f"{tmp_path / 'config.toml'}: {name} = {value!r} is a relative path"
    from_flag = _refused(tmp_path, flags={name: Path(value)})  # click hands a path flag over as a Path
    assert from_flag.problem.startswith(f"flag for {name}: ") and "relative path" in from_flag.problem


def test_absolute_paths_are_taken_as_given(tmp_path: Path) -> None:
    loaded = _load(tmp_path, {f"NPUOPS_{name.upper()}": f"/srv/{name}" for name in PATH_SETTINGS}
                   | {"NPUOPS_TOOL_DIRS": "/opt/tools::/usr/local/sbin"})
    for name in PATH_SETTINGS:
        assert getattr(loaded, name) == Path(f"/srv/{name}")
    assert loaded.tool_dirs == ("/opt/tools", "/usr/local/sbin")  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["/opt/tools:relative", "tools", "/a:./b"])
def test_a_relative_tool_dir_is_refused(tmp_path: Path, value: str) -> None:
    refused = _refused(tmp_path, {"NPUOPS_TOOL_DIRS": value})
    assert "NPUOPS_TOOL_DIRS" in refused.problem and "relative path" in refused.problem
    assert "relative path" in _refused(tmp_path, config=f"tool_dirs = {json.dumps(value.split(':'))}\n").problem


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_any_path_value_is_an_absolute_path_or_one_line(value: str) -> None:
    try:
        loaded = load_settings({"NPUOPS_STATE_DIR": value}, system_config=Path("/nonexistent/none.toml"))
    except ConfigError as exc:
        assert "\n" not in exc.one_line() and "NPUOPS_STATE_DIR" in exc.problem
        return
    assert loaded.state_dir.is_absolute() and str(loaded.state_dir) == str(Path(value))


@pytest.mark.parametrize("name", COMMAND_SETTINGS)
@pytest.mark.parametrize("value", ["", " ", "\t"])
def test_an_empty_command_is_refused_with_its_default(tmp_path: Path, name: str, value: str) -> None:
    variable = f"NPUOPS_{name.upper()}"
    refused = _refused(tmp_path, {variable: value})
    assert refused.problem == f"environment {variable}: {name} is empty"
    assert "a name on the search path or an absolute path" in refused.fix and "unset it for" in refused.fix
    assert _refused(tmp_path, config=f"{name} = {json.dumps(value)}\n").problem.endswith(f"{name} is empty")


@pytest.mark.parametrize(("name", "value", "said"), [
    ("systemctl", '"/usr/bin/systemctl', "is not a command line (No closing quotation)"),
    ("systemctl", "bin/systemctl3.py --root=/x", "is a relative path"),
    ("npu_smi", "./npu-smi", "is a relative path"),
    ("hccn_tool", "tools/hccn_tool", "is a relative path"),
    ("stack_python", "venv/bin/python", "is a relative path"),
])
def test_a_command_that_is_no_command_line_or_a_relative_path_is_refused(tmp_path: Path, name: str, value: str,
                                                                          said: str) -> None:
    refused = _refused(tmp_path, {f"NPUOPS_{name.upper()}": value})
    assert refused.problem.endswith(said), refused.problem


def test_commands_by_name_or_absolute_path_and_an_empty_stack_python_are_taken(tmp_path: Path) -> None:
    loaded = _load(tmp_path, {"NPUOPS_SYSTEMCTL": "/opt/systemctl3.py --root=/srv/root", "NPUOPS_NPU_SMI": "npu-smi",
                              "NPUOPS_HCCN_TOOL": "/usr/local/Ascend/driver/tools/hccn_tool",
                              "NPUOPS_STACK_PYTHON": ""})
    assert loaded.systemctl == "/opt/systemctl3.py --root=/srv/root"  # type: ignore[attr-defined]
    assert loaded.npu_smi == "npu-smi" and loaded.stack_python == ""  # type: ignore[attr-defined]


def test_a_config_file_nested_past_the_toml_parser_is_one_line(tmp_path: Path) -> None:
    refused = _refused(tmp_path, config="tool_dirs = " + "[" * 50_000 + "]" * 50_000 + "\n")
    assert "nests its values deeper" in refused.problem


# --- the commands -------------------------------------------------------------------------------------------------

@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return make_node(tmp_path, monkeypatch)


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("NPUOPS_SYSTEMCTL", "", "systemctl is empty"),
    ("NPUOPS_STATE_DIR", "relative/dir", "state_dir = 'relative/dir' is a relative path"),
    ("NPUOPS_UNIT_DIR", "units", "unit_dir = 'units' is a relative path"),
    ("NPUOPS_SERVICE_DATA_ROOT", "var-lib", "service_data_root = 'var-lib' is a relative path"),
])
@pytest.mark.parametrize("args", [("stop", "m"), ("list",), ("status", "m"), ("remove", "m")])
def test_the_commands_refuse_the_setting_before_they_act(node: Node, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], variable: str,
                                                         value: str, said: str, args: tuple[str, ...]) -> None:
    node.record("m")
    monkeypatch.chdir(node.root)  # where the relative paths would have led
    monkeypatch.setenv(variable, value)
    done = npuops_here(capsys, *args)
    assert done.code == 3 and done.err.startswith(f"npuops: error: environment {variable}: {said}; fix: "), done
    assert done.err.count("\n") == 1 and node.states() == {"npuops-m.service": "active"} and node.calls() == []
    assert (node.state / "m" / "instance.json").exists()
