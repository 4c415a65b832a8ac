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
    request = request_from_flags(flags)
    if request.pd is not None:
        _plan_pd(settings, request, as_json)
        return
    if request.kv_port is not None:
        from npuops.errors import UsageError

        raise UsageError("--kv-port is for a disaggregated plan", "add --pd P:D, or drop --kv-port")
    result = plan_request(settings, request)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        from npuops.plan.text import render_plan_text

        click.echo(render_plan_text(result))


def _plan_pd(settings: Any, request: Any, as_json: bool) -> None:
    from npuops.plan.request import plan_pd_request
    from npuops.plan.text import render_pd_text, render_plan_text

    pd, colocated, why = plan_pd_request(settings, request)
    if as_json:
        click.echo(json.dumps({"disaggregated": pd.to_json() if pd else None, "why": why,
                               "colocated": colocated.to_json()}, indent=2))
    elif pd is None:
        click.echo(f"{why}\n\n{render_plan_text(colocated)}")
    else:
        click.echo(render_pd_text(pd, why))
