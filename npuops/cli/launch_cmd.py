from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from npuops.cli.main import load_context_settings
from npuops.cli.plan_options import plan_flags, request_from_flags
from npuops.errors import EnvironmentMissingError, ExitCode, UsageError

if TYPE_CHECKING:
    from npuops.hardware.node import Node


@click.command()
@plan_flags
@click.option("--name", default="vllm", show_default=True, help="Instance name (unit npuops-NAME.service).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; 127.0.0.1 unless told.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A 0600 file holding the API key; it goes into the env file, never onto a command line.")
@click.option("--vllm", "vllm_bin", help="The vllm executable the service runs [default: the serving venv's, "
              "VENV/bin/vllm (setting `venv`, /opt/npuops/venv)].")
@click.option("--service-user", default="npuops", show_default=True,
              help="The unprivileged user the unit runs as (member of HwHiAiUser).")
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
@click.option("-i", "--inventory", type=click.Path(path_type=Path),
              help="Ansible inventory: launch one instance over the hosts of --group (multi-node serving).")
@click.option("--group", help="With -i: the inventory group that serves; its first host is the Ray head or DP leader.")
@click.option("--forks", type=click.IntRange(1, 500), default=10, show_default=True, help="With -i: hosts at once.")
@click.option("--artifacts", type=click.Path(file_okay=False, path_type=Path),
              help="With -i: where to keep the Ansible runs' artifacts.")
@click.option("--cluster-wait", "cluster_wait_s", type=click.IntRange(10), default=300, show_default=True,
              help="With -i: seconds to wait for every Ray node to join.")
@click.option("--ray-node-resources", metavar="JSON",
              help='With -i and Ray: the resources each Ray node advertises [default: {"NPU": <chips>}].')
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE",
              help="An extra variable for the instance's environment (repeatable), e.g. HCCL_CONNECT_TIMEOUT=1200.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def launch(ctx: click.Context, /, name: str, host: str, port: int, api_key_file: Path | None, vllm_bin: str | None,
           service_user: str, start_timeout: int | None, watchdog_s: int, verify: bool, golden: Path | None,
           foreground: bool, dry_run: bool,
           output: Path | None, inventory: Path | None, group: str | None, forks: int, artifacts: Path | None,
           cluster_wait_s: int, ray_node_resources: str | None, env_items: tuple[str, ...], as_json: bool,
           **flags: Any) -> None:
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
    request = request_from_flags(flags)
    if ray_node_resources is not None and inventory is None:
        raise UsageError("--ray-node-resources is for a group launch", "add -i INVENTORY --group GROUP")
    if inventory is not None:
        if foreground or verify:
            raise UsageError("--foreground and --verify are for one node", "drop them with -i/--group")
        assert group is not None
        _launch_group(ctx, settings, name=name, host=host, port=port, api_key_file=api_key_file, vllm_bin=vllm_bin,
                      service_user=service_user, start_timeout=start_timeout, watchdog_s=watchdog_s, dry_run=dry_run,
                      output=output, inventory=inventory, group=group, forks=forks, artifacts=artifacts,
                      cluster_wait_s=cluster_wait_s, as_json=as_json, request=request, extra_env=extra_env,
                      ray_node_resources=ray_node_resources)
        return
    if request.nodes != 1:
        raise UsageError(f"--nodes {request.nodes} launches one instance over several hosts",
                         "launch over an inventory group with -i INVENTORY --group GROUP (the group sets the count); "
                         "`npuops plan --nodes N` shows the plan")
    from npuops.launch.prepare import LaunchChoices

    choices = LaunchChoices(name=name, host=host, port=port, api_key_file=api_key_file, vllm=vllm_bin,
                            service_user=service_user, start_timeout_s=start_timeout, watchdog_s=watchdog_s,
                            extra_env=extra_env, foreground=foreground)
    code = _launch_here(settings, request, choices, dry_run=dry_run, output=output, verify=verify, golden=golden,
                        as_json=as_json)
    if code != ExitCode.OK:
        raise click.exceptions.Exit(int(code))


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
    plan = plan_request(settings, request)
    prepared = prepare_local(settings, plan, choices)
    if dry_run:
        assert output is not None
        _print_dry_run(write_dry_run(prepared.instances, output), prepared.notes, plan, as_json, settings.state_dir)
        return int(ExitCode.OK)
    if choices.foreground:
        if len(prepared.instances) > 1:
            raise UsageError(f"--foreground runs one instance, but the plan has {len(prepared.instances)} replicas",
                             "pick the chips of one replica with --devices, or launch as a service")
        return int(local.launch_foreground(prepared.instances[0], settings, api_key=prepared.api_key,
                                           as_json=as_json, notes=prepared.notes, environ=dict(os.environ),
                                           verify=verify, golden=golden))
    assert manager is not None
    return int(local.launch_service(prepared.instances, settings, manager, api_key=prepared.api_key,
                                    as_json=as_json, notes=prepared.notes, service_user=choices.service_user,
                                    verify=verify, golden=golden))


