from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from npuops.cli.fleet_flags import ARTIFACTS, FORKS, GROUP, INVENTORY, fleet_flags
from npuops.cli.main import load_context_settings, refresh_monitoring_after
from npuops.cli.plan_options import plan_override_flags
from npuops.errors import EnvironmentMissingError, ExitCode, UsageError

if TYPE_CHECKING:  # generic from click 8.2 on; pyproject allows 8.1
    _ParamType = click.ParamType[Any]
else:
    _ParamType = click.ParamType


class _NotEmpty(_ParamType):
    """A text or path option that refuses an empty value: `--model ''` would roll out "no change", `--venv ''` the
    working directory's bin/vllm."""

    def __init__(self, inner: _ParamType) -> None:
        self.inner = inner
        self.name = inner.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is empty; give a value, or leave the option out to keep what the revision has",
                      param, ctx)
        return self.inner.convert(value, param, ctx)


def _refuse_empty_values(command: click.Command) -> click.Command:
    """Every option of `command` that takes text or a path refuses an empty one (the plan flags are made
    elsewhere, from the core's declarations: this covers them too)."""
    for param in command.params:
        if isinstance(param, click.Option) and isinstance(param.type, (click.types.StringParamType, click.Path)):
            param.type = _NotEmpty(param.type)
    return command


@_refuse_empty_values
@click.command()
@click.argument("name")
@plan_override_flags
@click.option("--tuned", "tuned_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Roll out the configuration `npuops tune` wrote (flags given here override it).")
@click.option("--vllm", "vllm_bin", help="The vllm executable the new revision runs.")
@click.option("--venv", type=click.Path(file_okay=False, path_type=Path),
              help="The serving venv the new revision runs (its bin/vllm): a new vllm-ascend row.")
@click.option("--verify-golden", "golden", type=click.Path(dir_okay=False, path_type=Path),
              help="Compare each switched replica's answers with this golden file (`npuops golden record`) "
                   "before it rejoins the router; a mismatch returns it to the previous revision.")
@click.option("--max-unavailable", type=click.IntRange(1), default=1, show_default=True,
              help="Replicas switched at once (the others keep serving).")
@click.option("--allow-downtime", is_flag=True,
              help="Roll out even where nothing serves meanwhile (a single engine, or every replica at once).")
@click.option("--surge", is_flag=True,
              help="First start one temporary replica of the new revision on chips (or cores) the node has "
                   "free, behind the router, and remove it after the switches: serving capacity never drops "
                   "(also for one replica behind a router).")
@click.option("--undo", is_flag=True, help="Return to the revision before the current one, the same way.")
@click.option("--history", is_flag=True, help="Show the instance's revisions and change nothing.")
@fleet_flags(INVENTORY, GROUP, FORKS, ARTIFACTS)
@click.option("--stack", "stack_row", metavar="ROW",
              help="With -i/--group: a new stack row, host by host: drain, provision the row with the roles "
                   "(python, verify; cann and environment when --packages holds a toolkit), doctor, relaunch, "
                   "rejoin. ROW: a vllm-ascend version of the release matrix, or `inventory` (each host's "
                   "npuops_stack_pins).")
@click.option("--packages", "packages_dir", type=click.Path(file_okay=False, path_type=Path),
              help="With --stack: vendor packages and wheels with a SHA256SUMS manifest (as `provision`).")
@click.option("--no-hardware-check", is_flag=True,
              help="With --stack: waive the preflight check for NPUs on the PCI bus (as `provision`).")
@click.option("--weights-shared", is_flag=True,
              help="With -i/--group: the model directory is already on every host (a shared path): check it "
                   "against this controller's sha256 manifest, copy nothing.")
