"""`npuops rollout NAME`: change what an instance serves a replica at a time, without dropping a request.

Each replica in turn (or `max_unavailable` at once): held out of the router (its supervisor leaves it before the
drain, and a hold keeps the new engine out until it is verified), stopped with vLLM's drain, given the new
revision's files, started, followed until healthy, asked a first request (and compared with a golden file when
given), then put back into the router. A replica that fails to start or to verify gets its previous files back and
rejoins; the rollout stops there with the reason, the replicas after it untouched. `--undo` puts back the files of
the revision before the current one the same way (npuops.instance.revisions keeps them).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npuops.doctor.model import Status
from npuops.envfile import read_env_file
from npuops.errors import BadInputError, ConfigError, NpuopsError
from npuops.inputfiles import read_input_text
from npuops.instance.control import parts_of
from npuops.instance.lock import instance_lock
from npuops.instance.manager import SystemdManager
from npuops.instance.record import (
    CONFIG_FILE,
    ENV_FILE,
    FILE_MODES,
    MANAGER_SYSTEMD,
    RECORD_FILE,
    ROUTER_CONFIG_FILE,
    InstanceRecord,
    load_record,
    write_record,
)
from npuops.instance.revisions import (
    OUTCOME_ROLLED_BACK,
    OUTCOME_ROLLING_OUT,
    OUTCOME_SERVING,
    OUTCOME_STOPPED,
    LaunchOrigin,
    Revision,
    RolloutProgress,
    clear_progress,
    hold_out_of_router,
    read_history,
    read_parts,
    release_hold,
    request_changes,
    revision_dir,
    stored_parts,
    write_progress,
)
from npuops.instance.router_admin import join_router, worker_change
from npuops.launch.install import check_writable, install
from npuops.launch.instance_files import InstanceFiles, RenderedFile
from npuops.launch.local import Reporter, begin_start, follow_started, verify_served
from npuops.launch.prepare import LaunchChoices
from npuops.launch.revision_store import (
    KeptLaunch,
    finish_revision,
    keep_revision,
    kept_launch,
    next_revision,
    stored_as_files,
    switched_parts,
    with_revision,
)
from npuops.launch.surge import remove_surge, surge_files, surge_name
from npuops.plan.inputs import PlanRequest
from npuops.settings import Settings


@dataclass(frozen=True)
class RolloutRequest:
    """What the operator asked `npuops rollout` for."""

    name: str
    flags: Mapping[str, Any] = field(default_factory=dict)  # plan flags given (click's names; "model": --model)
    tuned: PlanRequest | None = None  # --tuned FILE's request, under the flags
    vllm: str | None = None  # --vllm PATH, or --venv DIR's bin/vllm
    golden: Path | None = None
    max_unavailable: int = 1
    allow_downtime: bool = False
    surge: bool = False  # a temporary extra replica of the new revision serves while the others switch
    undo: bool = False
    # Over a group, each host switches its replicas to the files the controller staged there (`--from-files DIR`,
    # DIR/<part>/<file>) as the group's revision `revision`, nothing planned on the host.
    from_files: Path | None = None
    revision: int | None = None
    # A stack rollout's host: a replica that fails on the new stack stays stopped (its files put back would run
    # on the same changed venv).
    put_back: bool = True


@dataclass
class PartOutcome:
    name: str
    ok: bool
    revision: int  # the revision the part serves now
    seconds: float
    reason: str = ""
    rolled_back: bool = False
    first_request: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "revision": self.revision, "seconds": round(self.seconds, 1),
                "reason": self.reason, "rolled_back": self.rolled_back, "first_request": self.first_request}


@dataclass
class RolloutResult:
    name: str
    command: str
    from_revision: int
    to_revision: int
    changes: tuple[str, ...]
    parts: list[PartOutcome]
    untouched: tuple[str, ...] = ()
    reason: str = ""
    surge: PartOutcome | None = None  # the temporary replica's start (it is removed after the switches)

    @property
    def ok(self) -> bool:
        return not self.reason and all(p.ok for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "name": self.name, "command": self.command, "from_revision": self.from_revision,
                "to_revision": self.to_revision, "changes": list(self.changes),
                "parts": [p.to_json() for p in self.parts], "untouched": list(self.untouched),
                "reason": self.reason, "surge": self.surge.to_json() if self.surge else None}


@dataclass(frozen=True)
class _Target:
    number: int
    origin: LaunchOrigin
    parts: dict[str, InstanceFiles]  # by part name, the new revision's files
    api_key: str | None
    surge: InstanceFiles | None = None


# --- what is installed now ----------------------------------------------------------------------------------------

def installed_files(record: InstanceRecord, manager: SystemdManager) -> InstanceFiles:
    """A part's files as they are installed now: what a failed switch puts back."""
    names = [ROUTER_CONFIG_FILE if record.is_router else CONFIG_FILE, ENV_FILE, RECORD_FILE]
    files = []
    try:
        for name in names:
            files.append(RenderedFile(name, (record.directory / name).read_text(encoding="utf-8"),
                                      FILE_MODES.get(name, 0o644)))
        files.append(RenderedFile(record.unit, manager.unit_path(record.unit).read_text(encoding="utf-8"), 0o644))
    except OSError as exc:
        raise ConfigError(f"cannot read {record.name}'s installed {exc.filename or 'files'} ({exc.strerror})",
                          f"launch {record.behind or record.name} again") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{record.name}'s installed {names[len(files)] if len(files) < len(names) else 'unit'} "
                          "is not UTF-8 text", f"launch {record.behind or record.name} again") from None
    return InstanceFiles(record.name, tuple(files), record.unit, record)


