"""Revisions and the rollout's decisions without systemd: the history and each revision's files, the request and
choices a revision is re-planned from, a rollout's progress and a replica's hold, and what a rollout refuses before
it touches anything. The switch itself runs under real systemd (tests/systemd/test_rollout.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuops.errors import BadInputError, ConfigError
from npuops.instance.manager import SystemdManager
from npuops.instance.revisions import (
    KEEP_FILES,
    LaunchOrigin,
    Revision,
    RolloutProgress,
    clear_progress,
    held_out_of_router,
    hold_out_of_router,
    read_history,
    release_hold,
    request_changes,
    rollout_in_progress,
    stored_launch,
    stored_parts,
    write_progress,
)
from npuops.launch.install import install
from npuops.launch.instance_files import LaunchSpec, render_instances
from npuops.launch.local import Reporter
from npuops.launch.prepare import LaunchChoices
from npuops.launch.revision_store import keep_revision, next_revision, with_revision
from npuops.launch.rollout import RolloutRequest, rollout_instance
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, PlanRequest, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target
from npuops.settings import Settings
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny-llama")


def _installed(tiny: Path, tmp_path: Path, replicas: int) -> tuple[Settings, SystemdManager, PlanRequest]:
    """Instance "m" installed as a launch leaves it (replicas behind a router, or one engine) with revision 1 kept;
    every systemctl call answers 0 and says nothing (no unit is active)."""
    state_dir, unit_dir, run_dir = tmp_path / "etc", tmp_path / "units", tmp_path / "run"
    run_dir.mkdir()
    manager = SystemdManager(["/bin/true"], unit_dir, run_dir=run_dir)
    request = PlanRequest(model=str(tiny), hardware="cpu", replicas=replicas if replicas > 1 else None,
                          workload=Workload(128, 32), fixed={"dtype": "float32"})
    plan = make_plan(load_model(str(tiny)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32",
                                 replicas=replicas if replicas > 1 else None))
    spec = LaunchSpec(name="m", port=9100, api_key="sk-rollout", state_dir=state_dir)
    instances = [with_revision(i, 1) for i in render_instances(plan, spec)]
    install(instances, state_dir, manager)
    choices = LaunchChoices(name="m", port=9100, extra_env={"HCCL_CONNECT_TIMEOUT": "1200"})
    keep_revision(state_dir, "m", 1, LaunchOrigin(request.to_json(), choices.to_json()), instances)
    settings = Settings(state_dir=state_dir, unit_dir=unit_dir)
    return settings, manager, request


def test_a_launch_keeps_revision_one_with_its_files_request_and_choices(tiny: Path, tmp_path: Path) -> None:
    settings, _, request = _installed(tiny, tmp_path, replicas=2)
    state = settings.state_dir
    (first,) = read_history(state, "m")
    assert first.number == 1 and first.command == "launch" and first.outcome == "serving"
    assert first.parts == ("m-r0", "m-r1") and first.model_path == str(tiny.resolve())
    assert next_revision(state, "m") == 2
    parts = stored_parts(state, "m", 1)
    assert sorted(parts) == ["m-r0", "m-r1"]
    files = {f.name: f for f in parts["m-r0"]}
    assert sorted(files) == ["env", "instance.json", "npuops-m-r0.service", "vllm.yaml"]
    assert files["env"].mode == 0o600 and "sk-rollout" in files["env"].text
    assert json.loads(files["instance.json"].text)["revision"] == 1
    # The request and the choices (an --env value may be secret: 0600, under a 0700 directory) come back whole.
    launch = stored_launch(state, "m", 1)
    assert launch is not None and PlanRequest.from_json(launch["request"]) == request
    assert LaunchChoices.from_json(launch["choices"]).extra_env == {"HCCL_CONNECT_TIMEOUT": "1200"}
    assert (state / "m" / "revisions" / "1" / "launch.json").stat().st_mode & 0o777 == 0o600
    assert (state / "m" / "revisions").stat().st_mode & 0o777 == 0o700
    # The history itself holds no secret and is readable by status.
    history_text = (state / "m" / "revisions.json").read_text()
    assert "sk-rollout" not in history_text and "1200" not in history_text


def test_old_revisions_lose_their_files_but_not_their_history(tiny: Path, tmp_path: Path) -> None:
    settings, _, request = _installed(tiny, tmp_path, replicas=1)
    state = settings.state_dir
    (engine,) = [i for i in render_instances(
        make_plan(load_model(str(tiny)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                  PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32")),
        LaunchSpec(name="m", port=9100, state_dir=state))]
    for number in range(2, KEEP_FILES + 3):
        keep_revision(state, "m", number, LaunchOrigin(request.to_json(), {}, "rollout", ("x: 1 -> 2",)),
                      [with_revision(engine, number)])
    history = read_history(state, "m")
    assert [r.number for r in history] == list(range(1, KEEP_FILES + 3))
    assert [r.outcome for r in history] == ["superseded"] * (KEEP_FILES + 1) + ["serving"]
    kept = sorted(int(p.name) for p in (state / "m" / "revisions").iterdir())
    assert kept == list(range(3, KEEP_FILES + 3))
    assert stored_parts(state, "m", 1) == {} and stored_launch(state, "m", 1) is None


def test_a_damaged_history_is_named_with_its_fix(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "revisions.json").write_text('{"format": "npuops-revisions/1", "revisions": [{"at": 1}]}')
    with pytest.raises(ConfigError) as bad:
        read_history(tmp_path, "m")
    assert "not an npuops revision history" in bad.value.problem and "move it away" in bad.value.fix
    (tmp_path / "m" / "revisions.json").write_text("{")
    with pytest.raises(ConfigError, match="not readable JSON"):
        read_history(tmp_path, "m")
    assert read_history(tmp_path, "other") == []


def test_a_revision_entry_round_trips() -> None:
    entry = Revision(3, 1.5, "rollout", ("model: /a -> /b",), "/b", "tiny", ("m-r0",), "stopped", "m-r0: failed")
    assert Revision.from_json(json.loads(json.dumps(entry.to_json()))) == entry


def test_request_changes_name_each_value_that_differs() -> None:
    before = PlanRequest(model="/models/a", hardware="cpu", workload=Workload(128, 32), fixed={"max_num_seqs": 8})
    after = before.with_flags({"model": "/models/b", "max_num_seqs": 16, "output_len": 64})
    assert request_changes(before.to_json(), after.to_json()) == [
        "max_num_seqs: 8 -> 16", "model: /models/a -> /models/b", "output_len: 32 -> 64"]
    assert request_changes(before.to_json(), before.to_json()) == []
    assert PlanRequest.from_json(after.to_json()) == after
    # A key an older npuops did not write takes its default; a malformed request raises for its caller to name.
    assert PlanRequest.from_json({"model": "/m"}) == PlanRequest(model="/m")
    with pytest.raises(TypeError):
        PlanRequest.from_json({"model": "/m", "workload": ["x"]})


def test_launch_choices_round_trip() -> None:
    choices = LaunchChoices(name="m", host="0.0.0.0", port=9000, api_key_file=Path("/etc/key"),
                            vllm="/opt/v/bin/vllm", watchdog_s=90, extra_env={"A": "b c"})
    assert LaunchChoices.from_json(json.loads(json.dumps(choices.to_json()))) == choices
    with pytest.raises(BadInputError, match="launch choices are malformed"):
        LaunchChoices.from_json({"name": "m", "port": "x", "extra_env": 3})


def test_a_rollout_in_progress_and_a_hold_last_only_while_their_process_lives(tmp_path: Path) -> None:
    from tests.support.instance_records import make_record

    (tmp_path / "m").mkdir()
    progress = RolloutProgress(os.getpid(), 1.0, 1, 2, "rollout", ("m-r0", "m-r1"), ("m-r0",), ("m-r1",),
                               "switching")
    write_progress(tmp_path, "m", progress)
    assert rollout_in_progress(tmp_path, "m") == progress
    assert progress.describe() == ("rollout from revision 1 to 2 in progress: 1 of 2 part(s) done; m-r1: "
                                   "switching")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = int(gone.stdout)
    write_progress(tmp_path, "m", RolloutProgress(dead, 1.0, 1, 2, "rollout", ("m-r0",)))
    assert rollout_in_progress(tmp_path, "m") is None  # a killed rollout is no rollout in progress
    clear_progress(tmp_path, "m")
    assert rollout_in_progress(tmp_path, "m") is None

    record = make_record(tmp_path, "m-r0", behind="m")
    record.directory.mkdir()
    assert held_out_of_router(record) is None
    hold_out_of_router(record, os.getpid())
    assert held_out_of_router(record) == os.getpid()
    hold_out_of_router(record, dead)
    assert held_out_of_router(record) is None  # its rollout died: the next start joins the router
    release_hold(record)
    assert not (record.directory / "rollout-hold").exists()


def _refusal(settings: Settings, manager: SystemdManager, **ask: object) -> BadInputError:
    with pytest.raises(BadInputError) as refused:
        rollout_instance(settings, manager, RolloutRequest(name="m", **ask), Reporter(True))  # type: ignore[arg-type]
    return refused.value


def test_a_rollout_refuses_what_would_drop_requests_before_touching_anything(tiny: Path, tmp_path: Path) -> None:
    settings, manager, _ = _installed(tiny, tmp_path, replicas=2)
    def files() -> dict[str, bytes]:  # the rollout's lock file (.m.lock) aside
        return {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".lock"}

    before = files()
    everything = _refusal(settings, manager, max_unavailable=2)
    assert everything.problem == "--max-unavailable 2 would take all 2 replicas of m out at once"
    assert "--max-unavailable 1" in everything.fix
    down = _refusal(settings, manager)  # no unit is active under /bin/true
    assert down.problem.startswith("m-r0, m-r1 of m not running") and "npuops status m" in down.fix
    first = _refusal(settings, manager, undo=True, allow_downtime=True)
    assert "no earlier revision" in first.problem and "npuops rollout m --model DIR" in first.fix
    assert files() == before


def test_a_single_engine_is_rolled_only_with_downtime_allowed(tiny: Path, tmp_path: Path) -> None:
    settings, manager, _ = _installed(tiny, tmp_path, replicas=1)
    single = _refusal(settings, manager)
    assert "single engine serving its own port" in single.problem
    assert "--allow-downtime" in single.fix and "--dp 2" in single.fix


def test_an_instance_without_revisions_is_named(tiny: Path, tmp_path: Path) -> None:
    settings, manager, _ = _installed(tiny, tmp_path, replicas=1)
    (settings.state_dir / "m" / "revisions.json").unlink()
    old = _refusal(settings, manager, allow_downtime=True)
    assert "kept no revisions" in old.problem and "launch m again once" in old.fix


def _npuops(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NPUOPS_STATE_DIR": str(state_dir)}
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120)


def test_the_command_line_names_bad_input_in_one_line(tiny: Path, tmp_path: Path) -> None:
    settings, _, _ = _installed(tiny, tmp_path, replicas=2)
    state = settings.state_dir
    for args, said in [(("nosuch",), "no instance named 'nosuch'"),
                       (("m", "--undo", "--model", "/x"), "--undo returns to the revision before"),
                       (("m", "--vllm", "/a", "--venv", "/b"), "--vllm and --venv"),
                       (("m", "--history", "--undo"), "--history changes nothing"),
                       (("Bad Name",), "instance name 'Bad Name' is not usable")]:
        done = _npuops("rollout", *args, state_dir=state)
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    shown = _npuops("rollout", "m", "--history", "--json", state_dir=state)
    assert shown.returncode == 0, shown.stderr
    (entry,) = json.loads(shown.stdout)["revisions"]
    assert entry["number"] == 1 and entry["parts"] == ["m-r0", "m-r1"]
    text = _npuops("rollout", "m", "--history", state_dir=state).stdout
    assert text.startswith("revision 1  ") and "launch: serving  (tiny-llama)" in text


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=80))
def test_any_text_in_a_revision_survives_the_history_file(text: str) -> None:
    """Model paths, reasons and change lines are the operator's strings: quotes, newlines, NULs, surrogates-free
    unicode all come back as they went in (the history is JSON, written with json.dumps)."""
    import tempfile

    from npuops.instance.revisions import write_history

    entry = Revision(1, 2.0, "rollout", (text, f"model: {text} -> b"), text, text, ("m-r0",), "stopped", text)
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "m").mkdir()
        write_history(Path(directory), "m", [entry])
        assert read_history(Path(directory), "m") == [entry]
