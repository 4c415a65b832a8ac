from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from npuops.cli.main import load_context_settings
from npuops.cli.plan_options import make_plan_from_flags, plan_flags
from npuops.errors import NotYetError, UsageError


@click.command()
@plan_flags
@click.option("--name", default="vllm", show_default=True, help="Instance name (unit npuops-NAME.service).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; 127.0.0.1 unless told.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A 0600 file holding the API key; it goes into the env file, never onto a command line.")
@click.option("--vllm", "vllm_bin", default="/opt/npuops/venv/bin/vllm", show_default=True,
              help="The vllm executable the unit runs.")
@click.option("--dry-run", is_flag=True, help="Plan and render the files into --output; install nothing.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), help="Directory for --dry-run files.")
@click.option("--json", "as_json", is_flag=True, help="Print what was rendered as JSON.")
@click.pass_context
def launch(ctx: click.Context, /, name: str, host: str, port: int, api_key_file: Path | None, vllm_bin: str,
           dry_run: bool, output: Path | None, as_json: bool, **flags: Any) -> None:
    """Plan MODEL, render its vLLM config, environment file and hardened systemd unit, and run it.

    With --dry-run --output DIR the files are written to DIR and nothing is installed or started.
    """
    if not dry_run:
        raise NotYetError("`npuops launch` without --dry-run (install and start the service) is not available yet",
                          "use --dry-run --output DIR to render the files; the supervised service lands next")
    if output is None:
        raise UsageError("--dry-run needs --output DIR", "add --output DIR")
    from npuops.hardware.node import read_cann
    from npuops.hardware.probe import Probe
    from npuops.launch.ascend_env import capture_set_env
    from npuops.launch.instance import LaunchSpec, read_api_key_file, render_instances
    from npuops.launch.render import validate_instance_name, write_instance_files

    validate_instance_name(name)
    settings = load_context_settings(ctx)
    plan_result = make_plan_from_flags(settings, flags)
    api_key = read_api_key_file(api_key_file) if api_key_file else None
    ascend_env: dict[str, str] = {}
    notes: list[str] = []
    if plan_result.target.kind == "npu":
        probe = Probe(settings)
        cann = read_cann(probe)
        ascend_env, error = capture_set_env(probe, list(cann.set_env_scripts))
        if error:
            notes.append(f"could not capture the CANN environment: {error}")
        elif not cann.set_env_scripts:
            notes.append("no CANN set_env.sh found on this machine: the env file lacks the CANN environment; "
                         "render on the node itself, or run `npuops provision` there first")
    spec = LaunchSpec(name=name, host=host, port=port, api_key=api_key, vllm_command=(vllm_bin, "serve"),
                      state_dir=settings.state_dir, ascend_env=ascend_env)
    instances = render_instances(plan_result, spec)
    written: dict[str, list[str]] = {}
    for instance in instances:
        directory = output / instance.name if len(instances) > 1 else output
        written[instance.name] = [str(p) for p in write_instance_files(directory, instance)]
    if as_json:
        click.echo(json.dumps({"ok": True, "dry_run": True, "instances": written, "notes": notes,
                               "plan": plan_result.to_json()}, indent=2))
        return
    for instance_name, paths in written.items():
        click.echo(f"{instance_name}:")
        for p in paths:
            click.echo(f"  {p}")
    for note in notes:
        click.echo(f"note: {note}")
    click.echo(f"\nInstall: copy the env and config to {settings.state_dir}/<name>/ and the unit to "
               f"/etc/systemd/system/, then `systemctl daemon-reload && systemctl enable --now npuops-<name>`.")