# What a group rollout's playbook runs on each host (npuops/launch/group_rollout.py), not for operators.
@click.option("--from-files", type=click.Path(file_okay=False, path_type=Path), hidden=True)
@click.option("--revision", "revision_number", type=click.IntRange(1), hidden=True)
@click.option("--leave-router", "leave_urls", multiple=True, hidden=True)
@click.option("--join-router", "join_urls", multiple=True, hidden=True)
@click.option("--no-put-back", "no_put_back", is_flag=True, hidden=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (progress stays on stderr).")
@click.pass_context
def rollout(ctx: click.Context, /, name: str, tuned_file: Path | None, vllm_bin: str | None, venv: Path | None,
            golden: Path | None, max_unavailable: int, allow_downtime: bool, surge: bool, undo: bool, history: bool,
            inventory: Path | None, group: str | None, forks: int, artifacts: Path | None, stack_row: str | None,
            packages_dir: Path | None, no_hardware_check: bool, weights_shared: bool,
            from_files: Path | None, revision_number: int | None, leave_urls: tuple[str, ...],
            join_urls: tuple[str, ...], no_put_back: bool, as_json: bool, **flags: Any) -> None:
    """Switch instance NAME to a new revision (another model directory, tuned file, plan flag or vllm) a replica
    at a time, without dropping a request.

    Each replica leaves the router, drains (vLLM's --shutdown-timeout), restarts with the new revision, answers a
    first request (and --verify-golden), and rejoins; a replica that fails gets its previous revision back and the
    rollout stops with the reason. --undo returns to the revision before; --history lists them.
    """
    from click.core import ParameterSource

    from npuops.instance.record import load_record, validate_instance_name

    validate_instance_name(name)
    given = {k: v for k, v in flags.items() if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    if history and (given or tuned_file or vllm_bin or venv or golden or undo or surge):
        raise UsageError("--history changes nothing", "drop the other options, or --history")
    if undo and (given or tuned_file or vllm_bin or venv):
        raise UsageError("--undo returns to the revision before, as it was", "drop the plan flags, or --undo")
    if vllm_bin and venv:
        raise UsageError("--vllm and --venv name the same thing", "give one of them")
    if revision_number is not None and from_files is None:
        raise UsageError("--revision numbers the files staged by a group rollout", "give it with --from-files DIR")
    if (inventory is None) != (group is None):
        raise UsageError("-i/--inventory and --group go together", "give both to roll out over a serving group")
    if weights_shared and inventory is None:
        raise UsageError("--weights-shared is for a group rollout", "add -i INVENTORY --group GROUP")
    _check_stack_flags(stack_row, bool(packages_dir or no_hardware_check), inventory is not None,
                       bool(given or tuned_file or vllm_bin or venv or weights_shared))
    settings = load_context_settings(ctx)
    if inventory is not None and group is not None:
        if undo or history or from_files or leave_urls or join_urls:
            raise UsageError("a group rollout switches to a new revision", "drop --undo and --history with -i")
        if surge:
            raise UsageError("--surge starts a temporary replica on one node; a group switches host by host",
                             "drop --surge (--max-unavailable sets how many hosts switch at once)")
        if stack_row:
            _rollout_stack(settings, name, inventory, group, forks, artifacts, stack_row, packages_dir,
                           not no_hardware_check, golden, max_unavailable, as_json)
            return
        _rollout_group(ctx, settings, name, inventory, group, forks, artifacts, given, tuned_file,
                       str(venv / "bin" / "vllm") if venv else vllm_bin, golden, max_unavailable, weights_shared,
                       as_json)
        return
    load_record(settings.state_dir, name)  # no such instance: named, with the known ones
    if history:
        _print_history(settings, name, as_json)
        return
    if leave_urls or join_urls:
        from npuops.launch.rollout import change_router_workers

        changed = [*change_router_workers(settings, name, leave_urls, "leave"),
                   *change_router_workers(settings, name, join_urls, "join")]
        click.echo(json.dumps({"ok": all(c["done"] for c in changed), "changes": changed}, indent=2))
        return
    from npuops.bench.tuned import read_tuned
    from npuops.instance.manager import service_manager
    from npuops.launch.local import Reporter
    from npuops.launch.rollout import RolloutRequest, render_rollout_text, rollout_instance

    manager = service_manager(settings)
    reason = manager.unavailable_reason()
    if reason:
        raise EnvironmentMissingError(reason, "roll out on the node whose systemd runs the instance")
    ask = RolloutRequest(name=name, flags=given, tuned=read_tuned(tuned_file) if tuned_file else None,
                         vllm=str(venv / "bin" / "vllm") if venv else vllm_bin, golden=golden,
                         max_unavailable=max_unavailable, allow_downtime=allow_downtime, surge=surge,
                         undo=undo, from_files=from_files, revision=revision_number, put_back=not no_put_back)
    result = rollout_instance(settings, manager, ask, Reporter(as_json))
    refresh_monitoring_after(settings)
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else render_rollout_text(result))
    if not result.ok:
        raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))


