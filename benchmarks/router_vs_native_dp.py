"""vllm-router over two `vllm serve` replicas versus vLLM's native data parallel (`--data-parallel-size 2`).

Two deployments of the tiny demo model (npuops.demo_model, made in a temp dir unless --model DIR) on the real vLLM CPU
engine of the engine venv, up at the same time, prefix caching on, everything on 127.0.0.1 and free ports:

    router   two `vllm serve` processes (each its own process group: API server, EngineCore, worker) and two
             vllm-routers in front of them: `--policy round_robin` (rr) and `--policy cache_aware` (ca)
    native   one `vllm serve ... --data-parallel-size 2`: one API server, two engine cores (VLLM::EngineCore_DP0/1),
             vLLM's own balancing between them

Measured with the client of benchmarks/router_overhead.py (aiohttp, streaming /v1/completions, `ignore_eos`, TTFT =
first streamed chunk with a generated token):

(1) throughput at 16 concurrent requests (distinct ~32-token prompts, 64 output tokens), the arms native, rr and ca
    interleaved in rotating order over several rounds after a warm-up batch each; medians and ratios to native;
(2) the shared-prefix workload (8 groups x R requests sharing a fresh ~200-token prefix per batch, distinct suffixes,
    waves of one request per group in shuffled order, 16 in flight): prefix-cache hit rate from the
    `vllm:prefix_cache_{queries,hits}_total` deltas (both replicas' /metrics for the router arms, the native server's
    /metrics summed over its engines) and TTFT, per arm;
(3) a replica dying mid-run, last (it breaks the deployment): 64 requests of 128 output tokens sent at once (all in
    flight or queued on the servers); once a quarter of all their tokens have streamed, SIGKILL to
        router:  one `vllm serve` process group (API server, EngineCore, worker), through the rr router (or
                 --death-policy);
        native:  the EngineCore_DP1 process and its children (the engine core of rank 1), found by process title;
    then count the requests that completed (every token, finish_reason, [DONE]), how the others failed, and probe
    the endpoint for 20 s (one 8-token request every 0.5 s) and with a last batch of 32 requests: does it keep
    answering, and from when. The router deployment is stopped before the native death run.

Run with the engine venv's python (vllm, vllm-router, aiohttp); npuops comes from this checkout:

    PYTHONPATH=. /opt/npuops-engine/venv/bin/python benchmarks/router_vs_native_dp.py [--quick] [--keep]

About 7 minutes on 2 cores (three `vllm serve` start together: ~1.5 min), --quick about 5.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_overhead import (
    CONCURRENCY,
    Batch,
    BenchError,
    Outcome,
    PrefixRun,
    Processes,
    Progress,
    PromptMaker,
    Started,
    add_common_arguments,
    batch,
    check_engine_python,
    client_session,
    errors_text,
    finish,
    free_ports,
    install_signal_handlers,
    make_model,
    median,
    print_prefix_summary,
    print_throughput_summary,
    ratio,
    replica_cores,
    rotated,
    router_decisions,
    run_batch,
    run_prefix,
    scrape,
    sizes_from,
    spawn_replica,
    spawn_router,
    spread_text,
    stream_completion,
    wait_healthy,
)

DEATH_REQUESTS = 64
DEATH_MAX_TOKENS = 128
DEATH_KILL_SHARE = 0.25  # of all the death batch's tokens streamed when the kill comes
PROBE_SECONDS = 20.0
PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 10.0
AFTER_REQUESTS = 32


@dataclass
class Probe:
    at_s: float  # since the kill
    outcome: Outcome


@dataclass
class DeathRun:
    """A replica killed mid-batch: the batch, what was killed and when, the probes and the batch after them."""

    batch: Batch
    killed: str
    kill_at_s: float  # since the batch started
    completed_before_kill: int
    probes: list[Probe]
    after: Batch
    notes: list[str]


def engine_core_family(server: Started, rank: int) -> list[Any]:
    """The native server's engine core of `rank` (process title VLLM::EngineCore_DP<rank>) and its descendants."""
    import psutil

    title = f"EngineCore_DP{rank}"
    for process in Processes.family(server):
        with contextlib.suppress(psutil.Error):
            if title in " ".join(process.cmdline()) or title in process.name():
                return [process, *process.children(recursive=True)]
    return []


