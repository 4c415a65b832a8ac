"""Hostile values through every renderer, read back by the consumer's own rules (hypothesis).

Each renderer either refuses a value (BadInputError, one line naming it) or writes it so that the consumer reads
back exactly that value and nothing else: systemd's unit-file and command-line syntax and its EnvironmentFile=
parser (ported in tests/support/unit_syntax.py, which tests/systemd/test_quoting.py checks against the real
systemd), npuops' own env-file reader, and YAML through PyYAML. A whole instance rendered with a hostile model
directory name, service user, host or --env value has exactly the settings of a benign one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from npuops.envfile import parse_env_file as npuops_env_file
from npuops.errors import BadInputError
from npuops.launch.instance_files import LaunchSpec, parse_env_assignments, render_instances
from npuops.launch.prepare import LaunchChoices, check_bind_address
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target
from npuops.templating import env_quote, systemd_quote, unit_text, unit_user, yaml_scalar
from tests.support.paths import REPO
from tests.support.unit_syntax import expand_specifiers, parse_env_file, parse_unit, split_command_line

# The pieces attackers and clumsy operators reach for, mixed with arbitrary text and file-name bytes that are
# not UTF-8 (as os.fsdecode hands them over).
PIECES = ["\n", "\r", "\x00", "\t", "\x1b", "\x7f", "%", "%n", "%%", "$", "$$", "${HOME}", "$(id)", "`id`", '"', "'",
          "\\", "\\n", ";", " ", "=", "#", "[Service]", "\nExecStartPre=+/bin/sh -c id", "\nUser=root", "é", "鍵",
          "\u2028", "a", "0"]
HOSTILE = st.one_of(
    st.text(max_size=60),
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.binary(max_size=30).map(os.fsdecode),
    st.text(alphabet="ab%$\\\"' ", min_size=200, max_size=5000),
)
UNSAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _refused_in_one_line(call: object, *args: object) -> BadInputError:
    with pytest.raises(BadInputError) as caught:
        call(*args)  # type: ignore[operator]
    assert "\n" not in caught.value.one_line(), caught.value.one_line()
    return caught.value


@FAST
@given(HOSTILE)
def test_a_command_line_argument_comes_back_whole(value: str) -> None:
    if UNSAFE.search(value):
        _refused_in_one_line(systemd_quote, value)
        return
    quoted = systemd_quote(value)
    assert "\n" not in quoted
    assert split_command_line(quoted) == [value]
    # Among other arguments too (nothing joins or splits its neighbours).
    assert split_command_line(" ".join([systemd_quote("/usr/bin/npuops"), quoted, "run"])) == [
        "/usr/bin/npuops", value, "run"]


@FAST
@given(HOSTILE)
def test_an_environment_value_comes_back_whole_and_alone(value: str) -> None:
    if UNSAFE.search(value):
        refused = _refused_in_one_line(env_quote, value)
        assert value not in refused.problem or not value  # a value that may be a key is not repeated
        return
    text = f"A={env_quote(value)}\nB={env_quote('after')}\n"
    assert parse_env_file(text) == {"A": value, "B": "after"}
    assert npuops_env_file(text) == {"A": value, "B": "after"}


@FAST
@given(HOSTILE)
def test_unit_text_stays_on_its_line(value: str) -> None:
    if UNSAFE.search(value):
        _refused_in_one_line(unit_text, value, "the test value")
        return
    rendered = unit_text(value, "the test value")
    unit = f"[Unit]\nDescription=vLLM {rendered} (npuops)\n[Service]\nUser=npuops\n"
    assert parse_unit(unit) == [("Unit", "Description", f"vLLM {rendered} (npuops)"),
                                ("Service", "User", "npuops")]
    assert expand_specifiers(rendered) == value


@FAST
@given(HOSTILE)
def test_a_yaml_scalar_loads_back_as_the_same_value(value: str) -> None:
    assert yaml.safe_load(f"key: {yaml_scalar(value)}\nnext: 1\n") == {"key": value, "next": 1}
    for nested in ({"k": value}, [value]):
        loaded = yaml.safe_load(f"key: {yaml_scalar(nested)}\n")
        assert json.loads(loaded["key"]) == nested


@FAST
@given(HOSTILE)
def test_only_plain_user_names_are_taken(value: str) -> None:
    if re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", value):
        assert unit_user(value) == value
    else:
        assert "--service-user" in _refused_in_one_line(unit_user, value).problem


@FAST
@given(HOSTILE)
def test_host_and_launch_choices_refuse_what_no_file_may_hold(value: str) -> None:
    try:
        check_bind_address(value)
    except BadInputError as exc:
        assert "--host" in exc.problem and "\n" not in exc.one_line()
    else:
        assert re.fullmatch(r"[0-9A-Za-z.:-]+", value), value  # an address or an RFC 1123 name, nothing else
    for choices in ({"service_user": value}, {"host": value}, {"name": value}, {"extra_env": {"HCCL_X": value}}):
        try:
            LaunchChoices(**choices)  # type: ignore[arg-type]
        except BadInputError as exc:
            assert "\n" not in exc.one_line()


@FAST
@given(HOSTILE)
def test_env_assignments_refuse_control_characters(value: str) -> None:
    try:
        parsed = parse_env_assignments([f"HCCL_X={value}"])
    except BadInputError as exc:
        assert UNSAFE.search(value) and "\n" not in exc.one_line()
    else:
        assert parsed == {"HCCL_X": value} and not UNSAFE.search(value)


def test_the_root_service_user_needs_allow_root_and_says_so() -> None:
    assert "--allow-root" in _refused_in_one_line(LaunchChoices, "vllm", "127.0.0.1", 8000, None, None,
                                                  "root").fix
    assert "empty" not in _refused_in_one_line(unit_user, "").problem
    allowed = LaunchChoices(service_user="root", allow_root=True)
    assert allowed.root_note is not None and "root" in allowed.root_note
    assert LaunchChoices().root_note is None


# -- a whole instance ------------------------------------------------------------------------------------------

TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
               "max_position_embeddings": 2048, "vocab_size": 1024, "torch_dtype": "float32",
               "tie_word_embeddings": False, "rms_norm_eps": 1e-6}


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile-models")


def _model(root: Path, name: str) -> Path:
    directory = root / name
    if not directory.exists():
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    return directory


def _render(root: Path, model_name: str, **spec: object) -> dict[str, str]:
    plan = make_plan(load_model(str(_model(root, model_name))), cpu_target(16 * 2**30, 2, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", enforce_eager=True))
    values: dict[str, object] = {"name": "demo", "api_key": "sk-key", "state_dir": Path("/etc/npuops")}
    values.update(spec)
    (instance,) = render_instances(plan, LaunchSpec(**values))  # type: ignore[arg-type]
    return {f.name: f.text for f in instance.files}


def _keys(unit: str) -> list[tuple[str, str]]:
    return [(section, key) for section, key, _ in parse_unit(unit)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(model_name=HOSTILE, user=HOSTILE, env_value=HOSTILE)
def test_a_hostile_instance_renders_the_settings_of_a_benign_one_or_is_refused(
        model_root: Path, model_name: str, user: str, env_value: str) -> None:
    # A directory name cannot hold "/" or NUL, nor be "." or ".."; the rest is fair game.
    assume(model_name not in ("", ".", "..") and "/" not in model_name and "\x00" not in model_name)
    assume(len(os.fsencode(model_name)) <= 255)
    benign = _render(model_root, "tiny-llama")
    try:
        files = _render(model_root, model_name, service_user=user, extra_env={"HCCL_X": env_value})
    except BadInputError as exc:
        assert "\n" not in exc.one_line()
        assert UNSAFE.search(model_name) or UNSAFE.search(env_value) or not re.fullmatch(
            r"[a-z_][a-z0-9_-]{0,31}", user), exc.one_line()
        return
    finally:
        shutil.rmtree(model_root / model_name, ignore_errors=True)
    unit = files["demo.service"] if "demo.service" in files else files["npuops-demo.service"]
    benign_unit = benign["npuops-demo.service"]
    assert _keys(unit) == _keys(benign_unit)
    settings_of = {(s, k): v for s, k, v in parse_unit(unit)}
    assert settings_of[("Service", "User")] == user and settings_of[("Service", "Group")] == user
    assert split_command_line(settings_of[("Service", "ExecStart")])[-1] == "demo"
    assert expand_specifiers(settings_of[("Unit", "Description")]) == f"vLLM demo serving {model_name} (npuops)"
    env = parse_env_file(files["env"])
    assert env["HCCL_X"] == env_value and set(env) == set(parse_env_file(benign["env"])) | {"HCCL_X"}
    served = yaml.safe_load(files["vllm.yaml"])
    assert served["served-model-name"] == model_name
    assert json.loads(files["instance.json"])["model_path"].endswith("/" + model_name)
    assert set(served) == set(yaml.safe_load(benign["vllm.yaml"]))


def test_an_instance_name_with_a_trailing_newline_is_refused_by_its_check() -> None:
    # `re.match(r"...$")` lets a final "\n" through; the name would then fail later with a message about a path.
    for name in ("demo\n", "demo\n\n", "de\nmo", "demo "):
        assert "instance name" in _refused_in_one_line(LaunchChoices, name).problem
    assert LaunchChoices(name="demo-1").name == "demo-1"


def test_a_directory_that_cannot_be_written_is_named_in_one_line(model_root: Path, tmp_path: Path) -> None:
    """Not a directory (as root a read-only mode would not stop the write; the same OSError path): the path and
    the fix, exit 3, no traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run([sys.executable, "-m", "npuops", "launch", str(_model(model_root, "tiny-llama")),
                           "--hardware", "cpu", "--dry-run", "--output", str(blocker / "out")],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot write {blocker}/out" in done.stderr and "Not a directory" in done.stderr, done.stderr
    assert "fix: give --output a directory you can write to" in done.stderr


@pytest.mark.parametrize(("change", "problem"), [
    ({"architectures": []}, "config.json names no architectures"),
    ({"architectures": None}, "config.json names no architectures"),
    ({"quantization_config": "fp8"}, "quantization_config is not a JSON object"),
    ({"quantization_config": ["w8a8"]}, "quantization_config is not a JSON object"),
])
def test_a_model_the_engine_would_fail_on_is_refused_before_launch(tmp_path: Path, change: dict[str, object],
                                                                   problem: str) -> None:
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**TINY_CONFIG, **change}))
    model = load_model(str(directory))
    assert any(problem in note for note in model.notes), model.notes  # plan warns
    with pytest.raises(BadInputError, match=problem) as refused:  # launch refuses, before anything is written
        _render(tmp_path, "broken")
    assert refused.value.fix and "\n" not in refused.value.one_line()