def _api_key(record: InstanceRecord) -> str | None:
    """The key the running instance has (its env file): a rollout keeps it, or the router and the new replicas
    would disagree."""
    return read_env_file(record.env_file, f"launch {record.name} again").get("VLLM_API_KEY")


# --- choosing the target ----------------------------------------------------------------------------------------

def _staged_target(ask: RolloutRequest, number: int, api_key: str | None,
                   running: Sequence[InstanceRecord]) -> _Target:
    assert ask.from_files is not None
    fix = "give the directory the group rollout staged (DIR/<part>/<file>), or roll the group out again"
    staged = read_parts(ask.from_files, fix)
    if not staged or not all(staged.values()):
        raise BadInputError(f"--from-files {ask.from_files} holds no part's files", fix)
    origin = LaunchOrigin({}, {}, "rollout (group)", (f"the group's revision {number}, staged in {ask.from_files}",))
    return _Target(number, origin, stored_as_files(staged, number, ask.from_files, fix, running), api_key)


def _current(history: Sequence[Revision], name: str) -> Revision:
    """The revision serving now: the last one whose rollout did not end rolled back (one stopped half-way serves
    on some replicas, and is what --undo leaves)."""
    serving = [r for r in history if r.outcome != OUTCOME_ROLLED_BACK]
    if not serving:
        raise BadInputError(f"{name} was launched by an npuops that kept no revisions",
                            f"launch {name} again once with this npuops (it then keeps each revision)")
    return serving[-1]


def _undo_target(settings: Settings, ask: RolloutRequest, history: Sequence[Revision], number: int,
                 api_key: str | None, running: Sequence[InstanceRecord]) -> _Target:
    name = ask.name
    current = _current(history, name)
    for earlier in reversed([r for r in history if r.number < current.number and r.outcome != OUTCOME_ROLLED_BACK]):
        directory = revision_dir(settings.state_dir, name, earlier.number)
        stored = stored_parts(settings.state_dir, name, earlier.number)
        kept = kept_launch(settings.state_dir, name, earlier.number)
        if stored and kept is not None:
            launch = kept.to_json()
            origin = LaunchOrigin(launch["request"], launch["choices"], "rollout --undo",
                                  (f"back to revision {earlier.number} ({earlier.command}, "
                                   f"{earlier.served_model_name} from {earlier.model_path})",))
            fix = (f"move {directory} away (`npuops rollout {name} --undo` then returns to the revision before "
                   f"it), or roll out the configuration you want: `npuops rollout {name} --model DIR`")
            parts = stored_as_files(stored, number, directory, fix, running)
            surge = None
            if ask.surge:  # the earlier revision's request planned again, for its one extra replica
                if kept.request is None or kept.choices is None:
                    raise BadInputError(f"revision {earlier.number} of {name} keeps no request to plan a surge "
                                        "replica from", "roll it back without --surge (--allow-downtime)")
                surge = _planned(settings, ask.name, kept.request, kept.choices, api_key, number, surge=True)[1]
            return _Target(number, origin, parts, api_key, surge)
    raise BadInputError(f"{name} has no earlier revision to return to (revision {current.number} is its first, "
                        "or the files of the earlier ones were pruned)",
                        f"roll out the revision you want: `npuops rollout {name} --model DIR`")


