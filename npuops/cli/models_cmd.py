"""`npuops models`: the model catalog `plan` and `launch` accept by name."""

from __future__ import annotations

import json
import re

import click


def _params(total: int, active: int | None) -> str:
    """8.2B; a mixture of experts as total/active: 671.0B/37.6B."""
    return f"{total / 1e9:.1f}B" + (f"/{active / 1e9:.1f}B" if active is not None else "")


def _architecture(name: str) -> str:
    """The config's architecture without the head's suffix: Qwen3MoeForCausalLM -> Qwen3Moe."""
    return re.sub(r"(For\w+|Model)\Z", "", name) or name


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON (aliases and dtypes too).")
def models(as_json: bool) -> None:
    """The models `plan` and `launch` know by name, Hugging Face id or alias (case-insensitive): parameters
    (total/active for a mixture of experts), architecture, and the weights' size at the checkpoint's dtype.
    A local model directory needs no catalog entry."""
    from npuops.plan.catalog import catalog_summary
    from npuops.textout import human_bytes, table

    rows = catalog_summary()
    if as_json:
        click.echo(json.dumps({"ok": True, "models": rows}, indent=2))
        return
    click.echo(table(["NAME", "PARAMETERS", "ARCHITECTURE", "WEIGHTS", "HUGGING FACE ID"], [
        (r["name"], _params(r["parameters"], r["active_parameters"]),  # type: ignore[arg-type]
         _architecture(str(r["architecture"])), human_bytes(r["weight_bytes"]), r["hf_id"])  # type: ignore[arg-type]
        for r in rows], indent=""))
    click.echo("\nAliases: `npuops models --json`. Any local Hugging Face model directory works too.")