def test_weights_without_a_tokenizer_are_warned_about(tmp_path: Path) -> None:
    directory = _model(tmp_path, "no-tokenizer")
    assert not any("tokenizer" in note for note in load_model(str(directory)).notes)  # config alone: planning
    (directory / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    notes = load_model(str(directory)).notes
    assert any("has weights but no tokenizer files" in note and "fix: copy them" in note for note in notes), notes
    (directory / "tokenizer.json").write_text("{}")
    assert not any("tokenizer" in note for note in load_model(str(directory)).notes)


def test_a_unit_directory_that_cannot_be_written_leaves_no_record_behind(model_root: Path, tmp_path: Path) -> None:
    """The state files are written before the unit: when the unit cannot be, a fresh instance's record is
    removed again, or `list` would show an instance that has no unit."""
    from npuops.instance.manager import SystemdManager
    from npuops.instance.record import list_records
    from npuops.launch.install import install

    plan = make_plan(load_model(str(_model(model_root, "tiny-llama"))), cpu_target(16 * 2**30, 2, 1),
                     Workload(128, 32), PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32",
                                                    enforce_eager=True))
    state = tmp_path / "state"
    (instance,) = render_instances(plan, LaunchSpec(name="demo", state_dir=state))
    blocker = tmp_path / "units"
    blocker.write_text("")  # the unit directory is a file
    with pytest.raises(BadInputError) as refused:
        install([instance], state, SystemdManager(["/bin/true"], blocker))
    assert f"cannot write {blocker}/npuops-demo.service" in refused.value.problem
    assert list_records(state) == [] and not (state / "demo").exists()


