"""What the engine benchmarks share: an instance launched in the foreground under npuops' supervisor, waited for
until healthy, and stopped through its supervisor (SIGTERM to the launch; its whole session if that hangs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def foreground_instance(python: Path, launch_args: list[str], name: str, env: dict[str, str],
                        wait_s: int = 600) -> Iterator[None]:
    """`npuops launch LAUNCH_ARGS --name NAME --foreground`, healthy within wait_s, stopped on leaving."""
    npuops = [str(python), "-m", "npuops"]
    launcher = subprocess.Popen([*npuops, "launch", *launch_args, "--name", name, "--vllm", str(python.parent / "vllm"),
                                 "--foreground"], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        ready = subprocess.run([*npuops, "status", name, "--wait", str(wait_s)], env=env, cwd=REPO,
                               capture_output=True)
        if ready.returncode != 0:
            raise SystemExit(f"{name} ({' '.join(launch_args)}): the instance did not become healthy")
        yield
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=30)
