from __future__ import annotations

import json

import click

from npuops.cli.main import load_context_settings


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the node model as JSON.")
@click.option("--npu-smi", "npu_smi", default=None, help="The npu-smi command to run [default: npu-smi].")
@click.pass_context
def node(ctx: click.Context, as_json: bool, npu_smi: str | None) -> None:
    """Show this node: NPUs, driver, CANN, Python stack and host.

    Works on any machine: without an Ascend driver it says so and why.
    """
    from npuops.hardware.node import discover_node
    from npuops.hardware.node_text import render_node_text
    from npuops.hardware.probe import Probe

    settings = load_context_settings(ctx, npu_smi=npu_smi)
    found = discover_node(Probe(settings))
    if as_json:
        click.echo(json.dumps(found.to_json(), indent=2))
    else:
        click.echo(render_node_text(found))
