"""`npuops tune MODEL [plan flags]`: real trials, guided by the performance model, for the best configuration."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from npuops.cli.main import load_context_settings
from npuops.cli.plan_options import plan_flags, request_from_flags


@click.command()
@plan_flags
@click.option("--budget", type=click.IntRange(1, 100), default=6, show_default=True,
              help="Trials at most (each one engine start and one bench).")
@click.option("--slo-ttft-ms", type=click.FloatRange(0, min_open=True), help="Median TTFT a trial must keep.")
@click.option("--slo-tpot-ms", type=click.FloatRange(0, min_open=True), help="Median TPOT a trial must keep.")
@click.option("--slo-e2e-ms", type=click.FloatRange(0, min_open=True), help="Median end-to-end latency to keep.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("tuned.json"),
              show_default=True, help="Where to write the best configuration (`npuops launch --tuned FILE`).")
@click.option("--name", default="tune", show_default=True, help="Instance name the trials run under.")
@click.option("--port", type=click.IntRange(1024, 65535), default=18700, show_default=True,
              help="Port the trials serve on (127.0.0.1).")
@click.option("--vllm", "vllm_bin", help="The vllm executable the trials run [default: the serving venv's].")
@click.option("--num-prompts", type=click.IntRange(1), help="Requests per trial's bench [default: as npuops bench].")
@click.option("--json", "as_json", is_flag=True, help="Print every trial's figures as JSON.")
@click.pass_context
def tune(ctx: click.Context, /, budget: int, slo_ttft_ms: float | None, slo_tpot_ms: float | None,
         slo_e2e_ms: float | None, output: Path, name: str, port: int, vllm_bin: str | None, num_prompts: int | None,
         as_json: bool, **flags: Any) -> None:
    """Search max_num_seqs, max_num_batched_tokens (and on NPUs gpu_memory_utilization and the TP/replica split)
    for the highest throughput within the SLOs: each trial a real engine under npuops' supervisor and a bench,
    each next trial picked by the performance model. Writes the best as --output for `npuops launch --tuned`."""
    from npuops.bench.tune import Slo, TuneRequest
    from npuops.bench.tune import tune as run_tune
    from npuops.instance.record import validate_instance_name

    validate_instance_name(name)
    settings = load_context_settings(ctx)
    planned = request_from_flags(flags)
    if planned.pd is not None or planned.kv_port is not None:
        from npuops.errors import UsageError

        raise UsageError("tune searches one co-located engine's options", "drop --pd/--kv-port; tune the pools "
                         "separately with --devices (or the CPU target) and launch --pd")
    request = TuneRequest(plan=planned, output=output, budget=budget,
                          slo=Slo(slo_ttft_ms, slo_tpot_ms, slo_e2e_ms), name=name, port=port, vllm=vllm_bin,
                          num_prompts=num_prompts)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = run_tune(settings, request, progress)
    if as_json:
        click.echo(json.dumps({"ok": True, **result}, indent=1))
        return
    best = result["best"]
    click.echo(f"tune {result['model']}: {len(result['trials'])} trials of {result['candidates']} candidates")
    for i, trial in enumerate(result["trials"], 1):
        m = trial["measured"]
        figures = (f"{m['output_tokens_per_s']:.1f} tok/s, TTFT {m['ttft_ms']:.1f} ms, TPOT {m['tpot_ms']:.2f} ms"
                   if m else f"failed: {trial['error']}")
        mark = "*" if trial["options"] == best["options"] else " "
        options = " ".join(f"{k}={v}" for k, v in trial["options"].items())
        click.echo(f" {mark} {i}. {options}: {figures}")
    click.echo(f"best written to {result['file']}: npuops launch --tuned {result['file']}")