def _render_routed(root: Path, model_name: str, **spec: object) -> dict[str, dict[str, str]]:
    plan = make_plan(load_model(str(_model(root, model_name))), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", enforce_eager=True, replicas=2))
    values: dict[str, object] = {"name": "m", "api_key": "sk-key", "state_dir": Path("/etc/npuops"), "port": 9100}
    values.update(spec)
    return {i.name: {f.name: f.text for f in i.files}
            for i in render_instances(plan, LaunchSpec(**values))}  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(model_name=HOSTILE, host=HOSTILE)
def test_a_hostile_routed_model_gives_the_router_exactly_its_command_line(
        model_root: Path, model_name: str, host: str) -> None:
    """router.json (the router's command line, read back by the router's own wrapper) and the router's and the
    replicas' units, with a hostile model directory name and --host (unchecked at this layer: the renderer alone
    must keep them whole)."""
    from npuops.instance.record import ROUTER_CONFIG_FILE
    from npuops.service.router_process import read_router_argv

    assume(model_name not in ("", ".", "..") and "/" not in model_name and "\x00" not in model_name)
    assume(len(os.fsencode(model_name)) <= 255)
    benign = _render_routed(model_root, "tiny-llama")
    try:
        rendered = _render_routed(model_root, model_name, host=host)
    except BadInputError as exc:
        assert "\n" not in exc.one_line()
        assert UNSAFE.search(model_name) or UNSAFE.search(host), exc.one_line()
        return
    finally:
        shutil.rmtree(model_root / model_name, ignore_errors=True)
    assert set(rendered) == set(benign) == {"m", "m-r0", "m-r1"}
    config = model_root / "router.json"
    config.write_text(rendered["m"][ROUTER_CONFIG_FILE], encoding="utf-8")
    config.with_name("benign.json").write_text(benign["m"][ROUTER_CONFIG_FILE], encoding="utf-8")
    expected = read_router_argv(str(config.with_name("benign.json")))
    expected[expected.index("--host") + 1] = host  # the replicas stay on loopback: only where it listens differs
    assert read_router_argv(str(config)) == expected
    for name, files in rendered.items():
        unit = next(text for file, text in files.items() if file.endswith(".service"))
        benign_unit = next(text for file, text in benign[name].items() if file.endswith(".service"))
        assert _keys(unit) == _keys(benign_unit), name
        assert parse_env_file(files["env"]).keys() == parse_env_file(benign[name]["env"]).keys()
