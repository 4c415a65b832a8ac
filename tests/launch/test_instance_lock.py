"""One lock per instance: launch, rollout, stop and remove take it, a second one is refused at once naming the
command that holds it (its pid, since when), and nothing of the instance changes meanwhile. A rollout does not wait
for itself (it removes its surge replica in-process); a foreground run holds it while its files are written, not
while it serves, so `npuops stop NAME` stops it. The lock file is opened without following a link and keeps its
inode (its holder writes through it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from npuops.errors import BadInputError, ConfigError
from npuops.instance.control import remove_by_name
from npuops.instance.lock import instance_lock
from npuops.instance.manager import service_manager
from npuops.launch.instance_files import InstanceFiles, LaunchSpec, render_instances
from npuops.launch.local import Reporter, launch_foreground, launch_service
from npuops.launch.rollout import RolloutRequest, rollout_instance
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target
from npuops.service.gate import GateReport
from npuops.settings import Settings, load_settings
from tests.support.http_server import free_port
from tests.support.instance_node import Node, make_node, npuops_here
from tests.support.instance_records import make_record
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO

HOLD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from npuops.instance.lock import instance_lock
    with instance_lock(Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]):
        print("held", flush=True)
        sys.stdin.read()
""")


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return make_node(tmp_path, monkeypatch)


