"""npuops.safefiles, the one reader for what another user writes: regular files only, no link followed on the way
or at the end, FIFOs never opened, tails read from the end, walks that never enter a linked directory, and names
escaped before they are shown."""

from __future__ import annotations

import os
import socket
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuops.safefiles import (
    ConfinedPath,
    NotRead,
    printable,
    read_tail,
    untrusted_absolute,
    walk_regular_files,
)


def test_a_tail_is_read_from_the_end_of_a_sparse_file(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    end = b"".join(b"line %d\n" % i for i in range(1000))
    with open(big, "wb") as handle:
        handle.truncate(2**40)  # a terabyte: reading it whole would never end
        handle.seek(0, os.SEEK_END)
        handle.write(end)
    tail = read_tail(ConfinedPath(tmp_path, PurePosixPath("big.log")), cap=len(end) - 3)
    assert tail.data == end[3:] and tail.size == 2**40 + len(end) and tail.left_out == tail.size - len(end) + 3
    lines = read_tail(ConfinedPath(tmp_path, PurePosixPath("big.log")), cap=len(end) - 3, whole_lines=True)
    assert lines.data == end[end.index(b"\n") + 1:] and lines.left_out == tail.size - len(lines.data)


def test_a_file_that_shrinks_while_it_is_read_gives_what_is_there(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"0123456789")
    real_fstat = os.fstat

    def grown(fd: int) -> os.stat_result:  # the size it had a moment ago, before a rotation cut it
        info = real_fstat(fd)
        values = list(info)
        values[6] = info.st_size + 1000
        return os.stat_result(values)

    monkeypatch.setattr(os, "fstat", grown)
    tail = read_tail(ConfinedPath(tmp_path) / "engine.log", cap=500)
    assert tail.data == b"" and tail.left_out == 510  # nothing was there to read: no error, no wait


def test_links_at_the_end_or_on_the_way_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:hash\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "engine.log").symlink_to(secret)
    (tmp_path / "linked").symlink_to(tmp_path)
    with pytest.raises(NotRead, match="symbolic link"):
        read_tail(ConfinedPath(tmp_path) / "dir/engine.log", cap=100)
    with pytest.raises(NotRead, match="symbolic link"):
        read_tail(ConfinedPath(tmp_path) / "linked/shadow", cap=100)
    # The trusted root itself is followed: its links are its owner's.
    assert read_tail(ConfinedPath(tmp_path / "linked") / "shadow", cap=100).data == b"root:hash\n"
    with pytest.raises(ValueError):
        ConfinedPath(tmp_path, PurePosixPath("../etc/shadow"))
    with pytest.raises(NotRead) as missing:
        read_tail(ConfinedPath(tmp_path) / "absent", cap=1)
    assert missing.value.missing and "does not exist" in missing.value.reason


def test_fifos_sockets_and_hard_links_are_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "sock"))
        (tmp_path / "file").write_text("x")
        os.link(tmp_path / "file", tmp_path / "hard")
        for name, why in (("fifo", "FIFO"), ("sock", "socket"), ("hard", "hard links")):
            with pytest.raises(NotRead, match=why):
                read_tail(ConfinedPath(tmp_path) / name, cap=10)
    with pytest.raises(NotRead, match="a directory"):
        read_tail(ConfinedPath(tmp_path), cap=10)


def test_a_walk_takes_regular_files_and_names_everything_else(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "secret.log").write_text("secret")
    top = tmp_path / "logs"
    (top / "debug" / "plog").mkdir(parents=True)
    (top / "debug" / "plog" / "a.log").write_text("a")
    (top / "run").mkdir()
    (top / "run" / "plog").symlink_to(outside)
    (top / "debug" / "plog" / "b.log").symlink_to(outside / "deep" / "secret.log")
    os.mkfifo(top / "debug" / "pipe")
    nested = top / "n"
    for _ in range(5):
        nested = nested / "n"
    nested.mkdir(parents=True)
    (nested / "deep.log").write_text("deep")
    walk = walk_regular_files(ConfinedPath(top), max_depth=4)
    assert [str(f.relative) for f in walk.files] == ["debug/plog/a.log"]
    refused = {str(p): why for p, why in walk.refused}
    assert "symbolic link" in refused["run/plog"] and "symbolic link" in refused["debug/plog/b.log"]
    assert "FIFO" in refused["debug/pipe"] and "deeper than 4" in refused["n/n/n/n/n"]
    assert not walk.incomplete
    many = walk_regular_files(ConfinedPath(top), max_entries=2)
    assert many.incomplete and len(many.files) <= 2
    with pytest.raises(NotRead, match="symbolic link"):
        walk_regular_files(ConfinedPath(top) / "run/plog")


@pytest.mark.parametrize(("text", "ok"), [("/var/log/vllm-ascend", True), ("relative/logs", False),
                                          ("/var/log/../../etc", False), ("/", False), ("/proc/self", False),
                                          ("/sys/kernel", False), ("/dev/shm/x", False), ("/process/x", True),
                                          ("/var/log/a\0b", False)])
def test_a_path_a_file_names_is_checked_before_it_is_read(text: str, ok: bool) -> None:
    if ok:
        assert untrusted_absolute(text) == PurePosixPath(text)
    else:
        with pytest.raises(NotRead):
            untrusted_absolute(text)


@given(st.text(max_size=60))
@settings(max_examples=300, deadline=None)
def test_a_printable_name_shows_every_character_as_itself_or_escaped(name: str) -> None:
    shown = printable(name)
    assert shown.isprintable()
    assert "\x1b" not in shown and "\n" not in shown
    if name.isprintable() and "\\" not in name:
        assert shown == name
