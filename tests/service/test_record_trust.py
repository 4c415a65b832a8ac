"""A record cannot point root at a file: instance.json is held on read to the names and paths launch derives, a
record that is not is a row with its problem and fix, and `remove` deletes only the paths it derives itself, never
through a link. A record that is no record (not JSON, a number of 400 digits, nested 100,000 deep), or a state dir
that is a regular file, is one line in list, status, stop, remove and logs, never a traceback; `stop` of a routed
instance with a damaged replica record still stops that replica's unit and says why its record was not used."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from npuops.errors import ConfigError
from npuops.instance.membership import ClusterMembership
from npuops.instance.record import RECORD_FILE, load_record, scan_records
from tests.support.instance_node import Node, make_node, npuops_here

Edit = Callable[[dict[str, Any], Node], None]


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return make_node(tmp_path, monkeypatch)


def _edit(node: Node, name: str, change: Edit) -> Path:
    path = node.state / name / RECORD_FILE
    data = json.loads(path.read_text())
    change(data, node)
    path.write_text(json.dumps(data))
    return path


def _set(**values: Any) -> Edit:
    return lambda data, _node: data.update(values)


# Each names something launch never derives for instance "m" (a file of root's, another instance's unit, a path
# through `..`): the record is not used.
HOSTILE_RECORDS: dict[str, tuple[Edit, str]] = {
    "another instance's record": (_set(name="other"), "is not the record of m (it names instance 'other')"),
    "instance_dir elsewhere": (_set(instance_dir="/etc"), "instance_dir '/etc' is not a directory named m"),
    "instance_dir of another": (lambda d, n: d.update(instance_dir=str(n.state.parent / "x" / "m")),
                                "instance_dir"),
    "instance_dir through ..": (lambda d, n: d.update(instance_dir=str(n.state / "x" / ".." / "m")), "'..'"),
    "status_file /etc/passwd": (_set(status_file="/etc/passwd"), "status_file '/etc/passwd'"),
    "status_file of another": (lambda d, n: d.update(status_file=str(n.data_root / "npuops-x" / "supervisor.json")),
                               "status_file"),
    "status_file elsewhere": (_set(status_file="/home/npuops-m/supervisor.json"), "is not in"),
    "status_file through ..": (lambda d, n: d.update(
        status_file=str(n.data_root / "npuops-m" / ".." / "npuops-m" / "supervisor.json")), "'..'"),
    "foreground status_file in the data root": (_set(manager="foreground"), "is not in"),
    "unit of root's": (_set(unit="../../etc/passwd"), "unit '../../etc/passwd'"),
    "unit of another": (_set(unit="npuops-other.service"), "unit 'npuops-other.service'"),
    "ray unit of sshd": (_set(cluster={"strategy": "ray", "ray_unit": "ssh.service"}), "cluster.ray_unit"),
    "replica elsewhere": (_set(replicas=["../x"]), "replica '../x' is not an instance name"),
    "replica of another": (_set(replicas=["other-r0"]), "starting with 'm-'"),
    "behind another": (_set(behind="other"), "behind 'other'"),
    "profiler_dir /etc": (_set(profiler_dir="/etc"), "profiler_dir '/etc'"),
    "profiler_dir named so elsewhere": (_set(profiler_dir="/etc/npuops-m/profiles"),
                                        "profiler_dir '/etc/npuops-m/profiles' is not in a status directory of m"),
    "ray env file of root's": (_set(cluster={"strategy": "ray", "ray_env_file": "/etc/shadow"}),
                               "cluster.ray_env_file '/etc/shadow'"),
}


@pytest.mark.parametrize("case", HOSTILE_RECORDS)
def test_a_record_naming_what_launch_never_derives_is_not_used(node: Node, case: str) -> None:
    change, said = HOSTILE_RECORDS[case]
    node.record("m")
    path = _edit(node, "m", change)
    with pytest.raises(ConfigError) as refused:
        load_record(node.state, "m", node.data_root)
    assert said in refused.value.problem and str(path) in refused.value.problem, refused.value.problem
    assert "\n" not in refused.value.one_line() and "npuops launch" in refused.value.fix
    if case == "status_file elsewhere":  # a StateDirectory named so: launched with another data root, maybe
        assert refused.value.fix.startswith("set service_data_root to /home (NPUOPS_SERVICE_DATA_ROOT) as at its")
    records, unreadable = scan_records(node.state, node.data_root)
    assert records == [] and [(u.name, u.problem) for u in unreadable] == [("m", refused.value.problem)]


def test_every_record_launch_writes_is_used_and_only_those(node: Node) -> None:
    """What the checks accept: a router and its replicas under systemd, a foreground run, a Ray worker, a host's
    replica set (no unit), a part's profiler traces in its status directory, the data root unknown to the reader;
    beside them, a record naming a file of root's as its unit is a row."""
    router, *_ = node.routed("m")
    node.record("fg", manager="foreground", status_file=str(node.state / "fg" / "supervisor.json"))
    node.record("ray", role="ray-worker", unit="npuops-ray-ray.service",
                cluster=ClusterMembership("g", "ray", 1, "worker", (), "h1", ray_unit="npuops-ray-ray.service"),
                active=False)
    node.record("set", role="replicas", unit="", replicas=("set-r2",), status_file=str(node.state / "set" /
                                                                                           "supervisor.json"))
    node.record("prof", profiler_dir=str(node.data_root / "npuops-prof" / "profiles"))
    node.record("evil")
    _edit(node, "evil", _set(unit="../../etc/passwd"))
    records, unreadable = scan_records(node.state, node.data_root)
    assert sorted(r.name for r in records) == ["fg", "m", "m-r0", "m-r1", "prof", "ray", "set"]
    assert [u.name for u in unreadable] == ["evil"] and "unit '../../etc/passwd'" in unreadable[0].problem
    assert load_record(node.state, "m") == router  # the data root not given: npuops-m, wherever it lies


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
    | st.sampled_from(["..", "/etc/passwd", "../../x", "npuops-m.service", "m", "m-r0", "/", "npuops-m"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8)
FIELDS = ["name", "manager", "unit", "instance_dir", "status_file", "profiler_dir", "replicas", "behind", "cluster",
          "port", "devices", "role", "created_at", "vllm_command", "prediction"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=JSON_VALUES)
@example(field="port", value=10**400)
@example(field="created_at", value=-(10**400))
@example(field="status_file", value="/var/lib/npuops-m/../../../etc/passwd")
def test_whatever_a_field_holds_the_record_is_refused_in_one_line_or_confined(node: Node, field: str,
                                                                               value: Any) -> None:
    if not (node.state / "m").exists():
        node.record("m")
    (node.state / "m" / RECORD_FILE).write_text(json.dumps({**_benign(node), field: value}))
    try:
        record = load_record(node.state, "m", node.data_root)
    except ConfigError as refused:
        assert "\n" not in refused.one_line() and refused.one_line().isprintable()
        return
    assert record.name == "m" and Path(record.instance_dir) == node.state / "m"
    assert Path(record.status_file).parent in (node.state / "m", node.data_root / "npuops-m")
    assert set(record.units) <= {"npuops-m.service", "npuops-m-router.service", "npuops-m-ray.service"}
    assert all(r.startswith("m-") for r in record.replicas)


def _benign(node: Node) -> dict[str, Any]:
    return {
        "name": "m", "manager": "systemd", "unit": "npuops-m.service", "model_path": "/models/tiny",
        "served_model_name": "tiny", "host": "127.0.0.1", "port": 8000, "devices": [], "target_kind": "cpu",
        "hardware_label": "cpu", "vllm_command": ["/v/bin/vllm", "serve"], "instance_dir": str(node.state / "m"),
        "status_file": str(node.data_root / "npuops-m" / "supervisor.json"), "timeout_start_s": 600,
        "watchdog_s": 60, "stop_timeout_s": 30, "gpu_memory_utilization": 0.9, "graph_mode": False}


# --- remove deletes what it derives --------------------------------------------------------------------------------

def test_remove_deletes_no_file_a_record_names(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    """A record whose status_file is a file of root's and whose unit is `../` out of the unit directory: `remove`
    deletes npuops-m.service (found by its name) and m's files, and neither of those two."""
    precious, other = node.root / "shadow", node.root / "passwd"
    precious.write_text("root:x:0:0\n")
    other.write_text("keep me\n")
    node.record("m", active=False)
    _edit(node, "m", _set(status_file=str(precious), unit="../passwd"))
    done = npuops_here(capsys, "remove", "m", "--json")
    assert done.code == 0, done.err
    assert precious.read_text() == "root:x:0:0\n" and other.read_text() == "keep me\n"
    answer = json.loads(done.out)
    assert answer["units"] == ["npuops-m.service"] and not (node.units / "npuops-m.service").exists()
    assert answer["instances"] == ["m"] and not (node.state / "m").exists()
    # The status file launch derives is deleted; its directory (engine.log, traces) is kept, as derived.
    assert not (node.data_root / "npuops-m" / "supervisor.json").exists()
    assert answer["kept"] == [str(node.data_root / "npuops-m")]


def test_remove_follows_no_link_a_service_user_or_anyone_planted(node: Node,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The service user owns its data directory's contents; links in the instance directory are no launch's. A
    link is deleted, never what it points at: the status directory, revisions/ and the env file as links, and an
    instance directory that is itself a link."""
    elsewhere, keys, secret = node.root / "elsewhere", node.root / "keys", node.root / "secret"
    for directory in (elsewhere, keys):
        directory.mkdir()
    (elsewhere / "supervisor.json").write_text("not yours")
    (keys / "env").write_text("KEY=1")
    secret.write_text("secret")
    record = node.record("s", active=False)
    data_dir = Path(record.status_file).parent
    (data_dir / "supervisor.json").unlink()
    data_dir.rmdir()
    data_dir.symlink_to(elsewhere)
    (record.directory / "revisions").symlink_to(keys)
    (record.directory / "env").symlink_to(secret)
    moved = node.root / "moved-t"
    node.record("t", active=False)
    (node.state / "t").rename(moved)
    (node.state / "t").symlink_to(moved)
    (moved / "env").write_text("KEY=t")

    for name in ("s", "t"):
        done = npuops_here(capsys, "remove", name)
        assert done.code == 0, done.err
    assert (elsewhere / "supervisor.json").read_text() == "not yours"
    assert (keys / "env").read_text() == "KEY=1" and secret.read_text() == "secret"
    assert not os.path.lexists(record.directory)  # the links in it deleted, then the directory
    assert (moved / "env").read_text() == "KEY=t" and (moved / RECORD_FILE).exists()
    assert not (node.units / "npuops-t.service").exists()  # t's unit, found by its name, is uninstalled


# --- a record or a state dir that is not one: one line ---------------------------------------------------------

NOT_A_RECORD: dict[str, Callable[[Path], object]] = {
    "not JSON": lambda p: p.write_text("{not json"),
    "a list": lambda p: p.write_text("[1, 2]"),
    "a port of 400 digits": lambda p: p.write_text(p.read_text().replace('"port": 8000', '"port": 1' + "0" * 400)),
    "nested 100000 deep": lambda p: p.write_text('{"name": ' + "[" * 100000 + "]" * 100000 + "}"),
    "a name that is a number": lambda p: p.write_text(p.read_text().replace('"name": "m"', '"name": 7')),
}


@pytest.mark.parametrize("case", NOT_A_RECORD)
def test_a_stored_record_that_is_no_record_is_one_line_in_every_command(node: Node, case: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    node.record("m")
    NOT_A_RECORD[case](node.state / "m" / RECORD_FILE)
    ran = {args: npuops_here(capsys, *args) for args in [("list",), ("list", "--json"), ("status",), ("status", "m"),
                                                         ("logs", "m"), ("stop", "m"), ("remove", "m")]}
    for args, done in ran.items():
        assert done.code in (0, 1, 3) and "Traceback" not in done.err and "internal error" not in done.err, (args,
                                                                                                          done)
    assert ran[("list",)].code == 1 and "m: " in ran[("list",)].out and "; fix: " in ran[("list",)].out
    (row,) = json.loads(ran[("list", "--json")].out)["instances"]
    assert row["name"] == "m" and row["state"] == "unreadable" and row["problem"] and row["fix"]
    assert ran[("status",)].code == 1 and "m: unreadable" in ran[("status",)].out
    for args in (("status", "m"), ("logs", "m")):
        assert ran[args].code == 3 and ran[args].err.count("\n") == 1 and row["problem"] in ran[args].err
    # Its unit still runs: stop finds it in the unit directory and says why the record was not used.
    assert ran[("stop", "m")].code == 0 and node.states()["npuops-m.service"] == "inactive"
    assert f"m: record unreadable: {row['problem']}" in ran[("stop", "m")].out
    assert ran[("remove", "m")].code == 0 and not (node.state / "m").exists()


@pytest.mark.parametrize("args", [("list",), ("status",), ("status", "m"), ("stop", "m"), ("remove", "m"),
                                  ("logs", "m")])
def test_a_state_dir_that_is_a_file_is_said_so_not_no_instances(node: Node, args: tuple[str, ...],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    node.state.rename(node.root / "etc-was")
    node.state.write_text("I am a file\n")
    done = npuops_here(capsys, *args)
    assert done.code == 3, done
    assert done.err == (f"npuops: error: the state dir {node.state} is not a directory; fix: point state_dir "
                        "(NPUOPS_STATE_DIR, /etc/npuops/config.toml) at npuops' state directory, or move that file "
                        "out of the way\n")


# --- stop of a routed instance with a damaged replica record ----------------------------------------------------

DAMAGED_REPLICA: dict[str, Callable[[Path], object]] = {
    "a port of 400 digits": lambda p: p.write_text(p.read_text().replace('"port": 9102', '"port": 1' + "0" * 400)),
    "nested 100000 deep": lambda p: p.write_text(p.read_text().replace('"prediction": {}',
                                                                       '"prediction": ' + "[" * 10**5 + "]" * 10**5)),
    "another instance's unit": lambda p: p.write_text(p.read_text().replace("npuops-m-r1.service",
                                                                            "npuops-bystander.service")),
    "another name": lambda p: p.write_text(p.read_text().replace('"name": "m-r1"', '"name": "bystander"')),
}


@pytest.mark.parametrize("case", DAMAGED_REPLICA)
def test_stop_of_a_routed_instance_stops_the_replica_whose_record_is_damaged(
        node: Node, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    node.routed("m")
    bystander = node.record("bystander", port=9300)
    path = node.state / "m-r1" / RECORD_FILE
    before = path.read_text()
    DAMAGED_REPLICA[case](path)
    assert path.read_text() != before
    done = npuops_here(capsys, "stop", "m", "--json")
    assert done.code == 0, done.err
    answer = json.loads(done.out)
    assert answer["ok"] and answer["orphans"] == ["npuops-m-r1.service"]
    assert [u["name"] for u in answer["unreadable"]] == ["m-r1"] and answer["unreadable"][0]["fix"]
    assert {u: s for u, s in node.states().items() if s == "active"} == {bystander.unit: "active"}
    assert not any(bystander.unit in call for call in node.calls() if call.startswith("stop"))
    text = npuops_here(capsys, "stop", "m")
    assert "also npuops-m-r1.service" in text.out and "m-r1: record unreadable: " in text.out