@pytest.fixture
def rollout_of_m(node: Node) -> Iterator[subprocess.Popen[str]]:
    """Another process holding m's lock as `npuops rollout` does, until the test ends."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(node.state), "m", "npuops rollout"], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    yield holder
    holder.communicate("", timeout=30)


def _settings(node: Node) -> Settings:
    return load_settings(dict(os.environ))


def test_stop_and_remove_during_a_rollout_are_refused_naming_it(node: Node, rollout_of_m: subprocess.Popen[str],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    records = node.routed("m")
    files = sorted(p for p in node.root.rglob("*") if p.is_file() and p.suffix != ".lock")
    contents = {p: p.read_bytes() for p in files if p.name != "calls.log"}
    for args in (("stop", "m"), ("stop", "m-r0"), ("remove", "m", "--force"), ("remove", "m-r1", "--force")):
        done = npuops_here(capsys, *args)
        assert done.code == 3, (args, done)
        assert done.err.startswith(f"npuops: error: npuops rollout of 'm' (pid {rollout_of_m.pid}, since "), done.err
        assert "holds m's lock; fix: wait for it to finish, or stop it" in done.err and done.err.count("\n") == 1
    # Nothing stopped, nothing deleted: no half-removed instance whose enabled unit has lost its env file.
    assert not [call for call in node.calls() if not call.startswith("show")]
    assert set(node.states().values()) == {"active"} and all(p.read_bytes() == b for p, b in contents.items())
    assert all(r.directory.is_dir() for r in records)
    rollout_of_m.communicate("", timeout=30)  # the rollout ends: stop goes ahead
    done = npuops_here(capsys, "stop", "m")
    assert done.code == 0 and set(node.states().values()) == {"inactive"}, done


def test_a_second_rollout_or_a_launch_names_the_rollout_and_a_rollout_does_not_wait_for_itself(
        node: Node) -> None:
    node.routed("m")
    surge = node.record("m-surge", behind="m", port=9109, active=False)
    settings = _settings(node)
    manager = service_manager(settings)
    with instance_lock(node.state, ["m"], "npuops rollout"):
        with pytest.raises(BadInputError) as second:
            rollout_instance(settings, manager, RolloutRequest(name="m"), Reporter(True))
        assert second.value.problem.startswith(f"npuops rollout of 'm' (pid {os.getpid()}, since ")
        assert second.value.problem.endswith("holds m's lock")
        with pytest.raises(BadInputError) as launch:
            launch_service([InstanceFiles("m", (), "npuops-m.service", surge)], settings, manager, api_key=None,
                           as_json=True, notes=(), service_user="npuops")
        assert launch.value.problem.startswith("npuops rollout of 'm' (pid ")
        # What a rollout does in-process while it holds the lock (its surge replica retired) takes no lock again.
        removed = remove_by_name(node.state, "m-surge", manager, force=True, data_root=node.data_root)
        assert removed.instances == ("m-surge",) and not surge.directory.exists()


def test_the_lock_file_is_named_by_its_holder_and_never_a_link(node: Node,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    node.record("m")
    lock = node.state / ".m.lock"
    victim = node.root / "victim"
    victim.write_text("root's\n")
    lock.symlink_to(victim)
    done = npuops_here(capsys, "stop", "m")
    assert done.code == 3 and done.err == (f"npuops: error: the lock file {lock} is a symbolic link; fix: remove the "
                                           f"link (`rm {lock}`): npuops creates its lock files itself\n")
    assert victim.read_text() == "root's\n" and node.states()["npuops-m.service"] == "active"
    lock.unlink()
    os.mkfifo(lock)  # a FIFO is named, not waited on
    done = npuops_here(capsys, "remove", "m", "--force")
    assert done.code == 3 and f"the lock file {lock} is not a regular file" in done.err
    lock.unlink()
    os.link(victim, lock)
    done = npuops_here(capsys, "stop", "m")
    assert done.code == 3 and "is a file with other links to it" in done.err and victim.read_text() == "root's\n"
    lock.unlink()

    done = npuops_here(capsys, "stop", "m")
    assert done.code == 0 and node.states()["npuops-m.service"] == "inactive", done
    inode = lock.stat().st_ino
    holder = json.loads(lock.read_text())
    assert (holder["command"], holder["instance"], holder["pid"]) == ("npuops stop", "m", os.getpid())
    with instance_lock(node.state, ["m"], "npuops launch"):  # released; the same inode, rewritten by its holder
        assert lock.stat().st_ino == inode and json.loads(lock.read_text())["command"] == "npuops launch"


def test_a_foreground_run_holds_the_lock_while_its_files_are_written_not_while_it_serves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "engine" (a script in vllm's place) tries the lock as `npuops stop` would, from another process:
    free. It exits, so the run ends at once. (The start gate passes: this host's /dev/shm is not the point.)"""
    monkeypatch.setattr("npuops.launch.local.run_gate", lambda record, settings: GateReport((), 0.0))
    tiny = write_tiny_model(tmp_path / "tiny")
    saw = tmp_path / "saw"
    engine = tmp_path / "engine.py"
    engine.write_text(textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from npuops.errors import BadInputError
        from npuops.instance.lock import instance_lock
        try:
            with instance_lock(Path({str(tmp_path / "etc")!r}), ["fg"], "npuops stop"):
                Path({str(saw)!r}).write_text("free")
        except BadInputError as exc:
            Path({str(saw)!r}).write_text(exc.problem)
        sys.exit(1)
    """))
    plan = make_plan(load_model(str(tiny)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32"))
    spec = LaunchSpec(name="fg", port=free_port(), state_dir=tmp_path / "etc", manager="foreground",
                      vllm_command=(sys.executable, str(engine)))
    (instance,) = render_instances(plan, spec)
    settings = Settings(state_dir=tmp_path / "etc")
    code = launch_foreground(instance, settings, api_key=None, as_json=True, notes=(),
                             environ={**os.environ, "PYTHONPATH": str(REPO)})
    assert code != 0 and saw.read_text() == "free"


def test_a_launch_refuses_to_replace_a_foreground_run(node: Node) -> None:
    """Its lock is free while it serves, but a launch of its name does not kill it behind the operator's back."""
    record = node.record("fg", manager="foreground", status_file=str(node.state / "fg" / "supervisor.json"))
    Path(record.status_file).write_text(json.dumps({"supervisor_pid": os.getpid(), "stage": "healthy"}))
    settings = _settings(node)
    with pytest.raises(BadInputError) as refused:
        launch_service([InstanceFiles("fg", (), "npuops-fg.service", record)], settings,
                       service_manager(settings), api_key=None, as_json=True, notes=(), service_user="npuops")
    assert refused.value.problem == f"fg runs in the foreground (supervisor pid {os.getpid()})"
    assert "`npuops stop fg`" in refused.value.fix


def test_a_launch_or_a_rollout_into_a_state_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "etc"
    state.write_text("a file")
    settings = Settings(state_dir=state, systemctl="/bin/true")
    record = make_record(tmp_path / "elsewhere", "m")
    for attempt in (lambda: launch_service([InstanceFiles("m", (), "npuops-m.service", record)], settings,
                                           service_manager(settings), api_key=None, as_json=True, notes=(),
                                           service_user="npuops"),
                    lambda: rollout_instance(settings, service_manager(settings), RolloutRequest(name="m"),
                                             Reporter(True))):
        with pytest.raises(ConfigError) as refused:
            attempt()
        assert refused.value.problem == f"the state dir {state} is not a directory"
