"""What a rollout reads of an instance's revisions, damaged or planted: the history, each revision's launch.json
(the request and choices it is planned again from), its stored files (--undo) and the files a group rollout stages
(--from-files). Each damage is a one-line error naming the file and the fix before anything is stopped, or an
entry `rollout --history` lists as unreadable; the revisions' secrets are 0600 in 0700 directories and go with
`remove`; an empty flag value is refused, not rolled out as "no change". No engine: the units' manager refuses
every start and stop, so a rollout that got past its checks fails loudly instead of switching."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.errors import BadInputError, ConfigError
from npuops.instance.control import remove_by_name
from npuops.instance.manager import SystemdManager
from npuops.instance.record import load_record
from npuops.instance.revisions import (
    LaunchOrigin,
    Revision,
    read_history,
    read_history_listing,
    revision_dir,
    stored_launch,
)
from npuops.launch.local import Reporter
from npuops.launch.prepare import LaunchChoices
from npuops.launch.revision_store import keep_group_revision, keep_revision, kept_launch, with_revision
from npuops.launch.rollout import RolloutRequest, installed_files, rollout_instance
from npuops.settings import Settings
from npuops.wire import WireFormatError
from tests.launch.test_rollout_units import _installed
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO

SECRET = "hf_rotatedSecretValue0123456789"


def _refusing_manager(tmp_path: Path, unit_dir: Path, run_dir: Path) -> SystemdManager:
    """A service manager that answers questions and refuses every start and stop: a rollout that gets past its
    checks fails there (ServiceManagerError) instead of switching, or of waiting for an engine."""
    script = tmp_path / "systemctl-refusing"
    script.write_text('#!/bin/sh\ncase "$1" in start|stop|restart) echo refused >&2; exit 1;; esac\nexit 0\n')
    script.chmod(0o755)
    return SystemdManager([str(script)], unit_dir, run_dir=run_dir)


@pytest.fixture()
def two_revisions(tmp_path: Path) -> tuple[Settings, SystemdManager]:
    """Instance m (two replicas behind a router) at revision 2, revision 1's files kept for --undo; its launch
    choices carry an --env secret."""
    settings, _, request = _installed(write_tiny_model(tmp_path / "tiny-llama"), tmp_path, replicas=2)
    manager = _refusing_manager(tmp_path, settings.unit_dir, tmp_path / "run")
    choices = LaunchChoices(name="m", port=9100, extra_env={"HF_TOKEN": SECRET})
    parts = [with_revision(installed_files(p, manager), 2) for p in _parts(settings)]
    keep_revision(settings.state_dir, "m", 2, LaunchOrigin(request.to_json(), choices.to_json(), "rollout",
                                                           ("no change",)), parts)
    return settings, manager


def _parts(settings: Settings) -> list[Any]:
    from npuops.instance.control import parts_of

    return parts_of(load_record(settings.state_dir, "m"))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and not p.name.endswith(".lock")}


def _history_path(settings: Settings) -> Path:
    return settings.state_dir / "m" / "revisions.json"


def _set_entry(settings: Settings, position: int, key: str, value: object) -> None:
    path = _history_path(settings)
    data = json.loads(path.read_text())
    data["revisions"][position][key] = value
    path.write_text(json.dumps(data))


# --- the history -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "said"), [
    ("at", 1e300, "at is 1e+300"), ("at", -1e18, "at is -1e+18"), ("at", math.nan, "at is nan"),
    ("at", math.inf, "at is inf"), ("number", 0, "number is 0"), ("number", -3, "number is -3"),
    ("number", 10**30, "not a revision number"), ("number", "2", "number is a string"),
    ("number", 1.5, "number is a number"), ("number", True, "number is a boolean"),
    ("number", 1, "revision 1 is in the history twice"), ("outcome", "bogus", "outcome is 'bogus'"),
    ("parts", "m-r0", "parts is a string"),
])
def test_a_history_entry_npuops_never_writes_is_refused_and_listed(two_revisions: tuple[Settings, SystemdManager],
                                                                   key: str, value: object, said: str) -> None:
    settings, manager = two_revisions
    _set_entry(settings, 1, key, value)  # revision 2's entry, the one serving
    with pytest.raises(ConfigError) as refused:
        read_history(settings.state_dir, "m")
    assert "entry 2" in refused.value.problem and said in refused.value.problem, refused.value.problem
    assert "--history" in refused.value.fix and "move it away" in refused.value.fix
    listing = read_history_listing(settings.state_dir, "m")
    assert [r.number for r in listing.revisions] == [1]
    assert [u.position for u in listing.unreadable] == [2] and said in listing.unreadable[0].problem
    before = _tree(settings.state_dir)
    with pytest.raises(ConfigError):  # a rollout and --undo refuse it before anything is planned or written
        rollout_instance(settings, manager, RolloutRequest(name="m", allow_downtime=True), Reporter(True))
    with pytest.raises(ConfigError):
        rollout_instance(settings, manager, RolloutRequest(name="m", undo=True, allow_downtime=True), Reporter(True))
    assert _tree(settings.state_dir) == before


def _npuops_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NPUOPS_STATE_DIR": str(settings.state_dir), "NPUOPS_UNIT_DIR": str(settings.unit_dir)}
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120, check=False)


def test_history_shows_what_reads_and_lists_what_does_not(two_revisions: tuple[Settings, SystemdManager]) -> None:
    """A time out of range once made `rollout --history` a traceback (localtime of 1e300); a launch.json without
    `request` is listed against its revision."""
    settings, _ = two_revisions
    _set_entry(settings, 0, "at", 1e300)
    (revision_dir(settings.state_dir, "m", 2) / "launch.json").write_text('{"choices": {}}')
    shown = _npuops_cli(settings, "rollout", "m", "--history")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    text = " ".join(shown.stdout.split())  # as wrapped to the terminal's width
    assert "revision 2 " in text and "revision 1 " not in text
    assert "entry 1 of" in text and "at is 1e+300" in text
    assert "files unreadable" in text and "lacks request" in text
    as_json = json.loads(_npuops_cli(settings, "rollout", "m", "--history", "--json").stdout)
    assert as_json["unreadable"][0]["entry"] == 1
    (entry,) = as_json["revisions"]
    assert entry["number"] == 2 and entry["files"] == "unreadable" and "lacks request" in entry["files_problem"]


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                         st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3)), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(entry=st.fixed_dictionaries({
    "number": st.one_of(st.integers(min_value=-5, max_value=2 * 10**9), JSON_SCALARS),
    "command": st.one_of(st.sampled_from(["launch", "rollout"]), JSON_VALUES)}, optional={
    "at": st.one_of(st.floats(min_value=-1e20, max_value=1e20), JSON_SCALARS),
    "changes": JSON_VALUES, "model_path": JSON_VALUES, "served_model_name": JSON_VALUES, "parts": JSON_VALUES,
    "outcome": st.one_of(st.sampled_from(["serving", "stopped"]), JSON_VALUES), "reason": JSON_VALUES}))
def test_any_history_entry_reads_as_a_revision_that_renders_or_is_refused(entry: dict[str, Any]) -> None:
    """Whatever an entry holds, it is a Revision whose number names a directory and whose time shows as a date,
    or a WireFormatError naming the key: never a TypeError, an OverflowError or a revision -3."""
    try:
        revision = Revision.from_json(entry)
    except WireFormatError as exc:
        assert exc.reason
        return
    assert isinstance(revision.number, int) and 1 <= revision.number
    assert str(revision.number).isdigit()
    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(revision.at))


# --- launch.json: what a rollout plans again ----------------------------------------------------------------------

def _launch(settings: Settings, number: int) -> dict[str, Any]:
    data = json.loads((revision_dir(settings.state_dir, "m", number) / "launch.json").read_text())
    assert isinstance(data, dict)
    return data


DAMAGED_LAUNCH: dict[str, Callable[[dict[str, Any]], object]] = {
    "not JSON": lambda kept: b"{",
    "not UTF-8": lambda kept: b"\xff\xfe",
    "a list": lambda kept: [],
    "without request": lambda kept: {"choices": kept["choices"]},
    "without choices": lambda kept: {"request": kept["request"]},
    "request a list": lambda kept: {**kept, "request": [1]},
    "model a number": lambda kept: {**kept, "request": {**kept["request"], "model": 3}},
    "hardware a number": lambda kept: {**kept, "request": {**kept["request"], "hardware": 5}},
    "workload a string": lambda kept: {**kept, "request": {**kept["request"], "workload": "x"}},
    "input_len a string": lambda kept: {**kept, "request": {**kept["request"], "workload": {"input_len": "x"}}},
    "an unknown fixed option": lambda kept: {**kept, "request": {**kept["request"], "fixed": {"evil": 1}}},
    "a fixed option of the wrong type": lambda kept: {**kept, "request": {**kept["request"],
                                                                           "fixed": {"max_num_seqs": "8"}}},
    "choices a string": lambda kept: {**kept, "choices": "x"},
    "vllm a number": lambda kept: {**kept, "choices": {**kept["choices"], "vllm": 5}},
    "port a string": lambda kept: {**kept, "choices": {**kept["choices"], "port": "x"}},
    "an env value a number": lambda kept: {**kept, "choices": {**kept["choices"], "extra_env": {"A": 1}}},
    "a name that is a path": lambda kept: {**kept, "choices": {**kept["choices"], "name": "../../etc"}},
}


def _damage_launch(settings: Settings, number: int, how: str) -> Path:
    path = revision_dir(settings.state_dir, "m", number) / "launch.json"
    damaged = DAMAGED_LAUNCH[how](_launch(settings, number))
    path.write_bytes(damaged if isinstance(damaged, bytes) else json.dumps(damaged).encode())
    return path


@pytest.mark.parametrize("how", sorted(DAMAGED_LAUNCH))
def test_a_damaged_launch_json_is_named_by_rollout_and_undo(two_revisions: tuple[Settings, SystemdManager],
                                                            how: str) -> None:
    """Revision 2's (the current one: `rollout` plans from it) and revision 1's (`--undo` returns to it): a
    ConfigError naming the file and how to go on, before anything is written or stopped."""
    settings, manager = two_revisions
    for number, ask in ((2, RolloutRequest(name="m", allow_downtime=True)),
                        (1, RolloutRequest(name="m", undo=True, allow_downtime=True))):
        path = _damage_launch(settings, number, how)
        before = _tree(settings.state_dir)
        with pytest.raises(ConfigError) as refused:
            rollout_instance(settings, manager, ask, Reporter(True))
        assert str(path) in refused.value.problem, (how, number, refused.value.problem)
        assert f"move {path.parent} away" in refused.value.fix
        assert _tree(settings.state_dir) == before


def _optional(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with any of `names` (the keys npuops writes, so the values reach the constructors) and others."""
    values = st.one_of(JSON_VALUES, st.integers(min_value=-3, max_value=70000))
    return st.fixed_dictionaries({}, optional={name: values for name in names}).flatmap(
        lambda known: st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=2).map(
            lambda other: {**other, **known}))