def _planned(settings: Settings, name: str, request: PlanRequest, choices: LaunchChoices,
             api_key: str | None, number: int, *, vllm: str | None = None,
             surge: bool = False) -> tuple[list[InstanceFiles], InstanceFiles | None]:
    """The request planned and rendered for this node as the instance's revision `number`: the parts to switch
    (served under the name clients know) and, with `surge`, the temporary extra replica."""
    from npuops.launch.prepare import prepare_local
    from npuops.plan.request import plan_request

    if request.pd is not None or request.nodes != 1:
        raise BadInputError("rollout switches the replicas of one node's instance",
                            f"launch {name} again for a disaggregated or multi-node configuration")
    if vllm:
        choices = replace(choices, vllm=vllm)
    running = load_record(settings.state_dir, name)
    plan = plan_request(settings, request)
    # Clients ask for the model by the name they know: a new model directory serves under it too.
    plan = replace(plan, server=replace(plan.server, served_model_name=running.served_model_name))
    prepared = prepare_local(settings, plan, choices, api_key=api_key)
    _check_same_shape(name, prepared.instances, settings)
    parts = [with_revision(i, number) for i in switched_parts(prepared.instances)]
    extra = None
    if surge:
        # The node's chips, not the plan's: an instance launched on --devices 0-3 may surge onto 4-7.
        from npuops.plan.request import resolve_target

        chips = (resolve_target(settings, replace(request, devices=None)).device_ids if request.devices else
                 plan.target.device_ids)
        extra = surge_files(settings.state_dir, plan, prepared.spec, running, number, chips)
    return parts, extra


def _kept_request(settings: Settings, name: str, number: int) -> tuple[PlanRequest, LaunchChoices]:
    """The request and choices revision `number` was made from, which a rollout plans again."""
    kept: KeptLaunch | None = kept_launch(settings.state_dir, name, number)
    if kept is None:
        raise BadInputError(f"the request of {name}'s revision {number} is not kept",
                            f"launch {name} again with the configuration you want")
    if kept.request is None or kept.choices is None:
        raise BadInputError(f"{name} here is one host's part of a group's instance",
                            "roll the group out from the controller: `npuops rollout NAME -i INVENTORY --group GROUP`")
    return kept.request, kept.choices


def _new_target(settings: Settings, ask: RolloutRequest, history: Sequence[Revision], number: int,
                api_key: str | None) -> _Target:
    current = _current(history, ask.name)
    before, kept_choices = _kept_request(settings, ask.name, current.number)
    request = (ask.tuned or before).with_flags(ask.flags)
    changes = request_changes(before.to_json(), request.to_json())
    parts, surge = _planned(settings, ask.name, request, kept_choices, api_key, number, vllm=ask.vllm,
                            surge=ask.surge)
    if ask.vllm and ask.vllm != kept_choices.vllm:
        changes.append(f"vllm: {kept_choices.vllm or 'the serving venv'} -> {ask.vllm}")
    choices = replace(kept_choices, vllm=ask.vllm) if ask.vllm else kept_choices
    origin = LaunchOrigin(request.to_json(), choices.to_json(), "rollout",
                          tuple(changes) or ("no change: a rolling restart",))
    return _Target(number, origin, {i.name: i for i in parts}, api_key, surge)