def _print_dry_run(written: dict[str, list[str]], notes: list[str], plan: Any, as_json: bool, state_dir: Path) -> None:
    if as_json:
        click.echo(json.dumps({"ok": True, "dry_run": True, "instances": written, "notes": notes,
                               "plan": plan.to_json()}, indent=2))
        return
    for instance_name, paths in written.items():
        click.echo(f"{instance_name}:")
        for p in paths:
            click.echo(f"  {p}")
    for note in notes:
        click.echo(f"note: {note}")
    click.echo(f"\nInstall: copy the env, vllm.yaml and instance.json to {state_dir}/<name>/ and the unit to "
               f"/etc/systemd/system/, then `systemctl daemon-reload && systemctl enable --now npuops-<name>` "
               f"(or let `npuops launch` without --dry-run do it).")


def _group_target(settings: Any, flags: dict[str, Any], first_node: Node, nodes: int) -> Any:
    """The plan's hardware for a serving group: the first host's chips (checked identical on every host), or
    --hardware."""
    from npuops.plan.target import cpu_target, parse_hardware_spec, target_from_node

    hardware = str(flags["hardware"]).strip().lower()
    if hardware == "cpu":
        host = first_node.host
        return cpu_target(host.memory_total_bytes or 0, len(host.allowed_cpus) or host.cpu_count,
                          max(1, len(host.numa_nodes)), nodes=nodes)
    if hardware != "auto":
        return parse_hardware_spec(str(flags["hardware"]), nodes=nodes, devices=flags.get("devices"))
    chips = first_node.chips
    if not chips:
        raise EnvironmentMissingError("the group's first host shows no NPU",
                                      "check it with `npuops node -i INVENTORY`, or pass --hardware (cpu for a "
                                      "test cluster of CPU engines)")
    memory_mb = chips[0].device_memory_total_mb
    return target_from_node(chips[0].smi.name, len(chips), memory_mb * 2**20 if memory_mb else None,
                            nodes=nodes, devices=flags.get("devices"))


