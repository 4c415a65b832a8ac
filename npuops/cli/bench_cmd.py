"""`npuops bench NAME|URL`: vLLM's own benchmark against an instance, beside the plan's prediction."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from npuops.cli.main import load_context_settings
from npuops.cli.plan_options import declared_type
from npuops.plan.inputs import Workload


@click.command()
@click.argument("target", metavar="NAME|URL")
@click.option("--input-len", type=declared_type(Workload, "input_len"), help="Prompt tokens [default: the plan's].")
@click.option("--output-len", type=declared_type(Workload, "output_len"),
              help="Output tokens per request, exactly (--ignore-eos) [default: the plan's].")
@click.option("--concurrency", type=declared_type(Workload, "concurrency"),
              help="Requests in flight at most [default: the plan's].")
@click.option("--request-rate", type=declared_type(Workload, "request_rate"),
              help="Requests per second, Poisson arrivals [default: the plan's, else all at once].")
@click.option("--num-prompts", type=click.IntRange(1), help="Requests in all [default: 10 per slot, 40 at least].")
@click.option("--seed", type=click.IntRange(0),
              help="Seed of the random prompts, to repeat a bench's exact prompts [default: a fresh one, so they are "
                   "new to the instance's prefix cache; the report keeps it].")
@click.option("--baseline", type=click.Choice(["transformers"]),
              help="Also run the same prompts through plain PyTorch (transformers generate, static batches) and "
                   "print vLLM/plain beside the claim tested (docs/claims.md): 1.7x / -40%.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=Path),
              help="With a URL: the served model's directory (its tokenizer).")
@click.option("--served-model-name", help="With a URL: the model name the endpoint serves [default: --model's name].")
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="With a URL: a file holding the API key (an instance's key is read from its env file).")
@click.option("--vllm", "vllm_bin", help="The vllm executable to bench with [default: the instance's].")
@click.option("--no-calibrate", is_flag=True, help="Do not store this bench as a calibration sample of the node.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(10), default=1800, show_default=True,
              help="Seconds the benchmark may take.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def bench(ctx: click.Context, /, target: str, input_len: int | None, output_len: int | None, concurrency: int | None,
          request_rate: float | None, num_prompts: int | None, seed: int | None, baseline: str | None,
          model_dir: Path | None, served_model_name: str | None, api_key_file: Path | None, vllm_bin: str | None,
          no_calibrate: bool, timeout_s: float, as_json: bool) -> None:
    """Measure TARGET (an instance NAME, or an endpoint URL) with `vllm bench serve`.

    TTFT, TPOT, ITL and end-to-end latency (median, p99), request and output-token throughput, each beside the
    plan's prediction for the same load (measured/predicted) and the hardware's limit (decode against the
    HBM-bandwidth roofline, prefill against peak FLOPs). The report is kept under the instance's directory
    (`npuops status NAME` shows the last one) and calibrates the node's later plans.
    """
    from npuops.bench.report import render_report_text
    from npuops.bench.run import BenchRequest, dump, run_bench

    settings = load_context_settings(ctx)
    request = BenchRequest(target=target, input_len=input_len, output_len=output_len, concurrency=concurrency,
                           request_rate=request_rate, num_prompts=num_prompts, seed=seed, baseline=baseline,
                           model=str(model_dir) if model_dir else None, served_model_name=served_model_name,
                           vllm=vllm_bin, api_key_file=api_key_file, timeout_s=timeout_s, calibrate=not no_calibrate)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = run_bench(settings, request, progress)
    if as_json:
        dump({"ok": True, **report})
    else:
        click.echo(render_report_text(report))
