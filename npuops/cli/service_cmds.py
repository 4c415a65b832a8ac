"""`npuops status`, `stop`, `remove`, `logs` and `list`: the instances launch put on this node."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from npuops.cli.fleet_flags import ARTIFACTS, FORKS, GROUP, INVENTORY, artifacts_dir, fleet_flags, playbook_progress
from npuops.cli.main import load_context_settings, refresh_monitoring_after
from npuops.errors import ExitCode, UsageError


def _manager(settings: Any) -> Any:
    from npuops.instance.manager import service_manager

    return service_manager(settings)


group_options = fleet_flags(INVENTORY, GROUP, FORKS, ARTIFACTS)


def _group_call(ctx: click.Context, name: str | None, inventory: Path | None, group: str | None,
                artifacts: Path | None, as_json: bool) -> tuple[Any, Path, Any] | None:
    """None for the local command; else (settings, artifacts dir, progress callback) for the group's."""
    if inventory is None and group is None:
        return None
    if inventory is None or group is None:
        raise UsageError("-i/--inventory and --group go together", "give both, or neither for this host")
    if not name:
        raise UsageError("a group needs the instance NAME", "add the NAME it was launched with")
    from npuops.fleet.progress import PROBLEMS

    settings = load_context_settings(ctx)
    return settings, artifacts_dir(settings, artifacts), playbook_progress(tasks=False, results=PROBLEMS,
                                                                            quiet=as_json)


@click.command()
@click.argument("name", required=False)
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=0,
              help="Wait up to this many seconds until the instance is healthy (or has failed).")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@group_options
@click.pass_context
def status(ctx: click.Context, /, name: str | None, wait_s: float, as_json: bool, inventory: Path | None,
           group: str | None, forks: int, artifacts: Path | None) -> None:
    """State, health, uptime and live engine figures of instance NAME (of every instance without NAME).

    With -i INVENTORY --group GROUP: every host's part of a multi-node instance, the endpoint and the Ray nodes.
    Exit 0 when every instance shown is healthy, 1 otherwise.
    """
    from npuops.instance.status import render_status_text, wait_for_statuses

    grouped = _group_call(ctx, name, inventory, group, artifacts, as_json)
    if grouped is not None:
        from npuops.fleet.group_ops import render_group_status_text, status_group

        assert inventory is not None and group is not None and name is not None
        view = status_group(inventory, group, name, artifacts_dir=grouped[1], forks=forks, on_event=grouped[2])
        click.echo(json.dumps(view.to_json(), indent=2) if as_json else render_group_status_text(name, group, view))
        if not view.ok:
            raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))
        return
    settings = load_context_settings(ctx)
    statuses = wait_for_statuses(settings.state_dir, name, _manager(settings), wait_s)
    if as_json:
        click.echo(json.dumps({"ok": all(s.healthy for s in statuses), "instances": [s.to_json() for s in statuses]},
                              indent=2))
    elif not statuses:
        click.echo(f"no instances in {settings.state_dir}; start one with `npuops launch MODEL`")
    else:
        click.echo("\n\n".join(render_status_text(s) for s in statuses))
    if not statuses or not all(s.healthy for s in statuses):
        raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the instances as JSON.")
@click.pass_context
def list_(ctx: click.Context, /, as_json: bool) -> None:
    """The instances launched on this node, one line each (an unreadable record too: exit 1 then)."""
    from npuops.instance.record import UNREADABLE, scan_records
    from npuops.instance.status import instance_status, lingering_fix
    from npuops.safefiles import printable
    from npuops.textout import table

    settings = load_context_settings(ctx)
    manager = _manager(settings)
    records, unreadable = scan_records(settings.state_dir, settings.service_data_root)
    statuses = [(r, instance_status(r, manager, metrics_interval_s=0)) for r in records]
    # A replica behind a router is listed too (with its internal URL): `list` is every unit npuops put here.
    if as_json:
        click.echo(json.dumps({"ok": not unreadable, "instances": [
            {"name": r.name, "state": s.state, "url": s.url, "model": r.served_model_name,
             "manager": r.manager, "unit": s.unit, "devices": list(r.devices), "note": lingering_fix(s)}
            for r, s in statuses]
            + [u.to_json() for u in unreadable]}, indent=2))
    elif not statuses and not unreadable:
        click.echo(f"no instances in {settings.state_dir}; start one with `npuops launch MODEL`")
    else:
        # A state may quote the supervisor's status file (a restart's reason), the service user's to write.
        rows = [(r.name, printable(s.state), s.url, r.served_model_name, ",".join(map(str, r.devices)) or "-",
                 r.unit if r.manager == "systemd" else "foreground") for r, s in statuses]
        rows += [(u.name, UNREADABLE, "-", "-", "-", "-") for u in unreadable]
        click.echo(table(["NAME", "STATE", "URL", "MODEL", "DEVICES", "UNIT"], rows, indent=""))
        for r, s in statuses:
            if (note := lingering_fix(s)) is not None:
                click.echo(f"{r.name}: {note}")
        for u in unreadable:
            click.echo(f"{u.name}: {u.problem}; fix: {u.fix}")
    if unreadable:
        raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))


