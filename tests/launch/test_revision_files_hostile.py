"""What a rollout reads of an instance's revisions when something other than npuops put it there: a FIFO (which a
plain read waits on for ever), a document nested deeper than Python's parser goes (a RecursionError, once a
traceback), a file of gigabytes. Each is a one-line ConfigError naming the file and the fix, from `rollout
--history`, `rollout` and `rollout --undo` alike, before anything is written or stopped; `status` and a replica's
supervisor, which only look, see no rollout and no hold."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from npuops.errors import ConfigError
from npuops.instance.manager import SystemdManager
from npuops.instance.record import load_record
from npuops.instance.revisions import (
    MAX_FILE_BYTES,
    MAX_JSON_DEPTH,
    LaunchOrigin,
    RolloutProgress,
    held_out_of_router,
    loads_checked,
    read_history,
    read_history_listing,
    revision_dir,
    rollout_in_progress,
    stored_launch,
    write_progress,
)
from npuops.launch.local import Reporter
from npuops.launch.prepare import LaunchChoices
from npuops.launch.revision_store import keep_revision, stored_instance, stored_parts, with_revision
from npuops.launch.rollout import RolloutRequest, installed_files, rollout_instance
from npuops.settings import Settings
from tests.launch.test_revision_trust import _npuops_cli, _parts, _refusing_manager, _tree
from tests.launch.test_rollout_units import _installed
from tests.support.model_dirs import write_tiny_model

HISTORY_HEAD = '{"format": "npuops-revisions/1", "revisions": '


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# Each a revisions.json (or a launch.json, an instance.json) no npuops writes: nested past Python's parser (the
# review's two), and nested deeper than npuops writes but not so deep that the parser notices.
DEEP: dict[str, str] = {
    "100000 brackets": "[" * 100_000,
    "revisions nested 5000 deep": HISTORY_HEAD + _nested(5000) + "}",
    "an entry nested 900 deep": HISTORY_HEAD + "[" + _nested(900) + "]}",
    "an object nested 200 deep": '{"a": ' * 200 + "1" + "}" * 200,
}


@pytest.fixture()
def two_revisions(tmp_path: Path) -> tuple[Settings, SystemdManager]:
    """Instance m (two replicas behind a router) at revision 2, revision 1's files kept for --undo."""
    settings, _, request = _installed(write_tiny_model(tmp_path / "tiny-llama"), tmp_path, replicas=2)
    manager = _refusing_manager(tmp_path, settings.unit_dir, tmp_path / "run")
    parts = [with_revision(installed_files(p, manager), 2) for p in _parts(settings)]
    keep_revision(settings.state_dir, "m", 2, LaunchOrigin(request.to_json(), LaunchChoices(name="m", port=9100)
                                                           .to_json(), "rollout", ("no change",)), parts)
    return settings, manager


def _history(settings: Settings) -> Path:
    return settings.state_dir / "m" / "revisions.json"


def _refused_before_anything(settings: Settings, manager: SystemdManager, ask: RolloutRequest,
                             path: Path) -> ConfigError:
    before = _tree(settings.state_dir)
    with pytest.raises(ConfigError) as refused:
        rollout_instance(settings, manager, ask, Reporter(True))
    assert str(path) in refused.value.problem, refused.value.problem
    assert "\n" not in refused.value.one_line()
    assert _tree(settings.state_dir) == before
    return refused.value


ROLLOUT = RolloutRequest(name="m", allow_downtime=True)
UNDO = RolloutRequest(name="m", undo=True, allow_downtime=True)


# --- a FIFO -------------------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)  # before the fix each read below waited for a writer for ever
def test_a_fifo_for_the_history_is_refused_by_history_rollout_and_undo(
        two_revisions: tuple[Settings, SystemdManager]) -> None:
    settings, manager = two_revisions
    path = _history(settings)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ConfigError) as refused:
        read_history_listing(settings.state_dir, "m")
    assert refused.value.problem == f"{path} is a FIFO (not read: it could block forever)"
    assert "move it away" in refused.value.fix
    for ask in (ROLLOUT, UNDO):
        _refused_before_anything(settings, manager, ask, path)
    shown = _npuops_cli(settings, "rollout", "m", "--history")  # a subprocess with a timeout: a hang fails it
    assert shown.returncode == 3 and shown.stderr.count("\n") == 1 and "is a FIFO" in shown.stderr, shown


