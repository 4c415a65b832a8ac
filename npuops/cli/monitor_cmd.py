"""`npuops monitor`: what Prometheus needs to watch this node's instances."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import click

from npuops.cli.main import load_context_settings


def _address(value: str) -> str | None:
    return None if value.lower() == "none" else value


@click.group()
def monitor() -> None:
    """Prometheus targets, recording rules and alert rules for this node's instances."""


@monitor.command()
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The directory to write prometheus.yml, targets/*.json and rules/ into.")
@click.option("--node-exporter", default="127.0.0.1:9100", show_default=True,
              help="node_exporter's HOST:PORT (the doctor's textfile, the clock), or `none`.")
@click.option("--npu-exporter", default="none", show_default=True,
              help="MindCluster npu-exporter's HOST:PORT where it runs, or `none`.")
@click.option("--docs-url", help="Where the check pages are, for the alerts' runbook links "
              "[default: this npuops' own checks/docs].")
@click.option("--latency-factor", type=float, default=3.0, show_default=True,
              help="Alert when an instance's TTFT or TPOT p99 is this many times its plan's prediction.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@click.pass_context
def render(ctx: click.Context, /, output: Path, node_exporter: str, npu_exporter: str, docs_url: str | None,
           latency_factor: float, as_json: bool) -> None:
    """Write a Prometheus configuration for the instances launched on this node: one scrape job per kind of
    target (engines, routers, node_exporter, npu-exporter) over file_sd target files, and npuops' recording and
    alert rules (each instance's latency alerts against its own plan's prediction)."""
    from npuops.doctor.explain import doc_page
    from npuops.instance.record import list_records
    from npuops.monitor.render import MonitorChoices, render_monitoring, write_monitoring

    settings = load_context_settings(ctx)
    choices = MonitorChoices(node_exporter=_address(node_exporter), npu_exporter=_address(npu_exporter),
                             docs_url=docs_url or doc_page("chip-health").parent.as_uri(),
                             latency_factor=latency_factor)
    records = list_records(settings.state_dir)
    files = render_monitoring(records, socket.gethostname(), choices)
    written = write_monitoring(output, files)
    if as_json:
        click.echo(json.dumps({"ok": True, "output": str(output), "files": [str(p) for p in written],
                               "instances": sorted({r.behind or r.name for r in records})}, indent=2))
        return
    click.echo(f"wrote {len(written)} files to {output} for {len(records)} instance part(s)")
    click.echo(f"  run:   prometheus --config.file={output / 'prometheus.yml'}")
    click.echo("  check: promtool check config " + str(output / "prometheus.yml"))