@click.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@group_options
@click.pass_context
def stop(ctx: click.Context, /, name: str, as_json: bool, inventory: Path | None, group: str | None, forks: int,
         artifacts: Path | None) -> None:
    """Stop instance NAME gracefully (the engine finishes and frees its chips). It stays installed and enabled.

    With -i INVENTORY --group GROUP: the first host (the endpoint) first, then every other host's part."""
    from npuops.instance.control import stop_by_name

    grouped = _group_call(ctx, name, inventory, group, artifacts, as_json)
    if grouped is not None:
        from npuops.fleet.group_ops import stop_group

        assert inventory is not None and group is not None
        result = stop_group(inventory, group, name, artifacts_dir=grouped[1], forks=forks, on_event=grouped[2])
        if as_json:
            click.echo(json.dumps(result, indent=2))
        else:
            for host_name, done in result["stopped"].items():
                answer = result["answers"].get(host_name) or {}
                why = "" if done else f": {answer.get('message') or 'still running'}"
                click.echo(f"{host_name}: {'stopped' if done else 'NOT stopped'}{why}")
        if not result["ok"]:
            raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))
        return
    settings = load_context_settings(ctx)
    started = time.monotonic()
    outcome = stop_by_name(settings.state_dir, name, _manager(settings), data_root=settings.service_data_root,
                           lock_as="npuops stop")
    refresh_monitoring_after(settings)
    stopped = outcome.stopped
    seconds = time.monotonic() - started
    if as_json:
        click.echo(json.dumps({"ok": stopped, "name": name, "seconds": round(seconds, 2),
                               "was_running": list(outcome.was_running),
                               **({"orphans": list(outcome.orphans)} if outcome.orphans else {}),
                               **({"unreadable": [u.to_json() for u in outcome.unreadable]}
                                  if outcome.unreadable else {})}))
    else:
        if not outcome.was_running and stopped:
            click.echo(f"{name}: not running (nothing to stop)")
        else:
            click.echo(f"{name}: {'stopped' if stopped else 'still running'} ({seconds:.1f} s)")
        for unit in outcome.orphans:
            click.echo(f"  also {unit}: found in the unit directory, its record unreadable or gone")
        for damaged in outcome.unreadable:
            click.echo(f"  {damaged.name}: record unreadable: {damaged.problem}; fix: {damaged.fix}")
    if not stopped:
        raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))


@click.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Stop the instance first if it is running.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def remove(ctx: click.Context, /, name: str, force: bool, as_json: bool) -> None:
    """Uninstall instance NAME: its units (a router's replicas' too) are disabled and deleted, and its config,
    env file (with the API key) and record with them. Bench results and logs stay where they are. A running
    instance is refused unless --force, which stops it first."""
    from npuops.instance.control import remove_by_name

    settings = load_context_settings(ctx)
    outcome = remove_by_name(settings.state_dir, name, _manager(settings), force=force,
                             data_root=settings.service_data_root, lock_as="npuops remove")
    refresh_monitoring_after(settings)
    if as_json:
        click.echo(json.dumps({"ok": True, "name": name, "units": list(outcome.units),
                               "instances": list(outcome.instances), "kept": list(outcome.kept)}))
        return
    click.echo(f"{name}: removed ({', '.join(outcome.units) or 'no unit'}; "
               f"files of {', '.join(outcome.instances) or 'none'})")
    for directory in outcome.kept:
        click.echo(f"  kept {directory} (bench results, logs)")


