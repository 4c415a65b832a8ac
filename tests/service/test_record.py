"""The instance record: JSON round trip, write and load, listing, and the supervisor's status file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from npuops.errors import BadInputError, ConfigError
from npuops.instance.membership import ClusterMembership, ClusterNode
from npuops.instance.record import (
    RECORD_FILE,
    InstanceRecord,
    list_records,
    load_record,
    read_status,
    record_path,
    write_record,
    write_status,
)
from npuops.instance.state import Stage, SupervisorState
from tests.support.instance_records import make_record


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_json_round_trip(tmp_path: Path) -> None:
    record = make_record(tmp_path, devices=(0, 1, 2, 3), target_kind="npu", api_key=True,
                         prediction={"kv_cache_tokens": 123456, "fits": True})
    data = json.loads(json.dumps(record.to_json()))
    assert data["devices"] == [0, 1, 2, 3]
    assert data["vllm_command"] == ["/opt/npuops/venv/bin/vllm", "serve"]
    assert InstanceRecord.from_json(data, "test") == record


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    record = make_record(tmp_path)
    data = {**record.to_json(), "written_by_a_newer_npuops": 1}
    assert InstanceRecord.from_json(data, "test") == record


def test_derived_paths(tmp_path: Path) -> None:
    record = make_record(tmp_path)
    assert record.directory == tmp_path / "demo"
    assert record.config_file.parent == record.directory
    assert record.env_file.parent == record.directory
    assert record.engine_log.parent == Path(record.status_file).parent
    assert record.engine_argv == ["/opt/npuops/venv/bin/vllm", "serve", "/models/tiny", "--config",
                                  str(record.config_file)]


def test_write_then_load(tmp_path: Path) -> None:
    record = make_record(tmp_path)
    path = write_record(record)
    assert path == tmp_path / "demo" / RECORD_FILE == record_path(tmp_path, "demo")
    assert (path.stat().st_mode & 0o777) == 0o644
    assert path.read_text(encoding="utf-8").endswith("}\n")
    assert load_record(tmp_path, "demo") == record


def test_missing_instance_names_the_known_ones(tmp_path: Path) -> None:
    write_record(make_record(tmp_path, "alpha"))
    write_record(make_record(tmp_path, "beta"))
    with pytest.raises(BadInputError) as error:
        load_record(tmp_path, "gamma")
    assert "'gamma'" in error.value.problem
    assert "alpha, beta" in error.value.fix
    assert not isinstance(error.value, ConfigError)


def test_missing_instance_in_an_empty_state_dir(tmp_path: Path) -> None:
    with pytest.raises(BadInputError) as error:
        load_record(tmp_path / "never-created", "demo")
    assert "no instance was launched here yet" in error.value.fix


@pytest.mark.parametrize("name", ["../x", "Demo", "a/b", "", "-x", "x" * 49])
def test_invalid_name_is_bad_input(tmp_path: Path, name: str) -> None:
    with pytest.raises(BadInputError, match="not usable"):
        load_record(tmp_path, name)


def test_unreadable_record_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "demo" / RECORD_FILE).mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(BadInputError, match="is a directory, not a regular file"):
        load_record(tmp_path, "demo")


@pytest.mark.parametrize("text", ["{not json", "", '["a", "list"]', "42"], ids=["broken", "empty", "list", "number"])
def test_malformed_json_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "demo" / RECORD_FILE
    path.parent.mkdir()
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="re-create it") as error:
        load_record(tmp_path, "demo")
    assert str(path) in error.value.problem


@pytest.mark.parametrize(("key", "value"), [
    ("port", "eighty"),
    ("port", None),
    ("devices", ["zero"]),
    ("devices", 3),
    ("vllm_command", None),
    ("vllm_command", "/opt/npuops/venv/bin/vllm serve"),  # a string is not an argument list
])
def test_wrong_types_are_a_config_error(tmp_path: Path, key: str, value: Any) -> None:
    data = make_record(tmp_path).to_json()
    data[key] = value
    _write_json(tmp_path / "demo" / RECORD_FILE, data)
    with pytest.raises(ConfigError, match="is not an npuops instance record"):
        load_record(tmp_path, "demo")


@pytest.mark.parametrize("key", ["name", "port", "vllm_command", "status_file"])
def test_missing_fields_are_a_config_error(tmp_path: Path, key: str) -> None:
    data = make_record(tmp_path).to_json()
    del data[key]
    _write_json(tmp_path / "demo" / RECORD_FILE, data)
    with pytest.raises(ConfigError):
        load_record(tmp_path, "demo")


def test_list_records_skips_what_it_cannot_read(tmp_path: Path) -> None:
    write_record(make_record(tmp_path, "beta"))
    write_record(make_record(tmp_path, "alpha"))
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / RECORD_FILE).write_text("{oops", encoding="utf-8")
    _write_json(tmp_path / "wrong-types" / RECORD_FILE, {"name": "wrong-types", "port": "x"})
    _write_json(tmp_path / "Not_A_Name" / RECORD_FILE, make_record(tmp_path, "alpha").to_json())
    (tmp_path / "no-record").mkdir()
    (tmp_path / "is-a-dir" / RECORD_FILE).mkdir(parents=True)
    (tmp_path / "stray.txt").write_text("x", encoding="utf-8")
    assert [r.name for r in list_records(tmp_path)] == ["alpha", "beta"]


def test_list_records_of_a_missing_state_dir(tmp_path: Path) -> None:
    assert list_records(tmp_path / "nothing") == []


def test_read_status(tmp_path: Path) -> None:
    record = make_record(tmp_path)
    status_file = Path(record.status_file)
    assert read_status(record) is None
    status_file.parent.mkdir(parents=True)
    status_file.write_text("{garbage", encoding="utf-8")
    assert read_status(record) is None
    status_file.write_text("[1, 2]", encoding="utf-8")
    assert read_status(record) is None
    status_file.write_text('{"stage": "unknown-stage", "supervisor_pid": 42}', encoding="utf-8")
    assert read_status(record) is None  # not a supervisor's state
    # A writer of only some keys (an older npuops, a stand-in): the rest take their defaults.
    status_file.write_text('{"stage": "healthy", "supervisor_pid": 42}', encoding="utf-8")
    assert read_status(record) == SupervisorState("", 42, stage=Stage.HEALTHY)


def test_write_then_read_status(tmp_path: Path) -> None:
    record = make_record(tmp_path)
    state = SupervisorState.gate(record.name, "http://127.0.0.1:8000")
    write_status(record, state)
    assert (Path(record.status_file).stat().st_mode & 0o777) == 0o644
    assert read_status(record) == state


def test_a_cluster_record_round_trips_and_a_single_one_keeps_an_empty_cluster(tmp_path: Path) -> None:
    single = make_record(tmp_path)
    assert single.to_json()["cluster"] == {} and single.ray_unit is None and single.ray_cluster is None
    membership = ClusterMembership("serve", "ray", 1, "worker", (ClusterNode("h1", "10.0.0.1", "head"),
                                                                 ClusterNode("h2", "10.0.0.2", "worker")),
                                   "h1", 2, ray_unit="npuops-demo-ray.service", ray_address="10.0.0.1:6379",
                                   ray_command=("/opt/npuops/venv/bin/ray",), ray_resources={"NPU": 8.0},
                                   ray_auth="token", ray_env_file="/etc/npuops/demo/ray.env")
    record = make_record(tmp_path, cluster=membership)
    data = json.loads(json.dumps(record.to_json()))
    assert InstanceRecord.from_json(data, "test") == record
    assert record.ray_unit == "npuops-demo-ray.service" and record.ray_cluster == membership


@pytest.mark.parametrize("cluster", [[], {"group": "serve"}, {"strategy": "ray", "nodes": [{"name": "h1"}]},
                                     {"strategy": "ray", "ray_resources": {"NPU": "eight"}}])
def test_a_cluster_that_is_no_membership_is_a_config_error(tmp_path: Path, cluster: Any) -> None:
    data = {**make_record(tmp_path).to_json(), "cluster": cluster}
    with pytest.raises(ConfigError, match="is not an npuops instance record") as caught:
        InstanceRecord.from_json(data, "test")
    assert "\n" not in caught.value.one_line()


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("port", 99999999, "port 99999999 is outside 1..65535"),
    ("port", "8000", "port must be int"),
    ("devices", [0, 99999999999], "devices 99999999999 is outside 0..63"),
    ("devices", "0-3", "devices must be a list"),
    ("model_path", None, "model_path is null"),
    ("instance_dir", None, "instance_dir is null"),
    ("watchdog_s", float("nan"), "watchdog_s must be int"),
    ("gpu_memory_utilization", 7, "gpu_memory_utilization 7 is outside 0..1"),
    ("metrics_port", -1, "metrics_port -1 is outside 1..65535"),
    ("vllm_command", ["vllm", 3], "vllm_command must be a list of str"),
    ("graph_mode", "yes", "graph_mode must be bool"),
])
def test_each_field_is_checked_when_a_record_is_read(tmp_path: Path, field: str, value: Any, problem: str) -> None:
    """A number out of range or a null path in one record is named when it is read, not met later as a crash
    (a socket's OverflowError, Path(None)) in every command that lists the instances."""
    data = {**make_record(tmp_path).to_json(), field: value}
    with pytest.raises(ConfigError) as caught:
        InstanceRecord.from_json(data, "rec.json")
    assert problem in caught.value.problem and "rec.json" in caught.value.problem, caught.value.problem
    assert "\n" not in caught.value.one_line()
    # One bad record does not break the reading of the others.
    good = make_record(tmp_path, name="good")
    write_record(good)
    _write_json(tmp_path / "bad" / RECORD_FILE, {**make_record(tmp_path, name="bad").to_json(), field: value})
    assert [r.name for r in list_records(tmp_path)] == ["good"]
