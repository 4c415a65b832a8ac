from __future__ import annotations

import json
from pathlib import Path

import click

from npuops.cli.main import load_context_settings


@click.group()
def golden() -> None:
    """Golden answers of a served model, to check later runs against (`npuops doctor --precision --golden`)."""


@golden.command()
@click.option("--endpoint", required=True, help="The vLLM endpoint, e.g. http://127.0.0.1:8000.")
@click.option("--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The golden file to write (atomically).")
@click.option("--served-model", help="The model name at the endpoint [default: the first of /v1/models].")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), required=True,
              help="The dtype the endpoint serves in (recorded; it picks the bounds of later comparisons).")
@click.option("--max-tokens", type=click.IntRange(1, 4096), help="Tokens per prompt [default: from the data file].")
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A 0600 file with the endpoint's API key.")
@click.option("--json", "as_json", is_flag=True, help="Print a summary as JSON.")
@click.pass_context
def record(ctx: click.Context, /, endpoint: str, output: Path, served_model: str | None, dtype: str,
           max_tokens: int | None, api_key_file: Path | None, as_json: bool) -> None:
    """Record the endpoint's greedy answers (token ids and logprobs) to the fixed prompts into a golden file.

    Record only from a run you trust: later runs of the same model, dtype and engine are compared with it.
    """
    from npuops.inputfiles import read_api_key_file
    from npuops.precision.served import load_served_config, query_endpoint, served_model_name, write_golden

    load_context_settings(ctx)
    api_key = read_api_key_file(api_key_file) if api_key_file else None
    config = load_served_config()
    model = served_model or served_model_name(endpoint, api_key)
    tokens = max_tokens or config.max_tokens
    answers = query_endpoint(endpoint, model, config.prompts, tokens, api_key=api_key, dtype=dtype)
    write_golden(output, answers)
    summary = {"ok": True, "output": str(output), "model": model, "dtype": dtype, "prompts": len(answers.generations),
               "max_tokens": tokens}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"recorded {len(answers.generations)} prompts x {tokens} tokens of {model} ({dtype}) into {output}")
