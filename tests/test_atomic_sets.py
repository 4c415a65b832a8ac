"""Files written as one set, SIGTERM during the write, and the per-name launch lock (npuops/atomic.py,
npuops/instance/lock.py): nothing half-written, no temporary left holding part of an env file, a second launch
of one name refused at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npuops.atomic import write_files_as_one_set
from npuops.errors import BadInputError
from npuops.instance.lock import instance_lock
from tests.support.paths import REPO


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_set_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    instance = tmp_path / "demo"
    written = write_files_as_one_set([(instance / "vllm.yaml", "new: 1\n", 0o644), (instance / "env", "K=v\n", 0o600)])
    assert written == [instance / "vllm.yaml", instance / "env"]
    assert (instance / "env").stat().st_mode & 0o777 == 0o600
    (tmp_path / "blocker").write_text("")
    with pytest.raises(OSError):  # the second file's directory cannot exist: the first is not replaced either
        write_files_as_one_set([(instance / "vllm.yaml", "newer: 2\n", 0o644),
                                (tmp_path / "blocker" / "env", "K=w\n", 0o600)])
    assert (instance / "vllm.yaml").read_text() == "new: 1\n" and _leftovers(instance) == []


def test_sigterm_while_the_set_is_written_leaves_the_old_set_and_no_temporary(tmp_path: Path) -> None:
    """The process is terminated (SIGTERM, as `kill` or systemd would) between the env file's write and its
    rename: the old files stay as they were and no temporary holds part of the new env file (its key)."""
    instance = tmp_path / "demo"
    write_files_as_one_set([(instance / "vllm.yaml", "old: 1\n", 0o644), (instance / "env", "KEY=old\n", 0o600)])
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        import npuops.atomic as atomic
        calls = []
        real_fsync = os.fsync
        def fsync_then_terminated(fd):
            real_fsync(fd)
            calls.append(fd)
            if len(calls) == 2:  # the env file is on disk in its temporary, not yet renamed
                os.kill(os.getpid(), signal.SIGTERM)
        atomic.os.fsync = fsync_then_terminated
        d = Path({str(instance)!r})
        atomic.write_files_as_one_set([(d / "vllm.yaml", "new: 2\\n", 0o644), (d / "env", "KEY=sk-secret\\n", 0o600)])
        print("not terminated")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode != 0 and "not terminated" not in done.stdout, done
    assert "Terminated" in done.stderr, done.stderr
    assert (instance / "vllm.yaml").read_text() == "old: 1\n" and (instance / "env").read_text() == "KEY=old\n"
    assert _leftovers(instance) == []
    assert not any("sk-secret" in p.read_text() for p in instance.iterdir())


def test_two_launches_of_one_name_do_not_run_at_once(tmp_path: Path) -> None:
    with instance_lock(tmp_path, ["m", "m-r0", "m-r1"], "npuops launch"):
        with pytest.raises(BadInputError) as refused, instance_lock(tmp_path, ["m"], "npuops launch"):
            pass
        assert f"npuops launch of 'm' (pid {os.getpid()}, since " in refused.value.one_line()
        with instance_lock(tmp_path, ["other"], "npuops launch"):  # another name launches meanwhile
            pass
    with instance_lock(tmp_path, ["m"], "npuops launch"):
        pass