def _routing(argv: Sequence[str]) -> list[str]:
    """A router's command line less how long it waits for its replicas' first start (a bigger model waits longer;
    the running router has started already)."""
    out = list(argv)
    if "--worker-startup-timeout-secs" in out:
        at = out.index("--worker-startup-timeout-secs")
        del out[at:at + 2]
    return out


def _check_same_shape(name: str, instances: Sequence[InstanceFiles], settings: Settings) -> None:
    """A rollout changes what each replica serves, not how many there are or where: the router's command line
    (its replicas' URLs, its policy) must be the one installed."""
    current = load_record(settings.state_dir, name)
    now = sorted([current.name, *current.replicas]) if current.is_router else [current.name]
    new = sorted(i.name for i in instances)
    fix = f"launch {name} again for a new shape (it stops every replica at once)"
    if new != now:
        raise BadInputError(f"the new revision of {name} has the parts {', '.join(new)}, the running one "
                            f"{', '.join(now)}", fix)
    for instance in instances:
        if instance.record.is_router:
            installed = _installed_router_argv(current)
            if _routing(json.loads(instance.file(ROUTER_CONFIG_FILE).text)["argv"]) != _routing(installed):
                raise BadInputError(f"the new revision changes {name}'s router (its policy or its replicas)", fix)


def _installed_router_argv(router: InstanceRecord) -> list[str]:
    """The running router's command line from its router.json (one line naming the file where it is not one)."""
    fix = f"launch {router.name} again"
    try:
        data = json.loads(read_input_text(router.config_file, "router configuration", fix=fix))
    except (ValueError, RecursionError):
        raise ConfigError(f"{router.config_file} is not JSON", fix) from None
    argv = data.get("argv") if isinstance(data, dict) else None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ConfigError(f"{router.config_file} has no router command line (argv)", fix)
    return [str(a) for a in argv]


# --- switching one part -------------------------------------------------------------------------------------------

@dataclass
class _Context:
    settings: Settings
    manager: SystemdManager
    report: Reporter
    api_key: str | None
    golden: Path | None
    progress: RolloutProgress
    put_back: bool = True


def _start_and_verify(files: InstanceFiles, ctx: _Context, golden: Path | None) -> tuple[str, dict[str, Any] | None]:
    """Install the part's files, start it, follow it to healthy and ask a first request (and the golden file):
    "" when it serves, else why not."""
    try:
        install([files], ctx.settings.state_dir, ctx.manager)
    except NpuopsError as exc:  # a full disk: the set was not written, the part is reported, not abandoned
        return f"its files could not be installed: {exc.one_line()}", None
    record = files.record
    # A rollout's starts are the operator's, not a crash loop: they do not count toward StartLimitBurst=.
    ctx.manager.reset_failed(record.unit)
    entry = follow_started(record, begin_start(record, ctx.manager, ctx.report), ctx.manager, ctx.report,
                           ctx.api_key, [])
    first = entry.get("first_request")
    if not entry["ok"]:
        diagnosis = entry.get("diagnosis") or {}
        why = {"failed": "it failed to start", "timeout": "it did not become healthy in time"}.get(
            entry.get("reason", ""), "its first request failed")
        cause = diagnosis.get("cause") or (first or {}).get("error") or ""
        return f"{why}{': ' + cause if cause else ''}", first
    if golden is not None:
        checked = verify_served(record, ctx.settings, ctx.api_key, golden)
        if checked.result.status is Status.FAIL:
            return f"its answers differ from {golden}: {checked.result.message}", first
    return "", first


def _leave(record: InstanceRecord, ctx: _Context) -> None:
    if record.behind:
        hold_out_of_router(record, os.getpid())  # the new engine stays out until verified
    ctx.report.progress(f"{record.name}: out of the router and draining (up to {record.stop_timeout_s} s)")
    ctx.manager.stop(record.unit, timeout=record.stop_timeout_s + 30)


def _join(record: InstanceRecord, ctx: _Context) -> None:
    if record.behind:
        change = join_router(record, ctx.api_key)
        if change is not None:
            ctx.report.progress(f"{record.name}: {change.message}")
        release_hold(record)


