from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from npuops.cli.main import load_context_settings
from npuops.errors import ExitCode, UsageError


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the node model as JSON.")
@click.option("--npu-smi", "npu_smi", default=None, help="The npu-smi command to run [default: npu-smi].")
@click.option("-i", "--inventory", type=click.Path(path_type=Path),
              help="Ansible inventory: show the node model of every host (the fleet).")
@click.option("--host", "hosts", multiple=True, help="A host to inspect over Ansible (repeatable); "
              "localhost uses a local connection.")
@click.option("--limit", help="Ansible host pattern to limit the inventory to.")
@click.option("--forks", type=click.IntRange(1, 500), default=10, show_default=True)
@click.option("--artifacts", type=click.Path(file_okay=False, path_type=Path),
              help="Where to keep the Ansible run's artifacts.")
@click.pass_context
def node(ctx: click.Context, /, as_json: bool, npu_smi: str | None, inventory: Path | None, hosts: tuple[str, ...],
         limit: str | None, forks: int, artifacts: Path | None) -> None:
    """Show this node (or, with -i/--host, every host): NPUs, driver, CANN, Python stack and host.

    Works on any machine: without an Ascend driver it says so and why.
    """
    if inventory is not None or hosts:
        if inventory is not None and hosts:
            raise UsageError("-i/--inventory and --host do not go together", "use one of them")
        _fleet(ctx, as_json, inventory, list(hosts), limit, forks, artifacts)
        return
    from npuops.hardware.node import discover_node
    from npuops.hardware.node_text import render_node_text
    from npuops.hardware.probe import Probe

    settings = load_context_settings(ctx, npu_smi=npu_smi)
    found = discover_node(Probe(settings))
    if as_json:
        click.echo(json.dumps(found.to_json(), indent=2))
    else:
        click.echo(render_node_text(found))


def _fleet(ctx: click.Context, as_json: bool, inventory: Path | None, hosts: list[str], limit: str | None,
           forks: int, artifacts: Path | None) -> None:
    from npuops.fleet.events import PlaybookEvent
    from npuops.fleet.facts import collect_node_models
    from npuops.fleet.runner import default_artifacts_dir

    settings = load_context_settings(ctx)
    if artifacts is None:
        artifacts = default_artifacts_dir(settings.environ, is_root=os.geteuid() == 0)
    # Only when every host is this machine is it right to run this very npuops there.
    local_only = bool(hosts) and all(h in ("localhost", "127.0.0.1") for h in hosts)
    command = str(Path(sys.executable).parent / "npuops") if local_only else None

    def progress(event: PlaybookEvent) -> None:
        if event.kind in ("ok", "changed", "failed", "unreachable") and not as_json:
            click.echo(f"  {event.host}: {event.task or ''} {event.kind}", err=True)

    facts = collect_node_models(inventory=inventory if inventory is not None else hosts, artifacts_dir=artifacts,
                                limit=limit, forks=forks, npuops_command=command, on_event=progress)
    if as_json:
        click.echo(json.dumps(facts.to_json(), indent=2))
    else:
        from npuops.hardware.node_text import render_fleet_text

        click.echo(render_fleet_text(facts.to_json()))
    if not facts.ok:
        ctx.exit(int(ExitCode.CHECKS_FAILED))