REQUEST_KEYS = ["model", "hardware", "nodes", "devices", "quantization", "multinode", "vllm_ascend_version",
                "replicas", "router_policy", "speculative", "spec_acceptance", "additional_config", "pd",
                "kv_port", "no_calibration"]
WORKLOAD_KEYS = ["input_len", "output_len", "concurrency", "request_rate", "objective", "fixed_lengths"]
FIXED_KEYS = ["max_num_seqs", "max_model_len", "dtype", "tp", "pp", "enforce_eager", "gpu_memory_utilization",
              "block_size", "shutdown_timeout", "stream_interval"]
CHOICE_KEYS = ["name", "host", "port", "api_key_file", "vllm", "service_user", "start_timeout_s", "watchdog_s",
               "stop_timeout_s", "extra_env", "foreground", "allow_root", "profiling"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=st.one_of(JSON_VALUES, _optional(REQUEST_KEYS)), workload=st.one_of(JSON_VALUES,
       _optional(WORKLOAD_KEYS)), fixed=st.one_of(JSON_VALUES, _optional(FIXED_KEYS)),
       choices=st.one_of(JSON_VALUES, _optional(CHOICE_KEYS)))
def test_any_kept_request_is_planned_again_or_named(tmp_path_factory: pytest.TempPathFactory, request: object,
                                                    workload: object, fixed: object, choices: object) -> None:
    """Whatever a launch.json holds, it reads as a request and choices of the types npuops writes, or as a
    ConfigError naming the file: never a KeyError, a TypeError or an AttributeError deep in planning."""
    state = tmp_path_factory.mktemp("kept")
    directory = revision_dir(state, "m", 1)
    directory.mkdir(parents=True)
    if isinstance(request, dict):
        request = {"model": "/models/m", **request, "workload": workload, "fixed": fixed}
    (directory / "launch.json").write_text(json.dumps({"request": request, "choices": choices}))
    try:
        kept = kept_launch(state, "m", 1)
    except ConfigError as exc:
        assert str(directory / "launch.json") in exc.problem
        return
    assert kept is not None
    if kept.request is not None:
        assert kept.request.workload.request_tokens >= 2 and isinstance(kept.request.hardware, str)
        with contextlib.suppress(BadInputError):  # a value out of its limits: one line, as for a flag
            kept.request.options  # noqa: B018 - what planning asks first: the options the request fixed
    if kept.choices is not None:
        assert all(isinstance(v, str) for v in kept.choices.extra_env.values())


