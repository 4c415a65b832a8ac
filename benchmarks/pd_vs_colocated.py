"""A prefill/decode pair against one co-located engine on the same cores, at the same load, side by side in one run.

Both deployments are what npuops launches: `npuops launch --pd 1:1 --dry-run` and `npuops launch --dry-run` render
them (vllm.yaml, env file, router.json) from the same tiny demo model and flags, and this script runs the rendered
files on the real vLLM CPU engine of the engine venv:

    pd          the prefill engine (its cores), the decode engine (the other cores), vLLM's ExampleConnector with a
                shared directory, vllm-router in PD mode in front (`--vllm-pd-disaggregation`)
    colocated   one engine over all the cores

Both stay up for the whole run; the arms take turns (order alternating each round, one untimed warm-up batch each),
so drift on a noisy machine hits both. Every request is a fresh prompt of --input-len tokens and exactly
--output-len tokens (`ignore_eos`), --concurrency in flight, streamed; TTFT is the time to the first generated token,
TPOT (latency - TTFT) / (tokens - 1). The ratios pd / colocated are printed per round and as medians, beside the
ratios `npuops plan --pd 1:1` predicted for the same load.

What the CPU can show and what it cannot: the path (the consumer loads the producer's KV, "External Cache Hit!",
vllm:external_prefix_cache_hits_total) and the shape of the trade: each pool has half the cores, the KV goes
through files, so TTFT pays the transfer; on an NPU node the pools have their own chips and HBM and the KV moves over
RoCE, which no CPU run measures.

Run with the engine venv's python (vllm, vllm-router, aiohttp); npuops comes from this checkout:

    PYTHONPATH=. /opt/npuops-engine/venv/bin/python benchmarks/pd_vs_colocated.py [--rounds 3] [--keep]

About 4 minutes on 2 cores (the three engines start together in ~90 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_overhead import (
    MODEL_NAME,
    Batch,
    BenchError,
    Processes,
    PromptMaker,
    Started,
    batch,
    check_engine_python,
    engine_env,
    finish,
    free_ports,
    install_signal_handlers,
    make_model,
    ratio,
    scrape,
    wait_healthy,
)

REPO = Path(__file__).resolve().parent.parent
# The tiny model's recipe on the CPU engine (as the systemd tests launch it), prefix caching off so that rounds do
# not find each other's prompts: only the connector may hand a prompt's KV over.
PLAN_FLAGS = ("--hardware", "cpu", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
              "--kv-cache-memory-bytes", str(256 * 2**20))


def npuops_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**engine_env(), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def render(model: Path, out: Path, name: str, port: int, load: list[str], pd: bool) -> Path:
    args = ["launch", str(model), *PLAN_FLAGS, *load, "--name", name, "--port", str(port), "--vllm",
            str(Path(sys.executable).parent / "vllm"), "--dry-run", "--output", str(out)]
    done = npuops_cli(*args, *(["--pd", "1:1"] if pd else []))
    if done.returncode != 0:
        raise BenchError(f"npuops launch --dry-run failed: {done.stderr.strip()[-2000:]}")
    return out


def read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key] = json.loads(value) if value.startswith('"') else value
    return out


def spawn_engine(processes: Processes, directory: Path, model: Path, kv_dir: Path | None) -> Started:
    """One rendered engine: `vllm serve MODEL --config vllm.yaml` with its env file (the shared KV directory, which
    systemd would create as a StateDirectory, moved under the run's temp dir)."""
    config = directory / "vllm.yaml"
    if kv_dir is not None:
        text = config.read_text()
        text = text.replace("/var/lib/npuops-pd-kv", str(kv_dir))
        config.write_text(text)
    env = {**engine_env(), **read_env(directory / "env")}
    vllm = Path(sys.executable).parent / "vllm"
    return processes.spawn(directory.name, [str(vllm), "serve", str(model), "--config", str(config)], env)


def spawn_pd_router(processes: Processes, directory: Path) -> Started:
    argv = json.loads((directory / "router.json").read_text())["argv"]
    return processes.spawn("pd-router", [sys.executable, "-m", "vllm_router.launch_router", *argv], engine_env())


def tpots(run: Batch) -> list[float]:
    return [(o.latency_s - o.ttft_s) / (o.output_tokens - 1) for o in run.ok
            if o.ttft_s is not None and o.output_tokens > 1]


def summary(run: Batch) -> dict[str, float]:
    return {"ttft_ms": statistics.median(run.ttfts) * 1e3 if run.ttfts else float("nan"),
            "tpot_ms": statistics.median(tpots(run)) * 1e3 if tpots(run) else float("nan"),
            "tokens_per_s": run.tokens_per_s}


def predicted(model: Path, load: list[str]) -> dict[str, float]:
    done = npuops_cli("plan", str(model), *PLAN_FLAGS, *load, "--pd", "1:1", "--json")
    if done.returncode != 0:
        raise BenchError(f"npuops plan --pd failed: {done.stderr.strip()[-2000:]}")
    data = json.loads(done.stdout)["disaggregated"]
    pair, colocated = data["prediction"], data["colocated_prediction"]
    return {"ttft_ms": ratio(pair["ttft_ms"], colocated["ttft_ms"]),
            "tpot_ms": ratio(pair["tpot_ms"], colocated["tpot_ms"]),
            "tokens_per_s": ratio(pair["output_tokens_per_s"], colocated["output_tokens_per_s"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model directory [default: the tiny demo model, made here]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16, help="requests per arm and round")
    parser.add_argument("--concurrency", type=int, default=4)
    # Not a multiple of the CPU engine's 128-token block: the ExampleConnector's consumer looks up the whole blocks
    # of all but the prompt's last token, so a prompt of exactly k blocks finds nothing (recomputed_tokens).
    parser.add_argument("--input-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, rendered files)")
    args = parser.parse_args()
    problem = check_engine_python()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    install_signal_handlers()
    work = Path(tempfile.mkdtemp(prefix="npuops-pd-bench-"))
    processes = Processes(work)
    try:
        # Served under its directory's name, which is the name the streaming client asks for (MODEL_NAME).
        model = args.model or make_model(work).rename(work / MODEL_NAME)
        load = ["--input-len", str(args.input_len), "--output-len", str(args.output_len), "--concurrency",
                str(args.concurrency), "--fixed-lengths"]
        pd_port, co_port = free_ports(2)
        # The PD instance takes pd_port..pd_port+3 (router, prefill, decode, router metrics).
        pd_dir = render(model, work / "pd", "pd", pd_port, load, pd=True)
        co_dir = render(model, work / "co", "co", co_port, load, pd=False)
        kv_dir = work / "kv"
        kv_dir.mkdir()
        started = time.monotonic()
        prefill = spawn_engine(processes, pd_dir / "pd-p0", model, kv_dir)
        decode = spawn_engine(processes, pd_dir / "pd-d0", model, kv_dir)
        colocated = spawn_engine(processes, co_dir, model, None)
        wait_healthy([(prefill, f"http://127.0.0.1:{pd_port + 1}"), (decode, f"http://127.0.0.1:{pd_port + 2}"),
                      (colocated, f"http://127.0.0.1:{co_port}")])
        router = spawn_pd_router(processes, pd_dir / "pd")
        wait_healthy([(router, f"http://127.0.0.1:{pd_port}")])
        print(f"three engines and the PD router up in {time.monotonic() - started:.0f} s (work dir {work})")
        prompts = PromptMaker(model, seed=7)
        arms = {"pd": f"http://127.0.0.1:{pd_port}", "colocated": f"http://127.0.0.1:{co_port}"}
        for url in arms.values():  # warm-up, untimed
            batch([url], [prompts.unique(args.input_len) for _ in range(args.concurrency)], args.concurrency,
                  args.output_len)
        hits_before = sum(v for k, v in scrape(f"http://127.0.0.1:{pd_port + 2}/metrics").items()
                          if k.startswith("vllm:external_prefix_cache_hits_total"))
        results: dict[str, list[dict[str, float]]] = {"pd": [], "colocated": []}
        for round_index in range(args.rounds):
            order = ["pd", "colocated"] if round_index % 2 == 0 else ["colocated", "pd"]
            for arm in order:
                run = batch([arms[arm]], [prompts.unique(args.input_len) for _ in range(args.prompts)],
                            args.concurrency, args.output_len)
                if len(run.ok) != args.prompts:
                    raise BenchError(f"{arm}: {args.prompts - len(run.ok)} request(s) failed: {run.errors()}")
                results[arm].append(summary(run))
            pair, alone = results["pd"][-1], results["colocated"][-1]
            print(f"round {round_index + 1}: " + ", ".join(
                f"{k} pd {pair[k]:.1f} / colocated {alone[k]:.1f} = {ratio(pair[k], alone[k]):.2f}x" for k in pair))
        hits = sum(v for k, v in scrape(f"http://127.0.0.1:{pd_port + 2}/metrics").items()
                   if k.startswith("vllm:external_prefix_cache_hits_total")) - hits_before
        expected = predicted(model, load)
        print(f"\nload: {args.prompts} prompts of {args.input_len} tokens, {args.output_len} out, "
              f"{args.concurrency} in flight, {os.cpu_count()} cores; the decode engine loaded {hits:.0f} prompt "
              "tokens from the prefill engine's KV")
        print(f"{'metric':<14}{'pd / colocated (median)':>26}{'predicted':>12}")
        for key in ("ttft_ms", "tpot_ms", "tokens_per_s"):
            measured = statistics.median(ratio(p[key], c[key]) for p, c in zip(results["pd"], results["colocated"],
                                                                                 strict=True))
            print(f"{key:<14}{measured:>25.2f}x{expected[key]:>11.2f}x")
        return 0
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        finish(processes, work, keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
