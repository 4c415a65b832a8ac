from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import click

from npuops.cli.main import load_context_settings
from npuops.errors import ExitCode, UsageError


@click.command()
@click.argument("name")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the instance's files are [default: /etc/npuops].")
@click.option("--preflight", is_flag=True, help="Only run the start gate (the unit's ExecStartPre) and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --preflight: the gate's checks as JSON.")
@click.pass_context
def run(ctx: click.Context, /, name: str, state_dir: Path | None, preflight: bool, as_json: bool) -> None:
    """Supervise instance NAME's engine: the ExecStart (and, with --preflight, ExecStartPre) of its unit.

    Starts `vllm serve` with the instance's config, tells systemd READY only once /health answers and pings the
    watchdog only while it keeps answering, forwards SIGTERM/SIGINT, and diagnoses the log when the engine dies.
    """
    from npuops.instance.record import load_record

    if as_json and not preflight:
        raise UsageError("--json is for --preflight", "read the supervisor's state with `npuops status NAME --json`")
    settings = load_context_settings(ctx, state_dir=state_dir)
    record = load_record(settings.state_dir, name)
    if preflight:
        from npuops.instance.record import write_status
        from npuops.service.gate import refusal_status, render_gate_text, run_gate

        gate = run_gate(record, settings)
        click.echo(json.dumps(gate.to_json(), indent=2) if as_json else render_gate_text(gate, record.name),
                   err=not as_json)
        if not gate.ok:
            # So `npuops status` and `npuops launch` can name the check and its fix.
            with contextlib.suppress(OSError):
                write_status(record, refusal_status(gate, record.name))
            raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))
        return

    from npuops.envfile import read_env_file
    from npuops.service.gate import chip_watch
    from npuops.service.supervisor import Supervisor, SupervisorOptions

    overlay: dict[str, str] = {}
    # Under systemd the unit's EnvironmentFile= already set the environment (and the 0600 file is not ours to
    # read); run by hand, the supervisor reads it itself.
    if "INVOCATION_ID" not in os.environ and os.access(record.env_file, os.R_OK):
        overlay = read_env_file(record.env_file, f"re-create it with `npuops launch` ({record.name})")
    options = SupervisorOptions(env_overlay=overlay, chip_probe=chip_watch(record, settings))
    supervisor = Supervisor(record, dict(os.environ), options)
    supervisor.install_signal_handlers()
    outcome = supervisor.run()
    sys.stdout.flush()
    raise click.exceptions.Exit(outcome.exit_code)