# --- the stored and staged files ----------------------------------------------------------------------------------

def _part(settings: Settings, number: int, part: str = "m-r0") -> Path:
    return revision_dir(settings.state_dir, "m", number) / part


def _record_of(settings: Settings, part: str) -> dict[str, Any]:
    data = json.loads((_part(settings, 1, part) / "instance.json").read_text())
    assert isinstance(data, dict)
    return data


DAMAGED_PART: dict[str, Callable[[Settings, Path], None]] = {
    "a record that is not JSON": lambda s, d: (d / "instance.json").write_text("{"),
    "a record that is a list": lambda s, d: (d / "instance.json").write_text("[]"),
    "another part's record": lambda s, d: (d / "instance.json").write_text(json.dumps(_record_of(s, "m-r1"))),
    "a record whose status file is elsewhere": lambda s, d: (d / "instance.json").write_text(json.dumps(
        {**_record_of(s, "m-r0"), "status_file": "/etc/shadow"})),
    "a record whose directory is elsewhere": lambda s, d: (d / "instance.json").write_text(json.dumps(
        {**_record_of(s, "m-r0"), "instance_dir": "/var/tmp/elsewhere/m-r0"})),  # root writes a hold file there
    "an env file that is not UTF-8": lambda s, d: (d / "env").write_bytes(b"VLLM_API_KEY=\xff\n"),
    "an env file that links elsewhere": lambda s, d: ((d / "env").unlink(), (d / "env").symlink_to("/etc/shadow")),
    "a FIFO for an env file": lambda s, d: ((d / "env").unlink(), os.mkfifo(d / "env")),
    "a file no revision has": lambda s, d: (d / "evil.conf").write_text("x"),
    "no unit file": lambda s, d: (d / "npuops-m-r0.service").unlink(),
    "a part not named as an instance": lambda s, d: (d.parent / "Evil_Part").mkdir(),
}