@click.command()
@click.argument("name")
@click.option("-n", "--lines", type=click.IntRange(1), default=100, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("--part", metavar="PART", help="Of a model behind a router: `router`, or a replica `r0`, `r1`, ... "
              "(a --pd engine `p0`, `d0`, ...) [default: every part, interleaved].")
@click.option("--json", "as_json", is_flag=True, help="The last lines as one JSON document (no --follow).")
@group_options
@click.pass_context
def logs(ctx: click.Context, /, name: str, lines: int, follow: bool, part: str | None, as_json: bool,
         inventory: Path | None, group: str | None, forks: int, artifacts: Path | None) -> None:
    """The engine's and supervisor's log of instance NAME (the journal; engine.log for foreground runs).

    With -i INVENTORY --group GROUP: the last lines of every host's units (no --follow)."""
    from npuops.instance.control import recent_logs, select_part
    from npuops.instance.record import MANAGER_SYSTEMD, load_record

    if as_json and follow:
        raise UsageError("--json and --follow exclude each other", "use one of them")
    grouped = _group_call(ctx, name, inventory, group, artifacts, as_json)
    if grouped is not None:
        if follow:
            raise UsageError("--follow is for one host", "drop --follow with -i/--group")
        from npuops.fleet.group_ops import logs_group

        assert inventory is not None and group is not None
        result = logs_group(inventory, group, name, lines, artifacts_dir=grouped[1], forks=forks,
                            on_event=grouped[2])
        if as_json:
            click.echo(json.dumps(result, indent=2))
        else:
            for host_name, answer in result["hosts"].items():
                click.echo(f"==> {host_name} <==")
                body = (answer or {}).get("answer") or {}
                for unit, unit_lines in (body.get("units") or {"": body.get("lines") or []}).items():
                    if unit:
                        _echo_log_line(f"-- {unit}")
                    for line in unit_lines:
                        _echo_log_line(str(line))
                if not body:
                    click.echo(f"(no log: {(answer or {}).get('message') or 'unreachable'})")
        if not result["ok"]:
            raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))
        return
    settings = load_context_settings(ctx)
    records = select_part(load_record(settings.state_dir, name, settings.service_data_root), part)
    record = records[0]
    if as_json:
        logs: dict[str, list[str]] = {}
        for each in records:
            logs.update(recent_logs(each, _manager(settings), lines))
        if record.manager == MANAGER_SYSTEMD:
            click.echo(json.dumps({"name": name, "lines": logs.get(record.unit, []), "units": logs}))
        else:
            click.echo(json.dumps({"name": name, "lines": logs[str(record.engine_log)]}))
        return
    if record.manager == MANAGER_SYSTEMD:
        code = _manager(settings).stream_log(record.unit, lines, follow, *(r.unit for r in records[1:]),
                                             on_line=_echo_log_line)
        if code:
            raise click.exceptions.Exit(code)
        return
    _tail(record.engine_log, lines, follow)


def _echo_log_line(line: str) -> None:
    """A line of an engine's log as it wrote it, but for its control and other unprintable characters except tab:
    those show escaped (`\\x1b`, `\\r`), since an escape sequence in a log would retitle or clear the terminal, or
    forge a line. A backslash stays as it is: the log reads as the engine wrote it."""
    click.echo("".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in line))


def _tail(path: Path, lines: int, follow: bool) -> None:
    try:
        # Lines end at \n only, as in the journal: a \r inside one is shown (escaped), not taken for an end.
        handle = open(path, encoding="utf-8", errors="replace", newline="\n")  # noqa: SIM115 - followed below
    except FileNotFoundError:
        raise UsageError(f"no log at {path} yet", "the instance has not run in the foreground here") from None
    with handle:
        for line in handle.readlines()[-lines:]:
            _echo_log_line(line.rstrip("\n"))
        while follow:
            line = handle.readline()
            if line:
                _echo_log_line(line.rstrip("\n"))
            else:
                time.sleep(0.5)
