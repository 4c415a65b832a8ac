from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from npuops.cli.fleet_flags import (
    ARTIFACTS,
    FORKS,
    GROUP,
    HOSTS,
    INVENTORY,
    LIMIT,
    artifacts_dir,
    fleet_flags,
    local_npuops,
    playbook_progress,
)
from npuops.cli.main import load_context_settings
from npuops.cli.plan_options import declared_type
from npuops.errors import ExitCode
from npuops.plan.server_options import ServerOptions

if TYPE_CHECKING:
    from npuops.doctor.context import CheckContext
    from npuops.doctor.model import Check


def _ids(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


@click.command()
@click.option("--level", type=click.IntRange(1, 3), default=2, show_default=True,
              help="1: seconds, safe anywhere; 2: standard; 3: heavy (precision, stress).")
@click.option("--only", help="Run only these check ids (comma-separated), whatever their level.")
@click.option("--skip", help="Skip these check ids (comma-separated).")
@click.option("--tag", "tags", help="Run the checks with these tags (comma-separated; `--list` shows them), whatever "
              "their level, e.g. gate-npu.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--prometheus", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a node_exporter textfile here (atomically).")
@click.option("--explain", "explain_id", metavar="ID", help="Print what a check checks, why, and how to fix it.")
@click.option("--list", "list_checks", is_flag=True, help="List the checks and exit.")
@click.option("--expect-chips", type=click.IntRange(1, 1024), help="Fail unless the node shows this many chips.")
@click.option("--env-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Check this service environment file (systemd EnvironmentFile) instead of the current one.")
@click.option("--model-dir", type=click.Path(path_type=Path), help="Check free disk and memory for this model.")
@click.option("--devices", help="Chips a launch will use, e.g. 0-3 (default: all).")
@click.option("--gpu-memory-utilization", type=declared_type(ServerOptions, "gpu_memory_utilization"), default=None,
              help="Fraction of device memory the launch reserves [default: 0.9].")
@click.option("--eager", is_flag=True, help="The service runs without graph mode (--enforce-eager).")
@click.option("--npu-smi", "npu_smi", default=None, help="The npu-smi command to run [default: npu-smi].")
@click.option("--precision", is_flag=True, help="Run the precision checks (kernels; the served model with --endpoint).")
@click.option("--endpoint", help="A vLLM endpoint to check the served model of, e.g. http://127.0.0.1:8000.")
@click.option("--served-model", help="The model name at --endpoint [default: the first of /v1/models].")
@click.option("--golden", type=click.Path(dir_okay=False, path_type=Path),
              help="Reference answers recorded with `npuops golden record`.")
@click.option("--reference-model", type=click.Path(file_okay=False, path_type=Path),
              help="The model directory to compute a transformers reference from (small models).")
@click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A 0600 file with the endpoint's API key.")
@click.option("--dtype", "served_dtype", type=click.Choice(["float32", "float16", "bfloat16"]),
              help="The dtype the endpoint serves in (picks the bounds) [default: the golden's or the model's].")
@click.option("--peers", "peers_json", metavar="JSON",
              help="The other hosts of a multi-node serving group, for the network checks between hosts: "
                   '\'[{"name": "node-b", "address": "10.0.0.12", "port": 22, "npu_ips": {"0": "29.1.1.12"}}]\' '
                   'or {"ifname": "eth0", "peers": [...]}.')
# The fleet doctor (-i/--host): the same checks on every host through Ansible, one table.
# With --group, only the group's hosts, and each host's network checks get the others as --peers.
@fleet_flags(INVENTORY, HOSTS, LIMIT, GROUP, FORKS, ARTIFACTS)
@click.pass_context
def doctor(ctx: click.Context, level: int, only: str | None, skip: str | None, tags: str | None, as_json: bool,
           prometheus: Path | None, explain_id: str | None, list_checks: bool, expect_chips: int | None,
           env_file: Path | None, model_dir: Path | None, devices: str | None,
           gpu_memory_utilization: float | None, eager: bool, npu_smi: str | None, precision: bool,
           endpoint: str | None, served_model: str | None, golden: Path | None, reference_model: Path | None,
           api_key_file: Path | None, served_dtype: str | None, peers_json: str | None,
           inventory: Path | None, hosts: tuple[str, ...],
           limit: str | None, group: str | None, forks: int, artifacts: Path | None) -> None:
    """Health checks of this node, each with a verdict and the fix.

    --precision runs the level-3 precision checks: the kernels on this node's device in each dtype it supports
    against a float64 reference and, with --endpoint and --golden or --reference-model, the served model.

    --tag selects by purpose: `gate-npu` and `gate` are what an NPU instance's start gate runs (`npuops run
    --preflight NAME`; the instance's own checks, tagged `instance`, skip here and are left out of a plain run).

    With -i INVENTORY (or --host H ...) the doctor runs on every host through Ansible: one table of hosts by check
    area, the versions and chip counts that differ between hosts, clock skew, and each failure with its fix.

    Exit 0 when nothing failed (warnings allowed), 1 when a check failed (with -i: or hosts differ, or a host
    gave no report).
    """
    if inventory is not None or hosts or group or limit:
        _fleet_doctor(ctx, level=level, as_json=as_json, inventory=inventory, hosts=list(hosts),
                      limit=limit, group=group, forks=forks, artifacts=artifacts,
                      single_host_options={"--only": only, "--skip": skip, "--tag": tags,
                                           "--prometheus": prometheus,
                                           "--explain": explain_id, "--list": list_checks,
                                           "--expect-chips": expect_chips, "--env-file": env_file,
                                           "--model-dir": model_dir, "--devices": devices,
                                           "--gpu-memory-utilization": gpu_memory_utilization, "--eager": eager,
                                           "--npu-smi": npu_smi, "--precision": precision, "--endpoint": endpoint,
                                           "--served-model": served_model, "--golden": golden,
                                           "--reference-model": reference_model, "--api-key-file": api_key_file,
                                           "--dtype": served_dtype, "--peers": peers_json})
        return
    from npuops.doctor.context import CheckContext, DoctorOptions, parse_peers
    from npuops.doctor.registry import discover_checks, select_checks
    from npuops.hardware.probe import Probe
    from npuops.ranges import parse_device_list

    if explain_id:
        from npuops.doctor.explain import explain_page

        click.echo(explain_page(explain_id).rstrip("\n"))
        return
    checks = discover_checks()
    if list_checks:
        _list_checks(checks, as_json)
        return

    settings = load_context_settings(ctx, npu_smi=npu_smi)
    api_key = None
    if api_key_file is not None:
        from npuops.inputfiles import read_api_key_file

        api_key = read_api_key_file(api_key_file)
    if precision and not only:
        only = ",".join(c.id for c in checks if c.area == "precision")
    options = DoctorOptions(
        expect_chips=expect_chips,
        env_file=env_file,
        model_dir=model_dir,
        devices=parse_device_list(devices) if devices else None,
        gpu_memory_utilization=gpu_memory_utilization if gpu_memory_utilization is not None else 0.9,
        graph_mode=not eager,
        endpoint=endpoint,
        served_model=served_model,
        golden=golden,
        reference_model=reference_model,
        api_key=api_key,
        served_dtype=served_dtype,
        peers=parse_peers(peers_json) if peers_json is not None else None,
    )
    selected = select_checks(checks, level, _ids(only), _ids(skip), _ids(tags))
    _run_and_print(ctx, selected, CheckContext(Probe(settings), options), as_json=as_json, prometheus=prometheus)


def _list_checks(checks: list[type[Check]], as_json: bool) -> None:
    """`--list`: every check, with its tags and its page (what `--explain ID` prints)."""
    from npuops.doctor.explain import doc_page
    from npuops.doctor.model import TAGS

    if as_json:
        click.echo(json.dumps([{"id": c.id, "title": c.title(), "area": c.area, "level": c.level,
                                "severity": c.severity.value, "requires": list(c.requires), "tags": list(c.tags),
                                "doc": str(doc_page(c.id))} for c in checks], indent=2))
        return
    for c in checks:
        req = f"  [needs {', '.join(c.requires)}]" if c.requires else ""
        tagged = ",".join(c.tags) or "-"
        click.echo(f"{c.id:<28} L{c.level} {c.severity.value:<8} {c.area:<12} {tagged:<14} {c.title()}{req}")
    click.echo("\ntags:")
    for tag, meaning in TAGS.items():
        click.echo(f"  {tag:<10} {meaning}")
    click.echo(f"pages: {doc_page('ID')} (`npuops doctor --explain ID`)")


def _run_and_print(ctx: click.Context, selected: list[type[Check]], check_ctx: CheckContext, *, as_json: bool,
                   prometheus: Path | None) -> None:
    from npuops.doctor.report import render_report_text, write_prometheus
    from npuops.doctor.runner import run_checks

    progress = None
    if not as_json and sys.stderr.isatty():
        def progress(outcome: object) -> None:
            click.echo(".", nl=False, err=True)

    report = run_checks(selected, check_ctx, on_done=progress)
    if progress is not None:
        click.echo("", err=True)
    if prometheus is not None:
        write_prometheus(prometheus, report, check_ctx.node, _unit_health(ctx))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(render_report_text(report))
    ctx.exit(int(ExitCode.OK if report.ok else ExitCode.CHECKS_FAILED))


def _unit_health(ctx: click.Context) -> list[Any]:
    """This node's systemd-run instances' unit states for the textfile (none where systemd does not run)."""
    from npuops.instance.manager import service_manager
    from npuops.instance.record import list_records
    from npuops.instance.unit_health import unit_health

    settings = load_context_settings(ctx)
    manager = service_manager(settings)
    if manager.unavailable_reason():
        return []
    return unit_health(list_records(settings.state_dir), manager)


def _fleet_doctor(ctx: click.Context, *, level: int, as_json: bool, inventory: Path | None, hosts: list[str],
                  limit: str | None, group: str | None, forks: int, artifacts: Path | None,
                  single_host_options: dict[str, object]) -> None:
    """`npuops doctor -i INVENTORY` / `--host H`: the fleet doctor (npuops/fleet/doctor.py)."""
    from npuops.errors import UsageError
    from npuops.fleet.doctor import run_fleet_doctor
    from npuops.fleet.doctor_text import render_fleet_doctor_text

    if inventory is not None and hosts:
        raise UsageError("-i/--inventory and --host do not go together", "use one of them")
    if inventory is None and not hosts:
        raise UsageError("--limit and --group work on an inventory", "pass the inventory with -i INVENTORY")
    given = [name for name, value in single_host_options.items() if value not in (None, False)]
    if given:
        raise UsageError(f"{given[0]} does not go with -i/--host (the fleet doctor runs the default checks)",
                         f"run `npuops doctor {given[0]} ...` on the host itself, or leave {given[0]} out")
    settings = load_context_settings(ctx)
    report = run_fleet_doctor(inventory=inventory if inventory is not None else hosts,
                              artifacts_dir=artifacts_dir(settings, artifacts), limit=limit, level=level, group=group,
                              forks=forks, npuops_command=local_npuops(hosts),
                              on_event=playbook_progress(changed_as_ok=True))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(render_fleet_doctor_text(report))
    ctx.exit(int(ExitCode.OK if report.ok else ExitCode.CHECKS_FAILED))
