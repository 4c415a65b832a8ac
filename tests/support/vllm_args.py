"""vLLM's own parser, run in the engine venv on the configs npuops renders: the prelude of the parse scripts the
argument tests send to `python -c` (each adds the loop that reports what it needs)."""

from __future__ import annotations

# Defines engine_args(model, config) -> (args, AsyncEngineArgs): `vllm serve MODEL --config FILE` as vLLM parses it.
PARSE_PRELUDE = r"""
import argparse, json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser


def engine_args(model, config):
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    args = parser.parse_args(["serve", model, "--config", config])
    # What `vllm serve` itself does with the positional (vllm/entrypoints/cli/serve.py, cmd()).
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    return args, AsyncEngineArgs.from_cli_args(args)
"""
