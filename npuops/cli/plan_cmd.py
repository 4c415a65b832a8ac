from __future__ import annotations

import json
from typing import Any

import click

from npuops.cli.main import load_context_settings
from npuops.cli.plan_options import plan_flags, request_from_flags


@click.command()
@plan_flags
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.pass_context
def plan(ctx: click.Context, /, as_json: bool, **flags: Any) -> None:
    """Work out a tuned, explained vLLM configuration for MODEL (a model directory or a catalog name).

    Nothing is started: `npuops launch` runs a plan.
    """
    from npuops.plan.request import plan_request

    settings = load_context_settings(ctx)
    result = plan_request(settings, request_from_flags(flags))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        from npuops.plan.text import render_plan_text

        click.echo(render_plan_text(result))
