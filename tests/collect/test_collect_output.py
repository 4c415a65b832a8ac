"""`npuops collect --output`: where a bundle may not go is refused in one line with the fix, before anything is
gathered (under /proc or /sys, in a "directory" that is a file, over a FIFO, a link, a device or a file that is not
one of our bundles); --force replaces what may be replaced (a link itself, never its target); a bundle of ours is
replaced as it always was (issue 45, findings 6 and 8)."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.support.bundle import Bundle, check_destination, is_our_bundle, read_bundle
from npuops.support.redact import Redactor
from tests.support.npuops_cli import npuops_argv


def _run_collect(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`npuops collect` on an empty node; its `uname` leaves a mark, so a run that gathered anything shows."""
    bin_dir, mark = tmp_path / "bin", tmp_path / "gathered"
    bin_dir.mkdir(exist_ok=True)
    uname = bin_dir / "uname"
    uname.write_text(f"#!/bin/sh\ntouch {mark}\necho Linux\n")
    uname.chmod(0o755)
    (tmp_path / "state").mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "NPUOPS_STATE_DIR": str(tmp_path / "state"),
           "NPUOPS_ROOT": str(tmp_path / "root"), "NPUOPS_STACK_PYTHON": sys.executable}
    done = subprocess.run(npuops_argv("collect", *args), env=env, capture_output=True, text=True, timeout=300)
    return done, mark


def _refused(done: subprocess.CompletedProcess[str], mark: Path) -> str:
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "fix:" in lines[0], lines
    assert not mark.exists(), "collect gathered the node before refusing its --output"
    return lines[0]


def _foreign_tar_gz(path: Path) -> None:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("backup/etc.conf")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))


# (A directory at --output is click's to refuse, as a usage error; check_destination refuses it too, below.)
@pytest.mark.parametrize("case", ["proc", "sys", "parent-is-a-file", "fifo", "not-a-bundle", "foreign-tar-gz",
                                  "link"])
def test_an_output_collect_must_not_write_is_refused_before_collecting(tmp_path: Path, case: str) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("the operator's file\n")
    output = {"proc": Path("/proc/npuops-bundle.tar.gz"), "sys": Path("/sys/kernel/npuops-bundle.tar.gz"),
              "parent-is-a-file": target / "bundle.tar.gz", "fifo": tmp_path / "pipe.tar.gz",
              "not-a-bundle": target, "foreign-tar-gz": tmp_path / "backup.tar.gz",
              "link": tmp_path / "link.tar.gz"}[case]
    if case == "fifo":
        os.mkfifo(output)
    elif case == "foreign-tar-gz":
        _foreign_tar_gz(output)
    elif case == "link":
        output.symlink_to(target)
    done, mark = _run_collect(tmp_path, "--output", str(output))
    line = _refused(done, mark)
    assert str(output) in line
    assert target.read_text() == "the operator's file\n"
    if case == "fifo":
        assert stat.S_ISFIFO(os.lstat(output).st_mode)
    if case == "link":
        assert output.is_symlink()


def test_a_bundle_of_ours_is_replaced_without_force(tmp_path: Path) -> None:
    output = tmp_path / "bundle.tar.gz"
    old = Bundle(Redactor())
    old.add("old.txt", b"the previous bundle", "test")
    old.write(output)
    assert is_our_bundle(output)
    done, mark = _run_collect(tmp_path, "--output", str(output), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert mark.exists()
    _manifest, files = read_bundle(output)
    assert "old.txt" not in files and "system/uname.txt" in files


@pytest.mark.parametrize("case", ["fifo", "link", "not-a-bundle"])
def test_force_replaces_the_entry_itself_never_what_a_link_names(tmp_path: Path, case: str) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("the operator's file\n")
    output = target if case == "not-a-bundle" else tmp_path / "out.tar.gz"
    if case == "fifo":
        os.mkfifo(output)
    elif case == "link":
        output.symlink_to(target)
    bundle = Bundle(Redactor())
    bundle.add("a.txt", b"new", "test")
    with pytest.raises(BadInputError):
        bundle.write(output)
    bundle.write(output, force=True)
    assert stat.S_ISREG(os.lstat(output).st_mode) and read_bundle(output)[1] == {"a.txt": b"new"}
    if case != "not-a-bundle":
        assert target.read_text() == "the operator's file\n"


def test_a_device_or_a_directory_is_never_replaced_even_with_force(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    for path in (tmp_path / "dir", Path("/dev/null"), Path("/dev/stdout"), Path("/run/npuops-bundle.tar.gz"),
                 Path("/dev/shm/npuops-bundle.tar.gz"), Path("/proc/self/fd/1")):
        with pytest.raises(BadInputError) as refused:
            check_destination(path, force=True)
        # --force cannot help, so it is not suggested.
        assert "--force" not in refused.value.fix and "--output" in refused.value.fix, path
    assert not Path("/run/npuops-bundle.tar.gz").exists()
    check_destination(tmp_path / "new" / "bundle.tar.gz", force=False)  # a new file in a new directory is fine


@pytest.mark.parametrize("names", ["/proc/self/fd/1", "/dev/null", "dir", "nothing", "loop", "/dev/shm"])
def test_a_link_to_anything_but_a_file_is_never_replaced_even_with_force(tmp_path: Path, names: str) -> None:
    """`--output /dev/stdout --force` turned the link into a file; a link in any directory to a pipe, a device or a
    directory is refused whatever --force says, and stays a link."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    link = tmp_path / "out.tar.gz"
    link.symlink_to(names if names.startswith("/") else tmp_path / names)
    before = os.readlink(link)
    bundle = Bundle(Redactor())
    bundle.add("a.txt", b"new", "test")
    with pytest.raises(BadInputError) as refused:
        bundle.write(link, force=True)
    assert "never replaces" in refused.value.problem and "--force" not in refused.value.fix
    assert os.readlink(link) == before


def test_collect_through_a_link_to_its_own_stdout_is_refused_before_collecting(tmp_path: Path) -> None:
    link = tmp_path / "stdout.tar.gz"
    link.symlink_to("/proc/self/fd/1")
    done, mark = _run_collect(tmp_path, "--output", str(link), "--force")
    line = _refused(done, mark)
    assert "a link to" in line and "--force" not in line.split("fix:")[1]
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