@pytest.mark.timeout(120)  # before the fix a FIFO blocked the read for ever
@pytest.mark.parametrize("how", sorted(DAMAGED_PART))
def test_undo_refuses_stored_files_that_are_not_the_parts_own(two_revisions: tuple[Settings, SystemdManager],
                                                              how: str) -> None:
    settings, manager = two_revisions
    DAMAGED_PART[how](settings, _part(settings, 1))
    before = _tree(settings.state_dir)
    with pytest.raises(ConfigError) as refused:
        rollout_instance(settings, manager, RolloutRequest(name="m", undo=True, allow_downtime=True), Reporter(True))
    assert str(_part(settings, 1).parent) in refused.value.problem, refused.value.problem
    assert "move" in refused.value.fix or "launch" in refused.value.fix
    assert _tree(settings.state_dir) == before


@pytest.mark.parametrize("how", ["a record whose directory is elsewhere", "an env file that links elsewhere",
                                 "another part's record"])
def test_staged_files_of_a_group_rollout_are_checked_as_stored_ones(two_revisions: tuple[Settings, SystemdManager],
                                                                    tmp_path: Path, how: str) -> None:
    """`rollout NAME --from-files DIR --revision N` (what a group rollout runs on each host) installs only files
    that are the parts' own: never a link followed as root, never a record pointing at another file."""
    import shutil

    settings, manager = two_revisions
    staged = tmp_path / "incoming"
    for part in ("m-r0", "m-r1"):
        shutil.copytree(_part(settings, 1, part), staged / part)
    DAMAGED_PART[how](settings, staged / "m-r0")
    before = _tree(settings.state_dir)
    with pytest.raises(ConfigError) as refused:
        rollout_instance(settings, manager, RolloutRequest(name="m", from_files=staged, revision=3,
                                                           allow_downtime=True), Reporter(True))
    assert str(staged / "m-r0") in refused.value.problem or "m-r0" in refused.value.problem, refused.value.problem
    assert _tree(settings.state_dir) == before


