from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from npuops.cli.fleet_flags import ARTIFACTS, FORKS, GROUP, INVENTORY, fleet_flags
from npuops.cli.main import load_context_settings
from npuops.cli.plan_options import plan_flags_model_optional, request_from_flags
from npuops.errors import EnvironmentMissingError, ExitCode, UsageError


@click.command()
@plan_flags_model_optional
@click.option("--tuned", "tuned_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Launch the configuration `npuops tune` wrote (flags given here override it; MODEL is optional).")
@click.option("--name", default="vllm", show_default=True, help="Instance name (unit npuops-NAME.service).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; 127.0.0.1 unless told.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A 0600 file holding the API key; it goes into the env file, never onto a command line.")
@click.option("--vllm", "vllm_bin", help="The vllm executable the service runs [default: the serving venv's, "
              "VENV/bin/vllm (setting `venv`, /opt/npuops/venv)].")
@click.option("--service-user", default="npuops", show_default=True,
              help="The unprivileged user the unit runs as (member of HwHiAiUser).")
@click.option("--allow-root", is_flag=True,
              help="Let --service-user be root (refused otherwise); every launch and status then warn.")
@click.option("--start-timeout", type=click.IntRange(10), help="Seconds to wait for /health [default: from the plan].")
@click.option("--watchdog", "watchdog_s", type=click.IntRange(5), default=60, show_default=True,
              help="Restart the engine after this many seconds without an answer from /health.")
@click.option("--verify", is_flag=True,
              help="After the start, check the served model's answers (served-precision) against --golden, or a "
                   "transformers reference from the model directory; a failure stops the instance.")
@click.option("--golden", type=click.Path(dir_okay=False, path_type=Path),
              help="With --verify: the golden file to compare with (`npuops golden record`).")
@click.option("--foreground", is_flag=True,
              help="Run the supervisor in this terminal (no systemd): same gate, health checks and diagnosis.")
@click.option("--dry-run", is_flag=True, help="Plan and render the files into --output; install nothing.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), help="Directory for --dry-run files.")
@fleet_flags(INVENTORY, GROUP, FORKS, ARTIFACTS)
@click.option("--cluster-wait", "cluster_wait_s", type=click.IntRange(10), default=300, show_default=True,
              help="With -i: seconds to wait for every Ray node to join.")
@click.option("--ray-node-resources", metavar="JSON",
              help='With -i and Ray: the resources each Ray node advertises [default: {"NPU": <chips>}].')
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE",
              help="An extra variable for the instance's environment (repeatable), e.g. HCCL_CONNECT_TIMEOUT=1200.")