def _switch(old: InstanceRecord, new: InstanceFiles, ctx: _Context) -> PartOutcome:
    started = time.monotonic()
    before = installed_files(old, ctx.manager)
    _leave(old, ctx)
    why, first = _start_and_verify(new, ctx, ctx.golden)
    if not why:
        _join(new.record, ctx)
        ctx.report.progress(f"{old.name}: serves revision {new.record.revision}")
        return PartOutcome(old.name, True, new.record.revision, time.monotonic() - started, first_request=first)
    ctx.manager.stop(new.record.unit, timeout=new.record.stop_timeout_s + 30)
    if not ctx.put_back:
        ctx.report.progress(f"{old.name}: revision {new.record.revision} failed ({why}); stopped, out of the router")
        return PartOutcome(old.name, False, new.record.revision, time.monotonic() - started,
                           f"{why}; stopped (its stack changed under it: it must not serve)", first_request=first)
    ctx.report.progress(f"{old.name}: revision {new.record.revision} failed ({why}); back to revision "
                        f"{old.revision}")
    again, _ = _start_and_verify(before, ctx, None)
    _join(before.record, ctx)
    if again:
        why += f"; and revision {old.revision} did not come back either: {again}"
    return PartOutcome(old.name, False, old.revision, time.monotonic() - started, why, rolled_back=not again,
                       first_request=first)


def _start_surge(files: InstanceFiles, ctx: _Context) -> PartOutcome:
    """The temporary replica of the new revision: started held out of the router, verified, then in."""
    started = time.monotonic()
    remove_surge(ctx.settings.state_dir, files.record.behind or "", ctx.manager)  # one a killed rollout left
    ctx.progress = replace(ctx.progress, current=(files.name,), step="starting a surge replica")
    write_progress(ctx.settings.state_dir, files.record.behind or files.name, ctx.progress)
    devices = f" on chip(s) {','.join(map(str, files.record.devices))}" if files.record.devices else ""
    ctx.report.progress(f"{files.name}: a surge replica of revision {files.record.revision} on port "
                        f"{files.record.port}{devices}")
    files.record.directory.mkdir(parents=True, exist_ok=True)
    hold_out_of_router(files.record, os.getpid())
    why, first = _start_and_verify(files, ctx, ctx.golden)
    if why:
        ctx.report.progress(f"{files.name}: {why}; nothing switched")
        return PartOutcome(files.name, False, files.record.revision, time.monotonic() - started, why,
                           first_request=first)
    _join(files.record, ctx)
    return PartOutcome(files.name, True, files.record.revision, time.monotonic() - started, first_request=first)


def _retire_surge(name: str, ctx: _Context) -> None:
    ctx.report.progress(f"{name}: the surge replica leaves the router, drains and is removed")
    try:
        remove_surge(ctx.settings.state_dir, name, ctx.manager)
    except NpuopsError as exc:  # the rollout's outcome stands; the operator removes it
        ctx.report.progress(f"{name}: the surge replica was not removed ({exc}); `npuops remove {surge_name(name)} "
                            "--force`")


# --- the rollout --------------------------------------------------------------------------------------------------

