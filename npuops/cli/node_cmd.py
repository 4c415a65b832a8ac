from __future__ import annotations

import json
from pathlib import Path

import click

from npuops.cli.fleet_flags import (
    ARTIFACTS,
    FORKS,
    HOSTS,
    INVENTORY,
    LIMIT,
    artifacts_dir,
    fleet_flags,
    local_npuops,
    playbook_progress,
)
from npuops.cli.main import load_context_settings
from npuops.errors import ExitCode, UsageError


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the node model as JSON.")
@click.option("--npu-smi", "npu_smi", default=None, help="The npu-smi command to run [default: npu-smi].")
@fleet_flags(INVENTORY, HOSTS, LIMIT, FORKS, ARTIFACTS)
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
    from npuops.fleet.facts import collect_node_models

    settings = load_context_settings(ctx)
    facts = collect_node_models(inventory=inventory if inventory is not None else hosts,
                                artifacts_dir=artifacts_dir(settings, artifacts), limit=limit, forks=forks,
                                npuops_command=local_npuops(hosts),
                                on_event=playbook_progress(changed_as_ok=True, quiet=as_json))
    if as_json:
        click.echo(json.dumps(facts.to_json(), indent=2))
    else:
        from npuops.hardware.node_text import render_fleet_text

        click.echo(render_fleet_text(facts.to_json()))
    if not facts.ok:
        ctx.exit(int(ExitCode.CHECKS_FAILED))