@click.option("--profiling", is_flag=True,
              help="Configure vLLM's profiler (traces in the instance's state directory) for `npuops profile`.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def launch(ctx: click.Context, /, name: str, host: str, port: int, api_key_file: Path | None, vllm_bin: str | None,
           service_user: str, allow_root: bool, start_timeout: int | None, watchdog_s: int, verify: bool,
           golden: Path | None, foreground: bool, dry_run: bool,
           output: Path | None, inventory: Path | None, group: str | None, forks: int, artifacts: Path | None,
           cluster_wait_s: int, ray_node_resources: str | None, env_items: tuple[str, ...], profiling: bool,
           as_json: bool,
           tuned_file: Path | None, **flags: Any) -> None:
    """Plan MODEL, render its vLLM config, environment file and hardened systemd unit, and run it.

    The unit runs `npuops run NAME`: a start gate (level-1 checks for these chips), then vLLM, reported ready only
    once /health answers and restarted when it hangs or crashes. launch installs and starts it and returns once
    the endpoint answers a first request. --foreground runs the same supervisor in this terminal (where systemd
    is not init). With --dry-run --output DIR the files are written to DIR and nothing is installed or started.
    """
    from npuops.instance.record import validate_instance_name
    from npuops.launch.instance_files import parse_env_assignments

    validate_instance_name(name)
    if dry_run and output is None:
        raise UsageError("--dry-run needs --output DIR", "add --output DIR")
    if output is not None and not dry_run:
        raise UsageError("--output is for --dry-run", "add --dry-run, or drop --output to install the service")
    if dry_run and foreground:
        raise UsageError("--dry-run and --foreground exclude each other", "use one of them")
    if golden is not None and not verify:
        raise UsageError("--golden is for --verify", "add --verify")
    if (inventory is None) != (group is None):
        raise UsageError("-i/--inventory and --group go together", "give both to launch over a serving group")
    settings = load_context_settings(ctx)
    extra_env = parse_env_assignments(env_items)
    request = _request(ctx, flags, tuned_file)
    if ray_node_resources is not None and inventory is None:
        raise UsageError("--ray-node-resources is for a group launch", "add -i INVENTORY --group GROUP")
    from npuops.launch.prepare import LaunchChoices

    choices = LaunchChoices(name=name, host=host, port=port, api_key_file=api_key_file, vllm=vllm_bin,
                            service_user=service_user, start_timeout_s=start_timeout, watchdog_s=watchdog_s,
                            extra_env=extra_env, foreground=foreground, allow_root=allow_root,
                            profiling=profiling)
    if request.pd is not None and (foreground or tuned_file is not None or verify):
        raise UsageError("--pd launches prefill and decode engines as services behind a PD router",
                         "drop --foreground, --tuned and --verify with --pd")
    if request.pd is not None:
        from npuops.plan.disaggregation import parse_pd

        parse_pd(request.pd)  # a malformed shape is bad input, whatever this machine runs
    if request.kv_port is not None and request.pd is None:
        raise UsageError("--kv-port is for a disaggregated launch", "add --pd P:D, or drop --kv-port")
    if inventory is not None:
        if foreground or verify:
            raise UsageError("--foreground and --verify are for one node", "drop them with -i/--group")
        assert group is not None
        _launch_group(ctx, settings, request, choices, dry_run=dry_run, output=output, inventory=inventory,
                      group=group, forks=forks, artifacts=artifacts, cluster_wait_s=cluster_wait_s,
                      ray_node_resources=ray_node_resources, as_json=as_json)
        return
    if request.nodes != 1:
        raise UsageError(f"--nodes {request.nodes} launches one instance over several hosts",
                         "launch over an inventory group with -i INVENTORY --group GROUP (the group sets the count); "
                         "`npuops plan --nodes N` shows the plan")
    code = _launch_here(settings, request, choices, dry_run=dry_run, output=output, verify=verify, golden=golden,
                        as_json=as_json)
    if code != ExitCode.OK:
        raise click.exceptions.Exit(int(code))