def _launch_group(ctx: click.Context, settings: Any, *, name: str, host: str, port: int, api_key_file: Path | None,
                  vllm_bin: str | None, service_user: str, start_timeout: int | None, watchdog_s: int,
                  dry_run: bool, output: Path | None, inventory: Path, group: str, forks: int, artifacts: Path | None,
                  cluster_wait_s: int, as_json: bool, request: Any, extra_env: dict[str, str],
                  ray_node_resources: str | None) -> None:
    from npuops.fleet.events import PlaybookEvent
    from npuops.fleet.runner import default_artifacts_dir
    from npuops.instance.record import MANAGER_SYSTEMD
    from npuops.launch.group import (
        GroupLaunch,
        check_same_hardware,
        dump_parts,
        network_peers,
        parse_ray_resources,
        render_group,
        render_group_text,
        resolve_group,
        run_group_launch,
    )
    from npuops.launch.instance_files import LaunchSpec, read_api_key_file

    ray_resources = parse_ray_resources(ray_node_resources)
    if artifacts is None:
        artifacts = default_artifacts_dir(settings.environ, is_root=os.geteuid() == 0)
    from npuops.launch.prepare import vllm_executable
    from npuops.plan.request import plan_request

    if request.nodes != 1:
        raise UsageError("--nodes comes from the group with -i/--group", "drop --nodes")
    flags = {"hardware": request.hardware, "devices": request.devices}
    vllm_bin = vllm_executable(settings, vllm_bin)

    # Progress per host and task on stderr, --json or not: stdout keeps the one document.
    def progress(event: PlaybookEvent) -> None:
        if event.kind == "task_start":
            click.echo(f"... {event.task}", err=True)
        elif event.kind in ("ok", "changed", "failed", "unreachable"):
            said = f": {event.message.splitlines()[0][:200]}" if event.message and event.kind in (
                "failed", "unreachable") else ""
            click.echo(f"  {event.host}: {event.kind}{said}", err=True)

    hosts, nodes = resolve_group(inventory, group, artifacts_dir=artifacts, forks=forks, on_event=progress)
    ordered = {h.name: nodes[h.name] for h in hosts}
    if str(flags["hardware"]).strip().lower() == "auto":
        check_same_hardware(ordered)
    target = _group_target(settings, flags, ordered[hosts[0].name], len(hosts))
    plan_result = plan_request(settings, request, target=target)
    if plan_result.cluster is None:
        raise UsageError(f"the plan for {plan_result.model.served_name} uses one node of the group",
                         "launch it on one host without -i, or ask for --multinode dp/ray")
    api_key = read_api_key_file(api_key_file) if api_key_file else None
    npuops_command = str(hosts[0].vars.get("npuops_command") or settings.venv / "bin" / "npuops")
    spec = LaunchSpec(name=name, host=host, port=port, api_key=api_key, service_user=service_user,
                      vllm_command=(vllm_bin, "serve"), npuops_command=(npuops_command,),
                      state_dir=settings.state_dir, service_data_root=settings.service_data_root,
                      manager=MANAGER_SYSTEMD, start_timeout_s=start_timeout, watchdog_s=watchdog_s,
                      extra_env=extra_env)
    ray_command = (str(Path(vllm_bin).parent / "ray"),)
    import secrets

    # A new token per launch: Ray's token authentication, so only the group's own processes join the cluster.
    parts = render_group(plan_result, spec, hosts, ordered, group=group, ray_command=ray_command,
                         unit_dir=settings.unit_dir, ray_resources=ray_resources, ray_token=secrets.token_hex(32))
    launch_state = GroupLaunch(group=group, name=name, plan=plan_result, parts=parts)
    if host not in ("127.0.0.1", "::1", "localhost") and api_key is None:
        launch_state.notes.append(f"binding {host} without --api-key-file: anyone who reaches this port can use "
                                  "the model")
    if dry_run:
        if output is None:
            raise UsageError("--dry-run needs --output DIR", "add --output DIR")
        written = dump_parts(parts, output)
        if as_json:
            click.echo(json.dumps({**launch_state.to_json(), "dry_run": True, "written": written}, indent=2))
        else:
            click.echo(render_group_text(launch_state))
            click.echo(f"files for each host under {output}/<host>/ (manifest.json gives each file's path there)")
        return
    launch_state.staging = artifacts / f"staging-{name}-{os.getpid()}"
    start_wait = start_timeout or max(r.record.timeout_start_s for r in parts)
    run_group_launch(launch_state, inventory, artifacts_dir=artifacts, forks=forks, service_user=service_user,
                     cluster_wait_s=cluster_wait_s, ready_wait_s=start_wait,
                     peers=network_peers(parts, hosts, ordered), on_event=progress)
    if as_json:
        click.echo(json.dumps(launch_state.to_json(), indent=2))
    else:
        click.echo(render_group_text(launch_state))
    if not launch_state.ok:
        ctx.exit(int(ExitCode.CHECKS_FAILED))
