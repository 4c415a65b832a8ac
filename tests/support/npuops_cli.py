"""This checkout's npuops run as a subprocess (the way an operator runs it), and package directories indexed by it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.paths import REPO


def npuops_argv(*args: str) -> list[str]:
    """The command line of this checkout's npuops with `args`, on the interpreter running the tests."""
    return [sys.executable, "-m", "npuops", *args]


def npuops(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `npuops ARGS` from the repository, stdout and stderr captured, whatever its exit code."""
    return subprocess.run(npuops_argv(*args), capture_output=True, text=True, cwd=REPO, timeout=timeout, check=False)


def package_dir(root: Path, files: list[Path]) -> Path:
    """A new package directory under `root` with copies of `files`, indexed by `npuops packages index`."""
    directory = root / f"packages-{uuid.uuid4().hex[:6]}"
    directory.mkdir()
    for f in files:
        shutil.copy2(f, directory / f.name)
    proc = npuops("packages", "index", str(directory), "--json")
    assert proc.returncode == 0, proc.stderr
    return directory