def _parts(record: InstanceRecord, ask: RolloutRequest, manager: SystemdManager) -> list[InstanceRecord]:
    """The parts to switch, checked: this node's instance under systemd, its other replicas serving."""
    if record.manager != MANAGER_SYSTEMD:
        raise BadInputError(f"{record.name} runs in a terminal (--foreground)",
                            "stop it there and launch it again; rollout switches units")
    if record.cluster is not None or (record.is_replica_set and ask.from_files is None):
        raise BadInputError(f"{record.name} is one host's part of a group's instance",
                            "roll a group out host by host with -i INVENTORY --group GROUP")
    parts = parts_of(record) if record.is_router or record.is_replica_set else [record]
    if any(p.pd_role for p in parts):
        raise BadInputError(f"{record.name} is disaggregated (prefill and decode pools)",
                            f"launch {record.name} again to change it")
    reason = manager.unavailable_reason()
    if reason:
        raise BadInputError(f"cannot roll out {record.name}: {reason}", "run rollout where the instance runs")
    if ask.surge and not record.is_router:
        raise BadInputError(f"--surge: {record.name} has no router on this host to send requests to a surge "
                            "replica" + (" (over a group, hosts switch at a time)" if record.is_replica_set else ""),
                            f"launch {record.name} behind a router (--router-policy POLICY, or --dp 2) to roll it "
                            "out with --surge, or roll it out with --allow-downtime")
    if ask.allow_downtime:
        return parts
    if not (record.is_router or record.is_replica_set):
        raise BadInputError(
            f"{record.name} is a single engine serving its own port: nothing can take its requests while it "
            "restarts", "roll it out with --allow-downtime, or launch it behind a router (--router-policy "
            "POLICY, or --dp 2) and roll it out with --surge, without dropping a request")
    serving = len(parts) + (1 if ask.surge else 0)
    if ask.max_unavailable >= serving:
        alone = len(parts) == 1 and not ask.surge
        what = (f"{record.name}'s only replica would leave its router with nothing to send requests to"
                if alone else f"--max-unavailable {ask.max_unavailable} would take all {serving} "
                f"replicas of {record.name}{' (its surge replica too)' if ask.surge else ''} out at once")
        fix = ("roll it out with --surge (a temporary replica serves meanwhile), or --allow-downtime"
               if alone else f"use --max-unavailable {serving - 1} or less, or "
               "--allow-downtime")
        raise BadInputError(what, fix)
    down = [p.name for p in parts if manager.state(p.unit).active_state != "active"]
    if down:
        raise BadInputError(f"{', '.join(down)} of {record.name} not running: taking another replica out would "
                            "leave too few serving", f"bring it back first (`npuops status {record.name}`)")
    return parts


def rollout_instance(settings: Settings, manager: SystemdManager, ask: RolloutRequest,
                     report: Reporter) -> RolloutResult:
    with instance_lock(settings.state_dir, [ask.name], "npuops rollout"):
        return _rollout(settings, manager, ask, report)


def _rollout(settings: Settings, manager: SystemdManager, ask: RolloutRequest, report: Reporter) -> RolloutResult:
    record = load_record(settings.state_dir, ask.name)
    parts = _parts(record, ask, manager)
    # Before anything is planned or a replica stopped: a read-only state or unit dir would strand it.
    check_writable(settings.state_dir, [ask.name, *(p.name for p in parts)], manager.unit_dir)
    history = read_history(settings.state_dir, ask.name)
    api_key = _api_key(parts[0])
    if ask.from_files is not None:
        # A host of a group: the group's revisions are the controller's; the host keeps what it was given.
        number = ask.revision or next_revision(settings.state_dir, ask.name)
        current = (_current(history, ask.name) if history else
                   Revision(parts[0].revision, 0.0, "launch", (), parts[0].model_path, record.served_model_name,
                            tuple(p.name for p in parts)))
        target = _staged_target(ask, number, api_key, parts)
    else:
        current = _current(history, ask.name)
        number = next_revision(settings.state_dir, ask.name)
        target = (_undo_target(settings, ask, history, number, api_key, parts) if ask.undo else
                  _new_target(settings, ask, history, number, api_key))
    command = target.origin.command
    if sorted(target.parts) != sorted(p.name for p in parts):
        raise BadInputError(f"revision {current.number} of {ask.name} has the parts {', '.join(sorted(target.parts))}"
                            f", the running one {', '.join(p.name for p in parts)}",
                            f"launch {ask.name} again for that shape")
    for change in target.origin.changes:
        report.progress(f"{ask.name} revision {current.number} -> {number}: {change}")
    keep_revision(settings.state_dir, ask.name, number, target.origin, list(target.parts.values()),
                  outcome=OUTCOME_ROLLING_OUT)
    names = tuple(p.name for p in parts)
    ctx = _Context(settings, manager, report, api_key, ask.golden,
                   RolloutProgress(os.getpid(), time.time(), current.number, number, command, names),
                   ask.put_back)
    result = RolloutResult(ask.name, command, current.number, number, target.origin.changes, [])
    step = max(1, ask.max_unavailable)
    try:
        if target.surge is not None:
            result.surge = _start_surge(target.surge, ctx)
            if not result.surge.ok:
                result.reason = f"{result.surge.name}: {result.surge.reason}"
                result.untouched = names
                parts = []
        for start in range(0, len(parts), step):
            batch = parts[start:start + step]
            ctx.progress = replace(ctx.progress, current=tuple(p.name for p in batch), step="switching")
            write_progress(settings.state_dir, ask.name, ctx.progress)
            with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
                outcomes = list(pool.map(lambda p: _switch(p, target.parts[p.name], ctx), batch))
            result.parts += outcomes
            ctx.progress = replace(ctx.progress, done=(*ctx.progress.done, *(o.name for o in outcomes if o.ok)))
            failed = [o for o in outcomes if not o.ok]
            if failed:
                result.reason = f"{failed[0].name}: {failed[0].reason}"
                result.untouched = names[start + step:]
                break
    finally:
        if target.surge is not None:
            _retire_surge(ask.name, ctx)
        clear_progress(settings.state_dir, ask.name)
    _finish(settings, record, result, target)
    return result


