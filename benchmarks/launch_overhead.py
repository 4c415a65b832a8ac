"""Time to a healthy endpoint: `npuops launch` (--foreground, or as a unit under real systemd) versus a bare
`vllm serve` with the same flags.

Both serve the tiny demo model (npuops.demo_model) on the real vLLM CPU engine from the engine venv
(scripts/engine-venv.sh; NPUOPS_ENGINE_PYTHON, else ~/.cache/npuops/engine-venv/bin/python):

    A  npuops launch MODEL --hardware cpu ... --foreground   (plans, renders, runs the start gate, supervises
                                                              `vllm serve`)
    B  vllm serve MODEL --config <vllm.yaml npuops renders>  (environment from the env file npuops renders, parsed
                                                              with npuops.envfile; rendered with --dry-run)

For each, the clock starts just before the process is spawned and stops at the first GET /health that answers 200
(polled by this script the same way for both); then the process gets SIGTERM and is waited for. The runs alternate
A B A B ... so drift on a noisy machine hits both; the ratio of the medians is what to read. Untimed bare starts come
first (--warmup, default 1): the very first start of the benchmark fills vLLM's cache (VLLM_CACHE_ROOT/modelinfos,
shared by A and B) and the page cache, which costs it ~10 s more, and A would always pay it (with --systemd the unit
has a cache of its own, its CacheDirectory=, so an untimed start of A comes first too). npuops' own pre-engine
time (spawn until the supervisor starts the engine) comes from its status file, <state>/bench-a/supervisor.json.
Each engine start takes 25-45 s on 2 cores: the default (1 warm-up, 2 runs) takes ~3.5 minutes.

With --systemd, A is the production path instead: `npuops launch MODEL ...` (no --foreground) inside a real
systemd booted as PID 1 in a namespace (tests/support/systemd.py; root only): it installs the hardened unit, which
runs the start gate and the supervisor as the unprivileged service user; the clock stops at the first /health 200
(the namespace shares this machine's network), then `npuops stop` ends it. The model then lies under /srv (the
unit's sandbox hides /tmp) and the engine venv must lie under /opt (scripts/engine-venv.sh as root). B is the same
bare `vllm serve` on the same model files.

    python benchmarks/launch_overhead.py [--runs 2] [--warmup 1] [--systemd] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from npuops.envfile import parse_env_file  # noqa: E402
from tests.support.systemd import RealSystemd, ServingNode, prepare_serving_node, unavailable_reason  # noqa: E402

NAME = "bench-a"
HOST = "127.0.0.1"
# The recipe that works on the CPU engine: float32, a short context, no graph capture, an explicit KV cache size.
LAUNCH_FLAGS: tuple[str, ...] = (
    "--hardware", "cpu", "--max-model-len", "512", "--input-len", "256", "--output-len", "64",
    "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "268435456",
)
POLL_S = 0.1
STOP_TIMEOUT_S = 30.0


class BenchError(RuntimeError):
    """A run that did not reach a healthy endpoint; the message carries the end of its log."""


@dataclass
class Run:
    seconds: float  # spawn until the first /health 200
    stop_s: float  # SIGTERM until the process exited
    pre_engine_s: float | None = None  # A only: spawn until the supervisor started the engine


def engine_venv_bin() -> Path | None:
    python = os.environ.get("NPUOPS_ENGINE_PYTHON") or str(Path.home() / ".cache/npuops/engine-venv/bin/python")
    bin_dir = Path(python).parent
    needed = [Path(python), bin_dir / "npuops", bin_dir / "vllm"]
    return bin_dir if all(p.is_file() and os.access(p, os.X_OK) for p in needed) else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2.0) as resp:
            return int(resp.status) == 200
    except urllib.error.HTTPError:
        return False
    except (OSError, http.client.HTTPException):  # refused until the port opens
        return False


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(process: subprocess.Popen[bytes]) -> float:
    """SIGTERM to the process, SIGKILL to its group after STOP_TIMEOUT_S; then whatever is left of the group goes."""
    started = time.perf_counter()
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"  (pid {process.pid} did not stop within {STOP_TIMEOUT_S:.0f} s: killing its group)", flush=True)
            kill_group(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    elapsed = time.perf_counter() - started
    kill_group(process.pid, signal.SIGKILL)
    return elapsed


def timed_start(argv: Sequence[str], env: Mapping[str, str], port: int, log: Path, timeout: float,
                status_file: Path | None = None) -> Run:
    """Spawn `argv` (own session, output to `log`), poll /health until 200, read the status file, stop it."""
    with open(log, "wb") as out:
        spawned_wall = time.time()
        started = time.perf_counter()
        process = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        engine_pid = None
        try:
            while not healthy(port):
                rc = process.poll()
                if rc is not None:
                    raise BenchError(f"{argv[0]} exited with rc {rc} before /health answered; {log}:\n{tail(log)}")
                if time.perf_counter() - started > timeout:
                    raise BenchError(f"no /health 200 after {timeout:.0f} s; {log}:\n{tail(log)}")
                time.sleep(POLL_S)
            seconds = time.perf_counter() - started
            pre_engine = None
            if status_file is not None:
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    status = json.loads(status_file.read_text(encoding="utf-8"))
                    engine_pid = status.get("engine_pid")
                    first = next(s for s in status["stages"] if s["stage"] == "starting")
                    pre_engine = float(first["at"]) - spawned_wall
        finally:
            stop_s = stop(process)
            if engine_pid:  # A's engine runs in a session of its own; the supervisor normally stops it
                kill_group(int(engine_pid), signal.SIGKILL)
    return Run(seconds, stop_s, pre_engine)


def timed_service_start(node: ServingNode, model: Path, port: int, log: Path, timeout: float) -> Run:
    """`npuops launch` as a unit inside the namespace until /health answers; then `npuops stop`."""
    argv = [str(node.venv / "bin" / "npuops"), "launch", str(model), *LAUNCH_FLAGS, "--name", NAME, "--port",
            str(port), "--vllm", str(node.venv / "bin" / "vllm")]
    with open(log, "wb") as out:
        spawned_wall = time.time()
        started = time.perf_counter()
        process = node.systemd.popen_to(argv, out)
        while not healthy(port):
            rc = process.poll()
            if rc is not None:
                raise BenchError(f"npuops launch exited with rc {rc} before /health answered; {log}:\n{tail(log)}")
            if time.perf_counter() - started > timeout:
                stop(process)
                raise BenchError(f"no /health 200 after {timeout:.0f} s; {log}:\n{tail(log)}")
            time.sleep(POLL_S)
        seconds = time.perf_counter() - started
        process.wait(timeout=timeout)  # launch returns after its first completion
    pre_engine = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, StopIteration):
        status = json.loads((node.systemd.root / f"var/lib/npuops-{NAME}/supervisor.json").read_text())
        pre_engine = float(next(s for s in status["stages"] if s["stage"] == "starting")["at"]) - spawned_wall
    stopping = time.perf_counter()
    done = node.npuops("stop", NAME, timeout=120)
    if done.returncode != 0:
        raise BenchError(f"npuops stop {NAME} failed: {done.stdout}{done.stderr}")
    return Run(seconds, time.perf_counter() - stopping, pre_engine)


def render(bin_dir: Path, model: Path, port: int, out_dir: Path, env: Mapping[str, str]) -> None:
    argv = [str(bin_dir / "npuops"), "launch", str(model), *LAUNCH_FLAGS, "--name", NAME, "--port", str(port),
            "--vllm", str(bin_dir / "vllm"), "--dry-run", "--output", str(out_dir)]
    proc = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed with rc {proc.returncode}:\n{proc.stdout}{proc.stderr}")


def without_port(yaml_text: str) -> list[str]:
    return [line for line in yaml_text.splitlines() if not line.startswith(("port:", "#"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="A/B pairs (each engine start takes 25-45 s)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed bare engine starts first, to fill the caches both share (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for /health per start")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, rendered files)")
    parser.add_argument("--systemd", action="store_true",
                        help="A launches a unit under real systemd booted in a namespace (root; venv under /opt)")
    args = parser.parse_args()

    bin_dir = engine_venv_bin()
    if bin_dir is None:
        print("no engine venv (NPUOPS_ENGINE_PYTHON, else ~/.cache/npuops/engine-venv/bin/python, with npuops and "
              "vllm beside it); build it with:\n"
              "    export NPUOPS_ENGINE_PYTHON=$(scripts/engine-venv.sh | tail -n 1)", file=sys.stderr)
        return 2

    node: ServingNode | None = None
    if args.systemd:
        reason = unavailable_reason()
        if reason is not None or any(part in ("tmp", "home", "root") for part in bin_dir.resolve().parts[1:2]):
            print(f"--systemd: {reason or f'the engine venv {bin_dir.parent} lies where the unit sandbox hides it'}"
                  "; run as root with the engine venv under /opt (scripts/engine-venv.sh as root)", file=sys.stderr)
            return 2
    # Under /srv with --systemd: the unit's sandbox hides /tmp from the service user.
    work = Path(tempfile.mkdtemp(prefix="npuops-bench-launch-", dir="/srv" if args.systemd else None))
    short_tmp = Path(tempfile.mkdtemp(prefix="nb", dir="/tmp"))  # zmq ipc:// paths must stay < 107 bytes
    state = work / "state"
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env.update({
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(work / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "cache" / "inductor"),
        "TMPDIR": str(short_tmp),
        "NPUOPS_STATE_DIR": str(state),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    })
    try:
        model = work / "model"
        made = subprocess.run([str(bin_dir / "python"), "-m", "npuops.demo_model", str(model)], env=env,
                              capture_output=True, text=True, timeout=300)
        if made.returncode != 0:
            raise BenchError(f"npuops.demo_model failed:\n{made.stdout}{made.stderr}")

        if args.systemd:
            model.chmod(0o755)
            work.chmod(0o755)
            systemd = RealSystemd(work / "systemd")
            systemd.boot()
            node = prepare_serving_node(systemd, bin_dir / "python", REPO, model, copy_model=False)

        def run_a(i: int) -> tuple[Run, str, dict[str, str]]:
            port = free_port()
            if node is not None:
                run = timed_service_start(node, model, port, work / f"a{i}.log", args.timeout)
                rendered = node.systemd.root / "etc/npuops" / NAME
                return (run, (rendered / "vllm.yaml").read_text(encoding="utf-8"),
                        parse_env_file((rendered / "env").read_text(encoding="utf-8"), str(rendered / "env")))
            argv = [str(bin_dir / "npuops"), "launch", str(model), *LAUNCH_FLAGS, "--foreground", "--name", NAME,
                    "--port", str(port), "--vllm", str(bin_dir / "vllm")]
            run = timed_start(argv, env, port, work / f"a{i}.log", args.timeout, state / NAME / "supervisor.json")
            rendered = state / NAME
            return (run, (rendered / "vllm.yaml").read_text(encoding="utf-8"),
                    parse_env_file((rendered / "env").read_text(encoding="utf-8"), str(rendered / "env")))

        def run_b(i: int) -> tuple[Run, str, dict[str, str]]:
            port = free_port()
            rendered = work / f"b{i}"
            render(bin_dir, model, port, rendered, env)
            overlay = parse_env_file((rendered / "env").read_text(encoding="utf-8"), str(rendered / "env"))
            argv = [str(bin_dir / "vllm"), "serve", str(model), "--config", str(rendered / "vllm.yaml")]
            run = timed_start(argv, {**env, **overlay}, port, work / f"b{i}.log", args.timeout)
            return run, (rendered / "vllm.yaml").read_text(encoding="utf-8"), overlay

        warmup = f" after {args.warmup} untimed warm-up start(s)" if args.warmup else ""
        what = "npuops launch as a unit under real systemd" if node is not None else "npuops launch --foreground"
        print(f"{what} (A) versus bare vllm serve (B) to the first /health 200, tiny model, "
              f"{args.runs} run(s) each, alternating{warmup}", flush=True)
        for i in range(args.warmup):
            print(f"  warm-up (bare vllm serve): {run_b(-1 - i)[0].seconds:6.1f} s", flush=True)
            if node is not None:
                # The unit's own vLLM cache (its CacheDirectory=) is filled by its first start, as B's is by B's.
                print(f"  warm-up (the unit):        {run_a(-1 - i)[0].seconds:6.1f} s", flush=True)
        a_runs: list[Run] = []
        b_runs: list[Run] = []
        same_flags = True
        print(f"  {'run':>3}  {'A s':>6}  {'B s':>6}  {'A/B':>5}  {'A pre-engine s':>14}  {'stop A s':>8}  "
              f"{'stop B s':>8}", flush=True)
        for i in range(args.runs):
            a, a_yaml, a_env = run_a(i)
            b, b_yaml, b_env = run_b(i)
            same_flags = same_flags and without_port(a_yaml) == without_port(b_yaml) and a_env == b_env
            a_runs.append(a)
            b_runs.append(b)
            pre = f"{a.pre_engine_s:14.2f}" if a.pre_engine_s is not None else f"{'?':>14}"
            print(f"  {i + 1:>3}  {a.seconds:6.1f}  {b.seconds:6.1f}  {a.seconds / b.seconds:5.2f}  {pre}  "
                  f"{a.stop_s:8.1f}  {b.stop_s:8.1f}", flush=True)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        if node is not None:
            node.systemd.shutdown()
        shutil.rmtree(short_tmp, ignore_errors=True)
        if args.keep:
            print(f"work directory (logs, rendered files): {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    a_med = statistics.median(r.seconds for r in a_runs)
    b_med = statistics.median(r.seconds for r in b_runs)
    pres = [r.pre_engine_s for r in a_runs if r.pre_engine_s is not None]
    print(f"median over {args.runs} run(s):")
    print(f"  A  {'npuops launch (systemd unit)' if args.systemd else 'npuops launch --foreground'}: {a_med:6.2f} s")
    print(f"  B  vllm serve --config:        {b_med:6.2f} s")
    print(f"  ratio A/B: {a_med / b_med:.3f}  (A - B: {a_med - b_med:+.2f} s)")
    if pres:
        pre_med = statistics.median(pres)
        print(f"  npuops before the engine starts (plan, render, gate, supervisor): {pre_med:.2f} s "
              f"({pre_med / a_med:.1%} of A)")
    if not same_flags:
        print("  note: B's rendered vllm.yaml or env differed from A's (apart from the port)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
