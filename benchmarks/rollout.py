"""A rollout of two replicas under streaming load, beside plain restarts of the same replicas, under real systemd.

Inside a real systemd booted as PID 1 in a namespace (tests/support/systemd.py; root only), `npuops launch --dp 2`
serves the tiny demo model (two replicas of the real vLLM CPU engine behind the real vllm-router). Four clients
stream answers through the endpoint (64 tokens each, two seconds apart) while one of two arms changes what serves:

    restart   `systemctl restart` of replica r0, wait until the instance is healthy again, then r1 (by hand, as an
              operator without `rollout` does it)
    rollout   `npuops rollout NAME --model DIR`: r0 then r1 out of the router, drained, switched to the other model
              revision (another tiny model with other weights), verified, back in

The arms alternate (restart, rollout, restart, rollout, ...; each rollout switches to the other revision), so drift
on a noisy machine hits both. For each it prints the time the change took, the streamed answers the clients
completed meanwhile, and how many were cut (an error, or fewer tokens than asked). The goal: none cut by a rollout.

    python benchmarks/rollout.py [--rounds 2] [--keep]

Each round starts four engines (two per arm) at 25-45 s each on 2 cores: the default takes ~8 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.streams import StreamingClients  # noqa: E402
from tests.support.systemd import RealSystemd, ServingNode, prepare_serving_node, unavailable_reason  # noqa: E402

NAME = "bench-ro"


def engine_python() -> Path:
    if os.environ.get("NPUOPS_ENGINE_PYTHON"):
        return Path(os.environ["NPUOPS_ENGINE_PYTHON"])
    out = subprocess.run([str(REPO / "scripts" / "engine-venv.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def free_port_run(count: int) -> int:
    """The first of `count` free consecutive ports."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = int(s.getsockname()[1])
        if first + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                sock.bind(("127.0.0.1", port))
                held.append(sock)
            for sock in held:
                sock.close()
            return first
        except OSError:
            for sock in held:
                sock.close()
    raise RuntimeError("no run of free ports")


def healthy(node: ServingNode) -> bool:
    done = node.npuops("status", NAME, "--json", timeout=120)
    return done.returncode == 0 and json.loads(done.stdout)["instances"][0]["healthy"]


def wait_healthy(node: ServingNode, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not healthy(node):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{NAME} did not become healthy in {timeout:.0f} s")
        time.sleep(2)


def restart_arm(node: ServingNode) -> None:
    for replica in ("r0", "r1"):
        node.systemd.check(["systemctl", "restart", f"npuops-{NAME}-{replica}.service"], timeout=600)
        wait_healthy(node)


def rollout_arm(node: ServingNode, model: Path) -> None:
    done = node.npuops("rollout", NAME, "--model", str(model), "--json", timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"rollout failed:\n{done.stdout}\n{done.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    python = engine_python()
    work = Path(tempfile.mkdtemp(prefix="npuops-bench-rollout-", dir="/srv"))
    systemd = RealSystemd(work / "systemd")
    try:
        models = []
        # Served as "tiny-llama" (the first one's directory name), which a rollout keeps for the second.
        for seed, where in ((0, "a/tiny-llama"), (7, "b/tiny-llama-v2")):
            model = work / where
            model.parent.mkdir()
            model.parent.chmod(0o755)
            subprocess.run([str(python), "-m", "npuops.demo_model", str(model), "--seed", str(seed)], check=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
            model.chmod(0o755)
            models.append(model)
        work.chmod(0o755)
        systemd.boot()
        node = prepare_serving_node(systemd, python, REPO, models[0], copy_model=False)
        port = free_port_run(4)
        launched = node.launch(NAME, port, "--dp", "2", "--json", timeout=1500)
        if launched.returncode != 0:
            raise RuntimeError(f"launch failed:\n{launched.stderr[-3000:]}")
        rows: dict[str, list[tuple[float, int, int]]] = {"restart": [], "rollout": []}
        print(f"{'round':>5}  {'arm':<8} {'seconds':>8} {'answers':>8} {'cut':>5}", flush=True)
        for round_ in range(args.rounds):
            for arm in ("restart", "rollout"):
                with StreamingClients(port, None, clients=4) as clients:
                    started = time.monotonic()
                    if arm == "restart":
                        restart_arm(node)
                    else:
                        rollout_arm(node, models[(round_ + 1) % 2])
                    seconds = time.monotonic() - started
                row = (seconds, len(clients.answers), len(clients.cut()))
                rows[arm].append(row)
                print(f"{round_:>5}  {arm:<8} {row[0]:8.1f} {row[1]:8d} {row[2]:5d}", flush=True)
        restart_s = statistics.median(r[0] for r in rows["restart"])
        rollout_s = statistics.median(r[0] for r in rows["rollout"])
        print(f"median time rollout/restart: {rollout_s / restart_s:.2f}; streams cut: rollout "
              f"{sum(r[2] for r in rows['rollout'])} of {sum(r[1] for r in rows['rollout'])}, restart "
              f"{sum(r[2] for r in rows['restart'])} of {sum(r[1] for r in rows['restart'])} (goal: none in a "
              "rollout)")
        return 0
    finally:
        systemd.shutdown()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