def _finish(settings: Settings, record: InstanceRecord, result: RolloutResult, target: _Target) -> None:
    moved = [p for p in result.parts if p.ok]
    if result.ok:
        finish_revision(settings.state_dir, result.name, result.to_revision, OUTCOME_SERVING)
        if record.is_router or record.is_replica_set:  # this host's record says what its replicas serve
            first = next(iter(target.parts.values())).record
            write_record(replace(record, revision=result.to_revision, model_path=first.model_path,
                                 prediction=first.prediction, perf_inputs=first.perf_inputs))
        return
    outcome = OUTCOME_STOPPED if moved else OUTCOME_ROLLED_BACK
    finish_revision(settings.state_dir, result.name, result.to_revision, outcome, result.reason)


def change_router_workers(settings: Settings, name: str, urls: Sequence[str], how: str) -> list[dict[str, Any]]:
    """`rollout NAME --leave-router URL` / `--join-router URL` on the host of NAME's router: a group rollout takes
    another host's replicas out of the router before it switches them, and puts them back after."""
    router = load_record(settings.state_dir, name)
    if not router.is_router:
        raise BadInputError(f"{name} on this host is not a router", "run it on the group's first host")
    api_key = read_env_file(router.env_file, f"launch {name} again").get("VLLM_API_KEY")
    out = []
    for url in urls:
        change = worker_change(router, url, how, api_key)
        out.append({"url": url, "done": change.done, "message": change.message})
    return out


def render_rollout_text(result: RolloutResult) -> str:
    from npuops.textout import wrapped

    verb = "rolled out" if result.ok else "stopped"
    lines = [f"{result.name}: {result.command} {verb}, revision {result.from_revision} -> {result.to_revision}"]
    lines += [wrapped(change, "  change    ") for change in result.changes]
    if result.surge is not None:
        lines.append(f"  {result.surge.name:<9} " + (f"served revision {result.surge.revision} during the switches, "
                     "removed" if result.surge.ok else "did not start: nothing switched"))
    for part in result.parts:
        state = f"serves revision {part.revision} ({part.seconds:.0f} s)"
        if not part.ok:
            state += " after a failed switch" if part.rolled_back else ", NOT serving"
        lines.append(f"  {part.name:<9} {state}")
    if result.untouched:
        lines.append(f"  untouched {', '.join(result.untouched)} (still on revision {result.from_revision})")
    if result.reason:
        lines.append(wrapped(result.reason, "  reason    "))
        lines.append(wrapped(f"the endpoint serves on; fix the revision and roll out again, or return every "
                             f"replica to revision {result.from_revision} with `npuops rollout {result.name} "
                             "--undo`" if any(p.ok for p in result.parts) else
                             "the endpoint serves on, every replica on the revision before; fix the new one and "
                             "roll out again", "  fix       "))
    return "\n".join(lines)