def kill_family(family: Sequence[Any]) -> str:
    import psutil

    described = []
    for process in family:
        with contextlib.suppress(psutil.Error):
            described.append(f"{process.pid} {' '.join(process.cmdline())[:40] or process.name()}")
            process.send_signal(signal.SIGKILL)
    return "; ".join(described)


async def death_run(target: str, prompts: Sequence[str], kill: Callable[[], str]) -> DeathRun:
    """Send every prompt at once, kill when a share of the tokens has streamed, then probe the endpoint."""
    progress = Progress()
    started = time.perf_counter()
    load = asyncio.ensure_future(run_batch([target], prompts, len(prompts), DEATH_MAX_TOKENS, timeout_s=180.0,
                                           progress=progress))
    threshold = DEATH_KILL_SHARE * len(prompts) * DEATH_MAX_TOKENS
    while progress.tokens < threshold and not load.done():
        await asyncio.sleep(0.02)
    kill_at = time.perf_counter()
    killed = kill()
    result = await load
    completed_before = sum(1 for o in result.outcomes if o.ok and o.sent_at + o.latency_s <= kill_at)
    probes: list[Probe] = []
    async with client_session(4, PROBE_TIMEOUT_S) as session:
        while time.perf_counter() - kill_at < PROBE_SECONDS:
            sent = time.perf_counter()
            outcome = await stream_completion(session, target, "hello world, are you there", 8)
            probes.append(Probe(sent - kill_at, outcome))
            await asyncio.sleep(max(0.0, PROBE_INTERVAL_S - (time.perf_counter() - sent)))
    after = await run_batch([target], [f"{i} after the kill: hello world" for i in range(AFTER_REQUESTS)],
                            CONCURRENCY, 16, timeout_s=60.0)
    return DeathRun(result, killed, kill_at - started, completed_before, probes, after, [])


def probes_text(probes: Sequence[Probe]) -> str:
    """The probes as runs of ok/failed with their times since the kill, e.g. `fail 0.0-5.8 s (12x HTTP 503), ok 6.3-19.9
    s (28)`."""
    parts: list[str] = []
    index = 0
    while index < len(probes):
        ok = probes[index].outcome.ok
        end = index
        while end + 1 < len(probes) and probes[end + 1].outcome.ok == ok:
            end += 1
        span = probes[index:end + 1]
        kinds = "" if ok else f", {errors_text(Batch([p.outcome for p in span], 1.0).errors())}"
        parts.append(f"{'ok' if ok else 'FAIL'} {span[0].at_s:.1f}-{span[-1].at_s:.1f} s ({len(span)}{kinds})")
        index = end + 1
    return ", ".join(parts) or "none"


def print_death(arm: str, run: DeathRun) -> None:
    ok = len(run.batch.ok)
    total = len(run.batch.outcomes)
    probes_ok = sum(1 for p in run.probes if p.outcome.ok)
    print(f"  {arm}: killed at {run.kill_at_s:.1f} s into the batch ({run.killed})")
    print(f"    {ok}/{total} requests completed ({run.completed_before_kill} of them before the kill); "
          f"failed: {errors_text(run.batch.errors())}")
    print(f"    probes after the kill: {probes_ok}/{len(run.probes)} ok: {probes_text(run.probes)}")
    print(f"    then {len(run.after.ok)}/{len(run.after.outcomes)} of a batch of {AFTER_REQUESTS} ok"
          f"{'' if not run.after.errors() else ' (failed: ' + errors_text(run.after.errors()) + ')'}")
    for note in run.notes:
        print(f"    {note}")


