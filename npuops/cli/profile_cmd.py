from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from npuops.cli.main import load_context_settings
from npuops.errors import EnvironmentMissingError, UsageError


@click.command()
@click.argument("name")
@click.option("--seconds", type=click.FloatRange(1, 600), default=10, show_default=True,
              help="How long to profile (drive the instance's load meanwhile).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              help="Where to copy the traces [default: ./npuops-profile-NAME-<time>].")
@click.option("--steps", type=click.IntRange(1, 100000), default=100, show_default=True,
              help="Engine steps to record at most (a trace of every step of a busy engine takes minutes to write).")
@click.option("--top", type=click.IntRange(1, 100), default=15, show_default=True, help="Operators to list.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def profile(ctx: click.Context, /, name: str, seconds: float, output: Path | None, steps: int, top: int,
            as_json: bool) -> None:
    """Profile instance NAME with vLLM's profiler for --seconds, then say where its time goes: the operators by self
    time and the shares of attention, matmul, communication and the host. The instance must have been launched
    with --profiling; the traces open in Perfetto (ui.perfetto.dev) or MindStudio Insight."""
    from npuops.envfile import read_env_file
    from npuops.httpclient import base_url, http_request
    from npuops.instance.record import ENV_FILE, load_record
    from npuops.support.instance_paths import instance_paths
    from npuops.support.profile import run_profile

    settings = load_context_settings(ctx)
    record = load_record(settings.state_dir, name)
    if not record.profiler_dir:
        raise UsageError(f"{name} was launched without profiling (vLLM's /start_profile needs its profiler "
                         "configured)", f"launch {name} again with --profiling")
    if not record.serves_api:
        raise UsageError(f"{name} is a part that serves no API on this host",
                         "profile the instance on the host that serves its endpoint")
    # Where its env file and traces are, npuops derives (the record's paths are not followed).
    paths = instance_paths(settings, name, record)
    env_file = Path(str(paths.instance_dir / ENV_FILE))
    api_key = read_env_file(env_file, f"launch {name} again").get("VLLM_API_KEY") if record.api_key else None
    url = base_url(record.host, record.port)
    out = output or Path.cwd() / f"npuops-profile-{name}-{time.strftime('%Y%m%d-%H%M%S')}"

    def post(path: str, body: dict[str, Any]) -> tuple[int, bytes] | None:
        return http_request(url + path, data=body, timeout=600, api_key=api_key)

    def progress(text: str) -> None:
        if not as_json:
            click.echo(f"profile: {text}", err=True)

    try:
        run = run_profile(post, paths.profiles, out, seconds, steps=steps, progress=progress)
    except RuntimeError as exc:
        raise EnvironmentMissingError(f"profiling {name} failed: {exc}",
                                      f"check `npuops status {name}`; it must be healthy to profile") from None
    assert run.summary is not None
    summary = {"instance": name, "seconds": seconds, "steps": steps, "output": str(out),
               "traces": [str(p) for p in run.traces],
               "skipped": [{"trace": trace, "why": why} for trace, why in run.skipped],
               **run.summary.to_json(top)}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for line in summary_lines(summary):
        click.echo(line)
    sys.stdout.flush()


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary as the terminal shows it. Operator names, trace names and reasons come from files the engine's
    service user writes: each is escaped (npuops.safefiles.printable), so no escape sequence reaches the terminal."""
    from npuops.safefiles import printable

    shares = ", ".join(f"{kind} {share * 100:.0f}%" for kind, share in summary["shares"].items())
    lines = [f"{summary['instance']}: {summary['total_ms']:.0f} ms of operators in {summary['seconds']:g} s ({shares})",
             f"{'operator':<58} {'self ms':>9} {'calls':>7}  kind"]
    lines += [f"{printable(op['name'])[:58]:<58} {op['self_ms']:>9.1f} {op['calls']:>7}  {op['kind']}"
              for op in summary["top_operators"]]
    if summary.get("bad_events"):
        lines.append(f"left out: {summary['bad_events']} operator events without a name or with times that are not "
                     "finite numbers")
    lines += [printable(f"left out: {s['trace']}: {s['why']}")[:200] for s in summary["skipped"]]
    lines.append(f"traces: {printable(summary['output'])} (open in ui.perfetto.dev or MindStudio Insight)")
    return lines
