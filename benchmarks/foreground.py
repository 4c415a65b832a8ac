"""What the engine benchmarks share: an instance launched in the foreground under npuops' supervisor, waited for
until healthy, and stopped through its supervisor (SIGTERM to the launch; its whole session if that hangs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def foreground_instance(python: Path, launch_args: list[str], name: str, env: dict[str, str],
                        wait_s: int = 600) -> Iterator[None]:
    """`npuops launch LAUNCH_ARGS --name NAME --foreground`, healthy within wait_s, stopped on leaving."""
    npuops = [str(python), "-m", "npuops"]
    log = tempfile.NamedTemporaryFile(prefix=f"npuops-bench-{name}-", suffix=".log", delete=False)  # noqa: SIM115
    launcher = subprocess.Popen([*npuops, "launch", *launch_args, "--name", name, "--vllm", str(python.parent / "vllm"),
                                 "--foreground"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        while launcher.poll() is None:  # healthy, or the launch gave up (then say why, not wait out wait_s)
            ready = subprocess.run([*npuops, "status", name, "--wait", "10"], env=env, cwd=REPO, capture_output=True)
            if ready.returncode == 0:
                break
            wait_s -= 10
            if wait_s <= 0:
                break
        if launcher.poll() is not None or ready.returncode != 0:
            tail = Path(log.name).read_text(errors="replace").strip().splitlines()[-5:]
            raise SystemExit(f"{name} ({' '.join(launch_args)}): the instance did not become healthy: "
                             + " | ".join(tail))
        yield
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=30)
        log.close()
        os.unlink(log.name)