def router_failure_samples(metrics_url: str) -> list[str]:
    """The router's retry, circuit-breaker and worker-health samples, as `name{labels} value` lines."""
    marks = ("retr", "cb_", "circuit", "health", "active_workers", "error", "fail")
    return [f"{key} {value:g}" for key, value in sorted(scrape(metrics_url).items())
            if any(m in key.split("{")[0] for m in marks)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--death-policy", choices=("rr", "ca"), default="rr",
                        help="the router the replica-death run goes through (default rr: round_robin)")
    args = parser.parse_args()
    reason = check_engine_python()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    sizes = sizes_from(args)
    install_signal_handlers()
    work = Path(tempfile.mkdtemp(prefix="npuops-bench-dp-"))
    processes = Processes(work)
    arms = ["native", "rr", "ca"]
    throughput: dict[str, list[Batch]] = {arm: [] for arm in arms}
    prefix: dict[str, list[PrefixRun]] = {arm: [] for arm in arms}
    deaths: dict[str, DeathRun] = {}
    try:
        model = args.model or make_model(work)
        prompts = PromptMaker(model, args.seed)
        port0, port1, native_port, native_rpc_port = free_ports(4)
        replicas = [spawn_replica(processes, f"replica{i}", model, port, cores=replica_cores(i))
                    for i, port in enumerate((port0, port1))]
        replica_urls = [f"http://127.0.0.1:{port}" for port in (port0, port1)]
        # One API server, two engine cores; the RPC port is only used across nodes, but its default (29550) may be
        # taken on a shared machine.
        # Its two engine cores on the same cores as the two replicas (vLLM maps DP rank N to the N-th "|" list).
        native_cores = "|".join(c for c in (replica_cores(0), replica_cores(1)) if c) or None
        native = spawn_replica(processes, "native-dp2", model, native_port,
                               ("--data-parallel-size", "2", "--data-parallel-rpc-port", str(native_rpc_port)),
                               cores=native_cores if native_cores and "|" in native_cores else None)
        native_url = f"http://127.0.0.1:{native_port}"
        print("starting 2 replicas and a --data-parallel-size 2 server ...", flush=True)
        healthy_s = wait_healthy([*zip(replicas, replica_urls, strict=True), (native, native_url)])
        print(f"  all healthy in {healthy_s:.1f} s; native DP engine cores: "
              f"{[p.pid for r in (0, 1) for p in engine_core_family(native, r)[:1]]}", flush=True)
        rr_port, rr_metrics, ca_port, ca_metrics = free_ports(4)
        routers = {"rr": spawn_router(processes, "router-rr", replica_urls, "round_robin", rr_port, rr_metrics),
                   "ca": spawn_router(processes, "router-ca", replica_urls, "cache_aware", ca_port, ca_metrics)}
        router_urls = {"rr": f"http://127.0.0.1:{rr_port}", "ca": f"http://127.0.0.1:{ca_port}"}
        router_metrics = {"rr": f"http://127.0.0.1:{rr_metrics}/metrics", "ca": f"http://127.0.0.1:{ca_metrics}/metrics"}
        wait_healthy([(routers[a], router_urls[a]) for a in ("rr", "ca")], timeout=120)
        targets = {"native": native_url, **router_urls}
        replica_metrics = [f"{url}/metrics" for url in replica_urls]
        metrics_for = {"native": [f"{native_url}/metrics"], "rr": replica_metrics, "ca": replica_metrics}

        print(f"(1) throughput: {sizes.requests} requests of ~{sizes.prompt_tokens} prompt + {sizes.max_tokens} "
              f"output tokens, {CONCURRENCY} concurrent, {sizes.rounds} interleaved round(s) after a warm-up",
              flush=True)
        for arm in arms:
            batch([targets[arm]], [prompts.unique(sizes.prompt_tokens) for _ in range(CONCURRENCY)], CONCURRENCY,
                  sizes.max_tokens)
        for r in range(sizes.rounds):
            line = []
            for arm in rotated(arms, r):
                result = batch([targets[arm]], [prompts.unique(sizes.prompt_tokens) for _ in range(sizes.requests)],
                               CONCURRENCY, sizes.max_tokens)
                throughput[arm].append(result)
                line.append(f"{arm} {result.tokens_per_s:6.1f} tok/s TTFT {result.ttft_mean * 1e3:6.1f} ms"
                            f"{'' if not result.errors() else ' errors: ' + errors_text(result.errors())}")
            print(f"  round {r + 1}: " + " | ".join(line), flush=True)

        print(f"(2) shared prefixes: {sizes.groups} groups x {sizes.per_group} requests, ~{sizes.prefix_tokens}-token "
              f"prefix + ~{sizes.suffix_tokens}-token suffix, {sizes.prefix_max_tokens} output tokens, "
              f"{CONCURRENCY} concurrent, fresh prefixes per batch", flush=True)
        for r in range(sizes.rounds):
            line = []
            for arm in rotated(arms, r):
                batch_prompts = prompts.shared_prefix(sizes.groups, sizes.per_group, sizes.prefix_tokens,
                                                      sizes.suffix_tokens)
                run = run_prefix(targets[arm], batch_prompts, metrics_for[arm], sizes.prefix_max_tokens,
                                 router_metrics.get(arm))
                prefix[arm].append(run)
                spread = f" spread {spread_text(run.decisions)}" if run.decisions else ""
                line.append(f"{arm} hit {run.hit_rate:.3f} TTFT {run.batch.ttft_mean * 1e3:6.1f} ms{spread}"
                            f"{'' if not run.batch.errors() else ' errors: ' + errors_text(run.batch.errors())}")
            print(f"  round {r + 1}: " + " | ".join(line), flush=True)

        print(f"(3) a replica dies: {DEATH_REQUESTS} requests of {DEATH_MAX_TOKENS} tokens at once, SIGKILL after "
              f"{DEATH_KILL_SHARE:.0%} of their tokens", flush=True)
        death_arm = args.death_policy
        victim = replicas[1]

        def kill_replica() -> str:
            family = Processes.family(victim)
            os.killpg(victim.pid, signal.SIGKILL)
            return f"SIGKILL to process group {victim.pid} ({len(family)} processes: vllm serve, EngineCore, worker)"

        before = router_decisions(router_metrics[death_arm])
        run = asyncio.run(death_run(router_urls[death_arm], [prompts.unique(32) for _ in range(DEATH_REQUESTS)],
                                    kill_replica))
        after = router_decisions(router_metrics[death_arm])
        run.notes.append(f"router decisions per replica during the run: "
                         f"{spread_text({w: n - before.get(w, 0.0) for w, n in after.items()})}")
        run.notes.extend(f"router metric: {line}" for line in router_failure_samples(router_metrics[death_arm]))
        deaths[f"router ({death_arm})"] = run
        print_death(f"router ({death_arm})", run)
        for name in ("router-rr", "router-ca", "replica0", "replica1"):  # free the cores for the native death run
            for started in [s for s in processes.started if s.name == name]:
                processes.stop(started)
                processes.started.remove(started)

        cores = engine_core_family(native, 1)
        if not cores:
            raise BenchError(f"no EngineCore_DP1 process under the native server {native.pid}")
        run = asyncio.run(death_run(native_url, [prompts.unique(32) for _ in range(DEATH_REQUESTS)],
                                    lambda: "SIGKILL to " + kill_family(cores)))
        time.sleep(1.0)
        run.notes.append(f"native API server (pid {native.pid}) "
                         f"{'still running' if native.popen.poll() is None else f'exited {native.popen.returncode}'}"
                         f"; engine core DP0 {'alive' if engine_core_family(native, 0) else 'gone'}")
        deaths["native"] = run
        print_death("native", run)
    except (BenchError, KeyboardInterrupt) as exc:
        print(f"error: {exc}", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        finish(processes, work, keep=args.keep)

    print()
    print(f"summary: vllm-router over 2 `vllm serve` replicas (rr, ca) versus one `vllm serve --data-parallel-size 2` "
          f"(native), tiny model, CPU engine; medians over {sizes.rounds} interleaved round(s)")
    print(f"(1) {sizes.requests} requests, {CONCURRENCY} concurrent, {sizes.max_tokens} output tokens each:")
    print_throughput_summary(arms, throughput, "native")
    print(f"(2) shared prefixes, {sizes.groups} groups x {sizes.per_group}:")
    print_prefix_summary(arms, prefix, sizes.prefix_tokens)
    native_hit = median(r.hit_rate for r in prefix["native"])
    native_ttft = median(r.batch.ttft_mean for r in prefix["native"])
    for arm in ("rr", "ca"):
        print(f"  {arm}/native: hit rate {ratio(median(r.hit_rate for r in prefix[arm]), native_hit):.3f}, TTFT mean "
              f"{ratio(median(r.batch.ttft_mean for r in prefix[arm]), native_ttft):.3f}")
    print(f"(3) one replica killed mid-run ({DEATH_REQUESTS} requests in flight or queued):")
    for arm, run in deaths.items():
        print(f"  {arm:<14} {len(run.batch.ok):>3}/{len(run.batch.outcomes)} completed; probes ok "
              f"{sum(1 for p in run.probes if p.outcome.ok)}/{len(run.probes)}; batch after "
              f"{len(run.after.ok)}/{len(run.after.outcomes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