@pytest.mark.timeout(60)
def test_a_fifo_for_a_revision_s_launch_json_is_refused_by_undo_and_listed(
        two_revisions: tuple[Settings, SystemdManager]) -> None:
    settings, manager = two_revisions
    path = revision_dir(settings.state_dir, "m", 1) / "launch.json"
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ConfigError) as refused:
        stored_launch(settings.state_dir, "m", 1)
    assert "is a FIFO" in refused.value.problem
    assert _refused_before_anything(settings, manager, UNDO, path).fix.startswith(f"move {path.parent} away")
    shown = _npuops_cli(settings, "rollout", "m", "--history", "--json")
    assert shown.returncode == 0, shown.stderr
    first = next(r for r in json.loads(shown.stdout)["revisions"] if r["number"] == 1)
    assert first["files"] == "unreadable" and "is a FIFO" in first["files_problem"]


@pytest.mark.timeout(60)
def test_a_fifo_for_the_rollout_in_progress_or_a_hold_is_no_rollout_and_no_hold(
        two_revisions: tuple[Settings, SystemdManager]) -> None:
    """What `status` (as root) and a replica's supervisor read to see a rollout under way and a hold."""
    settings, _ = two_revisions
    write_progress(settings.state_dir, "m", RolloutProgress(os.getpid(), 1.0, 1, 2, "rollout", ("m-r0",)))
    assert rollout_in_progress(settings.state_dir, "m") is not None  # the reader reads what npuops writes
    progress = settings.state_dir / "m" / "rollout.json"
    progress.unlink()
    os.mkfifo(progress)
    assert rollout_in_progress(settings.state_dir, "m") is None
    replica = load_record(settings.state_dir, "m-r0")
    hold = replica.directory / "rollout-hold"
    hold.write_text(f"{os.getpid()} 1\n")
    assert held_out_of_router(replica) == os.getpid()
    hold.unlink()
    os.mkfifo(hold)
    assert held_out_of_router(replica) is None


# --- nesting and size ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", sorted(DEEP))
def test_a_deeply_nested_history_is_one_line_from_history_rollout_and_undo(
        two_revisions: tuple[Settings, SystemdManager], how: str) -> None:
    settings, manager = two_revisions
    path = _history(settings)
    path.write_text(DEEP[how])
    for read in (read_history, read_history_listing):
        with pytest.raises(ConfigError) as refused:
            read(settings.state_dir, "m")
        assert str(path) in refused.value.problem and "levels" in refused.value.problem, refused.value.problem
    for ask in (ROLLOUT, UNDO):
        _refused_before_anything(settings, manager, ask, path)
    if how == "100000 brackets":  # the command itself, once a traceback ("internal error")
        shown = _npuops_cli(settings, "rollout", "m", "--history")
        assert shown.returncode == 3 and shown.stderr.count("\n") == 1 and "Traceback" not in shown.stderr, shown


@pytest.mark.parametrize("how", sorted(DEEP))
def test_a_deeply_nested_launch_json_or_stored_record_is_one_line(two_revisions: tuple[Settings, SystemdManager],
                                                                   how: str) -> None:
    settings, manager = two_revisions
    path = revision_dir(settings.state_dir, "m", 1) / "launch.json"
    path.write_text(DEEP[how])
    _refused_before_anything(settings, manager, UNDO, path)
    record = revision_dir(settings.state_dir, "m", 2) / "m-r0" / "instance.json"
    record.write_text(DEEP[how])
    with pytest.raises(ConfigError) as refused:
        stored_instance("m-r0", stored_parts(settings.state_dir, "m", 2)["m-r0"], str(record.parent), "fix")
    assert "levels" in refused.value.problem


@pytest.mark.parametrize(("text", "deep"), [
    (_nested(MAX_JSON_DEPTH), False), (_nested(MAX_JSON_DEPTH + 1), True),
    ('{"a": ' * MAX_JSON_DEPTH + "{}" + "}" * MAX_JSON_DEPTH, True), ('{"a": ' * 31 + "1" + "}" * 31, False),
    ("[" + "[1], " * 10000 + "[]]", False),
])
def test_nesting_is_counted_to_the_deepest_container(text: str, deep: bool) -> None:
    check: Callable[[str], object] = loads_checked
    if deep:
        with pytest.raises(ValueError, match="nested deeper than"):
            check(text)
    else:
        assert check(text) == json.loads(text)


def test_a_history_of_gigabytes_is_refused_unread(two_revisions: tuple[Settings, SystemdManager]) -> None:
    settings, _ = two_revisions
    path = _history(settings)
    with path.open("r+b") as handle:
        handle.truncate(4 * 2**30)  # sparse: nothing on disk, 4 GiB to a reader
    with pytest.raises(ConfigError) as refused:
        read_history(settings.state_dir, "m")
    assert refused.value.problem == f"{path} is {4 * 2**30} bytes, more than the {MAX_FILE_BYTES} npuops reads of it"