# --- secrets kept with the revisions --------------------------------------------------------------------------------

def test_revisions_keep_an_env_value_private_and_remove_takes_it(two_revisions: tuple[Settings, SystemdManager],
                                                                 tmp_path: Path) -> None:
    """--undo restores a revision exactly, so its --env values and API key stay with it: only in 0600 files,
    under directories no other user can enter; `remove` deletes them all. The same on a controller's group store."""
    settings, _ = two_revisions
    group_store = tmp_path / "artifacts" / "revisions" / "g"
    keep_group_revision(group_store, "m", 1, LaunchOrigin({"model": "/m"}, {"extra_env": {"HF_TOKEN": SECRET}}),
                        "/m", "m", ("h1",))
    for root in (settings.state_dir / "m", group_store / "m"):
        holding = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
        assert holding, root  # the value is kept (for --undo), so it must be kept privately
        for path in holding:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        revisions = root / "revisions"
        for directory in [revisions, *(p for p in revisions.rglob("*") if p.is_dir())]:
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
        assert SECRET not in (root / "revisions.json").read_text()
    assert stored_launch(settings.state_dir, "m", 2) is not None
    stopped = tmp_path / "systemctl-stopped"  # every unit inactive; disable and daemon-reload succeed
    stopped.write_text('#!/bin/sh\n[ "$1" = show ] && echo ActiveState=inactive\nexit 0\n')
    stopped.chmod(0o755)
    manager = SystemdManager([str(stopped)], settings.unit_dir, run_dir=tmp_path / "run")
    remove_by_name(settings.state_dir, "m", manager, data_root=settings.service_data_root, lock_as="npuops remove")
    left = [p for p in settings.state_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert left == [] and not (settings.state_dir / "m").exists()


def test_a_revision_that_cannot_be_written_leaves_nothing(two_revisions: tuple[Settings, SystemdManager]) -> None:
    """A real failure (a part's directory is a file): one line naming it, and no half revision 3 behind."""
    settings, manager = two_revisions
    parts = [with_revision(installed_files(p, manager), 3) for p in _parts(settings)]
    blocker = revision_dir(settings.state_dir, "m", 3)
    blocker.mkdir(parents=True)
    (blocker / "m-r1").write_text("")  # m-r1's files cannot go there
    with pytest.raises(BadInputError) as refused:
        keep_revision(settings.state_dir, "m", 3, LaunchOrigin({"model": "/m"}, {}), parts)
    assert "m-r1" in refused.value.problem and "writable" in refused.value.fix
    assert sorted(p.name for p in blocker.rglob("*")) == ["m-r1"]  # what was there, and nothing of the set
    assert [r.number for r in read_history(settings.state_dir, "m")] == [1, 2]


# --- the command line -------------------------------------------------------------------------------------------------

EMPTY_VALUES = [("--model", ""), ("--model", "  "), ("--vllm", ""), ("--venv", ""), ("--verify-golden", ""),
                ("--tuned", ""), ("--devices", ""), ("--draft-model", ""), ("--additional-config", " ")]


def test_empty_values_are_refused_not_rolled_out_as_no_change(two_revisions: tuple[Settings, SystemdManager],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`rollout m --model ''` once restarted every replica as "no change"; `--venv ''` would have run the working
    directory's bin/vllm. And `--revision N` numbers staged files: alone it did nothing."""
    from npuops.cli.main import main

    settings, _ = two_revisions
    monkeypatch.setenv("NPUOPS_STATE_DIR", str(settings.state_dir))
    monkeypatch.setenv("NPUOPS_UNIT_DIR", str(settings.unit_dir))
    monkeypatch.setenv("NPUOPS_SYSTEMCTL", str(settings.state_dir.parent / "systemctl-refusing"))
    before = _tree(settings.state_dir)
    for flag, value in EMPTY_VALUES:
        with pytest.raises(SystemExit) as done:
            main(["rollout", "m", "--allow-downtime", f"{flag}={value}"])
        err = capsys.readouterr().err
        assert done.value.code == 2 and "is empty" in err and flag in err and "Traceback" not in err, (flag, err)
    with pytest.raises(SystemExit) as done:
        main(["rollout", "m", "--allow-downtime", "--revision", "3"])
    assert done.value.code == 2 and "--from-files" in capsys.readouterr().err
    assert _tree(settings.state_dir) == before


# --- what another host answers ------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(said=st.one_of(JSON_VALUES.map(json.dumps), st.text(max_size=20), JSON_VALUES))
def test_a_hosts_answer_to_its_switch_is_data_whatever_it_says(tmp_path_factory: pytest.TempPathFactory,
                                                               monkeypatch: pytest.MonkeyPatch, said: object) -> None:
    """A group rollout reads each host's `rollout --from-files --json` from the playbook's facts: a list, a
    string or an object with a non-string reason is a host that did not switch, never a traceback on the
    controller."""
    import npuops.launch.group_rollout as group_rollout
    from npuops.fleet.events import HostStats
    from npuops.fleet.host_results import HostResult, PlaybookRun
    from npuops.launch.group import GroupChoices, GroupLaunch
    from tests.launch.test_group_rollout_units import _parts as group_parts

    root = tmp_path_factory.mktemp("group")
    parts = group_parts(write_tiny_model(root / "tiny-llama"))
    answers = {p.host.name: HostResult(p.host.name, HostStats(ok=1), data={"npuops_switch": said}) for p in parts}
    run = PlaybookRun(Path("rollout-host.yml"), 0, "successful", answers, root / "artifacts", 1.0)
    monkeypatch.setattr(group_rollout, "run_playbook", lambda *a, **k: run)
    where = GroupChoices(inventory=root / "inventory", group="g", artifacts_dir=root / "artifacts")
    ask = group_rollout.GroupRolloutAsk(rollout=RolloutRequest(name="g"), where=where)
    launch = GroupLaunch(group="g", name="g", plan=None, parts=parts)  # type: ignore[arg-type]
    outcomes = group_rollout.switch_hosts(ask, launch, parts, 2, root / "staging", None)
    for outcome in outcomes:
        switched = isinstance(said, str) and outcome.switch is not None and outcome.switch.get("ok") is True
        assert outcome.ok == switched and isinstance(outcome.message, str)
