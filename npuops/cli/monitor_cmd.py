"""`npuops monitor`: what Prometheus needs to watch this node's instances."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import click

from npuops.cli.fleet_flags import ARTIFACTS, FORKS, GROUP, INVENTORY, artifacts_dir, fleet_flags, playbook_progress
from npuops.cli.main import load_context_settings
from npuops.errors import ExitCode, UsageError


def _address(value: str) -> str | None:
    return None if value.lower() == "none" else value


@click.group()
def monitor() -> None:
    """Prometheus targets, recording rules and alert rules for this node's instances."""


@monitor.command()
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The directory to write prometheus.yml, targets/*.json and rules/ into.")
@click.option("--node-exporter", default="127.0.0.1:9100", show_default=True,
              help="node_exporter's HOST:PORT on each node (the doctor's textfile, the clock), or `none`.")
@click.option("--npu-exporter", default="none", show_default=True,
              help="MindCluster npu-exporter's HOST:PORT where it runs, or `none`.")
@click.option("--docs-url", help="Where the check pages are, for the alerts' runbook links: an http(s) or file "
              "URL, spaces, quotes and braces percent-encoded [default: this npuops' own checks/docs].")
@click.option("--latency-factor", type=float, default=3.0, show_default=True,
              help="Alert when an instance's TTFT or TPOT p99 is this many times its plan's prediction.")
@click.option("--scrape-interval", "scrape_interval_s", type=int, default=15, show_default=True,
              help="Seconds between scrapes and between rule evaluations (1 to 300).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@fleet_flags(INVENTORY, GROUP, FORKS, ARTIFACTS)
@click.pass_context
def render(ctx: click.Context, /, output: Path, node_exporter: str, npu_exporter: str, docs_url: str | None,
           latency_factor: float, scrape_interval_s: int, as_json: bool, inventory: Path | None, group: str | None,
           forks: int, artifacts: Path | None) -> None:
    """Write a Prometheus configuration for the instances launched on this node: one scrape job per kind of
    target (engines, routers, node_exporter, npu-exporter) over file_sd target files, npuops' recording and alert
    rules (each instance's latency alerts against its own plan's prediction) and three Grafana dashboards.
    Launch, stop, remove and rollout on this node keep DIR current.

    With -i INVENTORY --group GROUP: every host's instances, for a Prometheus on this machine (rendered once: run
    it again after the group changes)."""
    from npuops.doctor.explain import doc_page
    from npuops.monitor.render import MonitorChoices

    settings = load_context_settings(ctx)
    choices = MonitorChoices(node_exporter=_address(node_exporter), npu_exporter=_address(npu_exporter),
                             docs_url=docs_url or doc_page("chip-health").parent.as_uri(),
                             latency_factor=latency_factor, scrape_interval_s=scrape_interval_s)
    if inventory is not None or group is not None:
        _render_group(settings, output, choices, inventory, group, forks, artifacts, as_json)
        return
    from npuops.monitor.refresh import render_node, save_render

    done = render_node(settings.state_dir, output, socket.gethostname(), choices)
    save_render(settings.state_dir, output, choices)
    if as_json:
        click.echo(json.dumps({"ok": not done.refused, "output": str(output), "files": [str(p) for p in done.written],
                               "instances": sorted({r.behind or r.name for r in done.records}),
                               "refused": done.refused}, indent=2))
    else:
        click.echo(f"wrote {len(done.written)} files to {output} for {len(done.records)} instance part(s)")
        for line in done.refused:
            click.echo(f"  not watched: {line}")
        click.echo(f"  run:   prometheus --config.file={output / 'prometheus.yml'}")
        click.echo("  check: promtool check config " + str(output / "prometheus.yml"))
        click.echo("  launch, stop, remove and rollout keep its targets and rules current (Prometheus re-reads them)")
    if done.refused:
        raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))


def _render_group(settings: Any, output: Path, choices: Any, inventory: Path | None, group: str | None, forks: int,
                  artifacts: Path | None, as_json: bool) -> None:
    from npuops.fleet.progress import PROBLEMS
    from npuops.monitor.fleet_render import gather_group
    from npuops.monitor.render import render_hosts, write_monitoring

    if inventory is None or group is None:
        raise UsageError("-i/--inventory and --group go together", "give both, or neither for this host")
    hosts, failed = gather_group(inventory, group, artifacts_dir=artifacts_dir(settings, artifacts), forks=forks,
                                 on_event=playbook_progress(tasks=False, results=PROBLEMS, quiet=as_json))
    rendered = render_hosts(hosts, choices)
    written = write_monitoring(output, rendered.files)
    parts = sum(len(records) for _, records in hosts)
    failed = [*failed, *rendered.refused]
    if as_json:
        click.echo(json.dumps({"ok": not failed, "output": str(output), "files": [str(p) for p in written],
                               "hosts": [reach.host for reach, _ in hosts], "unreachable": rendered.unreachable,
                               "failed": failed}, indent=2))
    else:
        click.echo(f"wrote {len(written)} files to {output} for {parts} instance part(s) on {len(hosts)} host(s)")
        for line in rendered.unreachable:
            click.echo(f"  not scraped from here: {line} (run Prometheus on that host too)")
        for line in failed:
            click.echo(f"  not watched: {line}")
        click.echo(f"  run:   prometheus --config.file={output / 'prometheus.yml'}")
    if failed:
        raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))


@monitor.command()
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON (what `monitor render -i` reads).")
@click.pass_context
def targets(ctx: click.Context, /, as_json: bool) -> None:
    """This node's instance parts Prometheus should watch (all but what its operator stopped)."""
    from npuops.instance.record import list_records
    from npuops.monitor.fleet_render import node_answer

    settings = load_context_settings(ctx)
    answer = node_answer(list_records(settings.state_dir))
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    for record in answer["records"]:
        click.echo(f"{record['name']}: {record['role']} on {record['host']}:{record['port']}")


@monitor.command("doctor-timer")
@click.option("--textfile-dir", type=click.Path(file_okay=False, path_type=Path),
              default="/var/lib/prometheus/node-exporter", show_default=True,
              help="node_exporter's textfile collector directory (--collector.textfile.directory).")
@click.option("--interval", "interval_s", type=int, default=300, show_default=True,
              help="Seconds between the doctor's runs (60 to 900).")
@click.option("--level", type=click.IntRange(1, 2), default=1, show_default=True,
              help="The doctor's level: 1 the fast checks, 2 adds the stack's.")
@click.option("--npuops", "npuops_bin", help="The npuops executable the timer runs [default: this one].")
@click.option("--dry-run", is_flag=True, help="Print the two units instead of installing them.")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@click.pass_context
def doctor_timer(ctx: click.Context, /, textfile_dir: Path, interval_s: int, level: int, npuops_bin: str | None,
                 dry_run: bool, as_json: bool) -> None:
    """Install npuops-doctor.service and npuops-doctor.timer: `npuops doctor --prometheus` into node_exporter's
    textfile directory every few minutes, which the alert rules of `npuops monitor render` read (a failing check,
    a chip's health and temperature, and the textfile going stale). Provisioning installs it on every host."""
    from npuops.errors import EnvironmentMissingError
    from npuops.instance.manager import service_manager
    from npuops.monitor.doctor_timer import DoctorTimer, install_doctor_timer, render_doctor_units, this_npuops

    settings = load_context_settings(ctx)
    timer = DoctorTimer(npuops=npuops_bin or this_npuops(), textfile_dir=textfile_dir, interval_s=interval_s,
                        level=level, ascend_root=settings.ascend_root)
    if dry_run:
        units = render_doctor_units(timer)
        if as_json:
            click.echo(json.dumps({"ok": True, "units": units}, indent=2))
        else:
            click.echo("\n".join(f"# {name}\n{text}" for name, text in units.items()))
        return
    manager = service_manager(settings)
    reason = manager.unavailable_reason()
    if reason:
        raise EnvironmentMissingError(reason, "install the timer on a node whose init is systemd, or use --dry-run")
    done = install_doctor_timer(timer, manager)
    if as_json:
        click.echo(json.dumps({"ok": True, **done}, indent=2))
        return
    click.echo(f"npuops-doctor.timer: `npuops doctor --level {level}` every {interval_s} s into {done['textfile']}"
               + ("" if done["changed"] else " (unchanged)"))