def _request(ctx: click.Context, flags: dict[str, Any], tuned_file: Path | None) -> Any:
    """The plan request: the flags, or a tuned file's request with the flags given on this command line over it."""
    if tuned_file is None:
        if not flags.get("model"):
            raise UsageError("launch needs MODEL (a model directory or catalog name)", "add MODEL, or --tuned FILE")
        return request_from_flags(flags)
    from click.core import ParameterSource

    from npuops.bench.tuned import read_tuned

    given = {k: v for k, v in flags.items() if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    return read_tuned(tuned_file).with_flags(given)


def _launch_here(settings: Any, request: Any, choices: Any, *, dry_run: bool, output: Path | None, verify: bool,
                 golden: Path | None, as_json: bool) -> int:
    from npuops.launch import local
    from npuops.launch.prepare import prepare_local, write_dry_run
    from npuops.plan.request import plan_request

    manager = None
    if not dry_run and not choices.foreground:
        from npuops.instance.manager import service_manager

        manager = service_manager(settings)
        reason = manager.unavailable_reason()
        if reason:
            raise EnvironmentMissingError(reason, "run the engine in this terminal under the same supervisor with "
                                          "`npuops launch ... --foreground`, or launch on a node booted with systemd")
    pd = None
    if request.pd is not None:
        from npuops.plan.request import plan_pd_request

        pd, plan, why = plan_pd_request(settings, request)
        prepared = prepare_local(settings, plan, choices, pd)
        prepared.notes.insert(0, why)
    else:
        plan = plan_request(settings, request)
        prepared = prepare_local(settings, plan, choices)
    if dry_run:
        assert output is not None
        from npuops.instance.access import sandbox_notes

        paths = [(what, path) for i in prepared.instances for what, path in (
            ("the vLLM executable" if not i.record.is_router else "the router's python", i.record.vllm_command[0]),
            ("the model", i.record.model_path), ("the draft model", i.record.draft_model_path),
            ("npuops", prepared.spec.npuops_command[0])) if path]
        prepared.notes.extend(sandbox_notes(paths))
        _print_dry_run(write_dry_run(prepared.instances, output), prepared.notes, plan, as_json, settings.state_dir,
                       pd)
        return int(ExitCode.OK)
    if choices.foreground:
        if len(prepared.instances) > 1:
            replicas = len(plan.replicas)
            raise UsageError(f"--foreground runs one engine, but the plan has {replicas} "
                             f"replica{'s' if replicas > 1 else ''} behind a router",
                             "drop --dp and --router-policy" if request.replicas or request.router_policy else
                             "pick the chips of one replica with --devices, or launch as a service")
        return int(local.launch_foreground(prepared.instances[0], settings, api_key=prepared.api_key,
                                           as_json=as_json, notes=prepared.notes, environ=dict(os.environ),
                                           verify=verify, golden=golden))
    assert manager is not None
    from npuops.instance.revisions import LaunchOrigin

    # Kept as the instance's next revision: `npuops rollout` changes it from here, `--undo` comes back to it.
    origin = LaunchOrigin(request.to_json(), choices.to_json(), "launch",
                          (f"launch of {request.model}" + (f" ({request.pd} disaggregated)" if request.pd else ""),))
    return int(local.launch_service(prepared.instances, settings, manager, api_key=prepared.api_key,
                                    as_json=as_json, notes=prepared.notes, service_user=choices.service_user,
                                    supervisor=prepared.spec.npuops_command[0], verify=verify, golden=golden,
                                    origin=origin))


def _print_dry_run(written: dict[str, list[str]], notes: list[str], plan: Any, as_json: bool, state_dir: Path,
                   pd: Any = None) -> None:
    if as_json:
        # With --pd the plan is the disaggregated one; "plan" stays the co-located plan it was compared with.
        click.echo(json.dumps({"ok": True, "dry_run": True, "instances": written, "notes": notes,
                               "plan": plan.to_json(), "disaggregated": pd.to_json() if pd else None}, indent=2))
        return
    for instance_name, paths in written.items():
        click.echo(f"{instance_name}:")
        for p in paths:
            click.echo(f"  {p}")
    from npuops.textout import wrapped

    for note in notes:
        click.echo(wrapped(note, "note: "))
    units = [Path(p).name for paths in written.values() for p in paths if p.endswith(".service")]
    click.echo("\n" + wrapped(
        f"copy each instance's files but its unit to {state_dir}/NAME/ and the unit{'s' if len(units) > 1 else ''} "
        f"to /etc/systemd/system/, then `systemctl daemon-reload && systemctl enable --now {' '.join(units)}` "
        "(or let `npuops launch` without --dry-run do it).", "Install: "))


def _launch_group(ctx: click.Context, settings: Any, request: Any, choices: Any, *, dry_run: bool,
                  output: Path | None, inventory: Path, group: str, forks: int, artifacts: Path | None,
                  cluster_wait_s: int, ray_node_resources: str | None, as_json: bool) -> None:
    from npuops.cli.fleet_flags import artifacts_dir, playbook_progress
    from npuops.launch.group import (
        GroupChoices,
        dump_parts,
        parse_ray_resources,
        prepare_group,
        render_group_text,
        start_group,
    )

    resources = parse_ray_resources(ray_node_resources)
    if request.nodes != 1:
        raise UsageError("--nodes comes from the group with -i/--group", "drop --nodes")
    where = GroupChoices(inventory=inventory, group=group, artifacts_dir=artifacts_dir(settings, artifacts),
                         forks=forks, cluster_wait_s=cluster_wait_s, ray_node_resources=resources)
    # Progress per host and task on stderr, --json or not: stdout keeps the one document.
    progress = playbook_progress(tasks=True)
    launch, hosts, nodes = prepare_group(settings, request, choices, where, on_event=progress)
    if dry_run:
        assert output is not None
        written = dump_parts(launch.parts, output)
        if as_json:
            click.echo(json.dumps({**launch.to_json(), "dry_run": True, "written": written}, indent=2))
        else:
            click.echo(render_group_text(launch))
            click.echo(f"files for each host under {output}/<host>/ (manifest.json gives each file's path there)")
        return
    from npuops.instance.revisions import LaunchOrigin

    origin = LaunchOrigin(request.to_json(), choices.to_json(), "launch", (f"launch of {request.model} over {group}",))
    start_group(launch, hosts, nodes, choices, where, on_event=progress, origin=origin)
    click.echo(json.dumps(launch.to_json(), indent=2) if as_json else render_group_text(launch))
    if not launch.ok:
        ctx.exit(int(ExitCode.CHECKS_FAILED))
