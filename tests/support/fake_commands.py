"""Commands without running them: a fake runner for Probe, and fake tools on PATH that replay a capture."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from npuops.hardware.probe import RC_NOT_FOUND, CommandResult


class FakeRunner:
    """Answers commands from a table {argv-prefix tuple: CommandResult-ish}; anything else is 'not found'."""

    def __init__(self, answers: Mapping[tuple[str, ...], tuple[int, str, str]] | None = None,
                 passthrough_python: bool = True) -> None:
        self.answers = dict(answers or {})
        self.calls: list[tuple[str, ...]] = []
        self.passthrough_python = passthrough_python

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> CommandResult:
        key = tuple(argv)
        self.calls.append(key)
        # The longest matching prefix wins, so a per-chip query is not shadowed by ("npu-smi", "info").
        for prefix, (rc, out, err) in sorted(self.answers.items(), key=lambda item: -len(item[0])):
            if key[: len(prefix)] == prefix:
                return CommandResult(key, rc, out, err, 0.0)
        if self.passthrough_python and key and key[0] == sys.executable:
            from npuops.hardware.probe import SubprocessRunner

            return SubprocessRunner(os.environ.get("PATH", ""), dict(os.environ)).run(key, timeout=timeout)
        return CommandResult(key, RC_NOT_FOUND, "", "", 0.0, f"{key[0]}: command not found")


def write_fake_tool(bin_dir: Path, name: str, stdout: str, rc: int = 0) -> Path:
    """An executable that replays a recorded output, for end-to-end tests of the CLI."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    payload = bin_dir / f".{name}.out"
    payload.write_text(stdout, encoding="utf-8")
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\ncat '{payload}'\nexit {rc}\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script