def _check_stack_flags(stack_row: str | None, stack_options: bool, grouped: bool, other_changes: bool) -> None:
    if (stack_row or stack_options) and not grouped:
        raise UsageError("--stack (and its --packages, --no-hardware-check) is for a group rollout",
                         "add -i INVENTORY --group GROUP; on one node: `npuops provision` then `npuops rollout "
                         "NAME --venv DIR`")
    if stack_options and not stack_row:
        raise UsageError("--packages and --no-hardware-check go with --stack ROW", "add --stack ROW")
    if stack_row and other_changes:
        raise UsageError(f"--stack {stack_row} changes the stack alone",
                         "roll the stack out first, then the model or configuration (one change per revision)")


def _print_history(settings: Any, name: str, as_json: bool) -> None:
    """Every revision that reads, whether its files are kept for --undo, and each entry or file that does not read
    (a rollout refuses those; the history shows them to be moved away)."""
    import time

    from npuops.instance.revisions import read_history_listing
    from npuops.launch.revision_store import revision_files
    from npuops.textout import wrapped

    listing = read_history_listing(settings.state_dir, name)
    files = {r.number: revision_files(settings.state_dir, name, r.number) for r in listing.revisions}
    if as_json:
        click.echo(json.dumps({"name": name, "revisions": [
            {**r.to_json(), "files": files[r.number][0], "files_problem": files[r.number][1]}
            for r in listing.revisions], "unreadable": [u.to_json() for u in listing.unreadable]}, indent=2))
        return
    if not listing.revisions and not listing.unreadable:
        click.echo(f"{name} has no revisions (launched by an npuops that kept none)")
    for r in listing.revisions:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.at))
        click.echo(f"revision {r.number}  {when}  {r.command}: {r.outcome}  ({r.served_model_name})")
        for change in r.changes:
            click.echo(wrapped(change, "    "))
        if r.reason:
            click.echo(wrapped(r.reason, "    why: "))
        state, problem = files[r.number]
        if problem:
            click.echo(wrapped(f"{problem}; neither --undo nor a rollout can use them", f"    files {state}: "))
    for entry in listing.unreadable:
        click.echo(wrapped(entry.problem, f"entry {entry.position} of {listing.path}: unreadable: "))
    if listing.unreadable:
        click.echo(wrapped(f"a rollout of {name} refuses this history; move {listing.path} away and launch {name} "
                           "again to start a new one", "fix: "))


def _rollout_group(ctx: click.Context, settings: Any, name: str, inventory: Path, group: str, forks: int,
                   artifacts: Path | None, given: dict[str, Any], tuned_file: Path | None, vllm: str | None,
                   golden: Path | None, max_unavailable: int, weights_shared: bool, as_json: bool) -> None:
    from npuops.bench.tuned import read_tuned
    from npuops.cli.fleet_flags import artifacts_dir, playbook_progress
    from npuops.launch.group import GroupChoices
    from npuops.launch.group_rollout import GroupRolloutAsk, render_group_rollout_text, rollout_group

    where = GroupChoices(inventory=inventory, group=group, artifacts_dir=artifacts_dir(settings, artifacts),
                         forks=forks)
    from npuops.launch.rollout import RolloutRequest

    rollout = RolloutRequest(name=name, flags=given, tuned=read_tuned(tuned_file) if tuned_file else None, vllm=vllm,
                             golden=golden, max_unavailable=max_unavailable)
    ask = GroupRolloutAsk(rollout=rollout, where=where, weights_shared=weights_shared)
    result = rollout_group(settings, ask, on_event=playbook_progress(tasks=True))
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else render_group_rollout_text(result))
    if not result.ok:
        raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))


def _rollout_stack(settings: Any, name: str, inventory: Path, group: str, forks: int, artifacts: Path | None,
                   row: str, packages_dir: Path | None, hardware_check: bool, golden: Path | None,
                   max_unavailable: int, as_json: bool) -> None:
    from npuops.cli.fleet_flags import artifacts_dir, playbook_progress
    from npuops.launch.group import GroupChoices
    from npuops.launch.group_rollout import GroupRolloutAsk, render_group_rollout_text
    from npuops.launch.rollout import RolloutRequest
    from npuops.upgrade.stack import StackChoice, rollout_group_stack

    where = GroupChoices(inventory=inventory, group=group, artifacts_dir=artifacts_dir(settings, artifacts),
                         forks=forks)
    ask = GroupRolloutAsk(rollout=RolloutRequest(name=name, golden=golden, max_unavailable=max_unavailable),
                          where=where)
    stack = StackChoice(row, packages_dir, hardware_check)
    result = rollout_group_stack(settings, ask, stack, on_event=playbook_progress(tasks=True))
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else render_group_rollout_text(result))
    if not result.ok:
        raise click.exceptions.Exit(int(ExitCode.CHECKS_FAILED))
