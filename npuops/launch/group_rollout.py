"""`npuops rollout NAME -i INVENTORY --group GROUP`: a group's replicas switched host by host.

For an instance launched with `--multinode replicas` (every host's replicas behind one router on the first host):

1. the new revision is planned as the group launch plans (the request and choices the current revision was made
   from, kept on the controller beside its Ansible artifacts, with the flags given over them) and rendered per host;
2. a new model's weights are placed on every host (copied from the controller, or `--weights-shared`: already on a
   shared path) and checked against the controller's sha256 manifest (place-weights.yml); a host where the check
   fails stops the rollout before anything changes anywhere;
3. host by host (`--max-unavailable` hosts at a time), rollout-host.yml takes the host's replicas out of the router
   (on the router's host: `npuops rollout NAME --leave-router URL`), stages the host's new files there and runs
   `npuops rollout NAME --from-files DIR` on it (each replica drained, switched, verified, or put back), then puts
   them back in the router; the first host that fails stops the rollout, the hosts after it untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from npuops.errors import BadInputError
from npuops.fleet.events import PlaybookEvent
from npuops.fleet.runner import run_playbook
from npuops.httpclient import base_url
from npuops.instance.record import RECORD_FILE, InstanceRecord
from npuops.instance.revisions import (
    OUTCOME_ROLLED_BACK,
    OUTCOME_ROLLING_OUT,
    OUTCOME_SERVING,
    OUTCOME_STOPPED,
    LaunchOrigin,
    Revision,
    read_history,
    request_changes,
)
from npuops.launch.group import GroupChoices, GroupLaunch, prepare_group
from npuops.launch.multinode import HostPart, PlacedFile
from npuops.launch.prepare import LaunchChoices
from npuops.launch.revision_store import (
    finish_revision,
    group_store,
    keep_group_revision,
    kept_launch,
    next_revision,
)
from npuops.launch.rollout import RolloutRequest
from npuops.plan.inputs import PlanRequest
from npuops.settings import Settings
from npuops.wire import loads_json

PLACE_WEIGHTS_PLAYBOOK = "place-weights.yml"
ROLLOUT_HOST_PLAYBOOK = "rollout-host.yml"


def weights_manifest(directory: Path) -> dict[str, str]:
    """Every file under a model directory (relative path) and its sha256, as the hosts must hold them."""
    if not directory.is_dir():
        raise BadInputError(f"the model directory {directory} does not exist on this controller",
                            "give --model the directory the weights are in here")
    manifest = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        manifest[str(path.relative_to(directory))] = digest.hexdigest()
    return manifest


def replica_files(part: HostPart, name: str) -> dict[str, list[PlacedFile]]:
    """A host's replicas' files by replica (NAME-r0, ...): what a host switches; the router's and the host's
    record of the group stay."""
    out: dict[str, list[PlacedFile]] = {}
    for placed in part.files:
        owner = (placed.path.name.removeprefix("npuops-").removesuffix(".service")
                 if placed.path.suffix == ".service" else placed.path.parent.name)
        if owner.startswith(f"{name}-r") and owner[len(name) + 2:].isdigit():
            out.setdefault(owner, []).append(placed)
    return out


def replica_urls(files: Mapping[str, Sequence[PlacedFile]]) -> list[str]:
    """The URLs the router knows the replicas by (each record's address and port)."""
    urls = []
    for replica, placed in files.items():
        text = next(f.text for f in placed if f.path.name == RECORD_FILE)
        record = InstanceRecord.from_json(json.loads(text), replica)
        urls.append(base_url(record.host, record.port))
    return urls


@dataclass
class HostOutcome:
    host: str
    ok: bool
    message: str = ""
    switch: dict[str, Any] | None = None  # the host's own `rollout --from-files --json`
    stack: dict[str, Any] | None = None  # a stack rollout's provisioning: the versions and the doctor after

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "message": self.message, "switch": self.switch,
                "stack": self.stack}


@dataclass
class GroupRolloutResult:
    name: str
    group: str
    from_revision: int
    to_revision: int
    changes: tuple[str, ...]
    weights: dict[str, Any] = field(default_factory=dict)
    hosts: list[HostOutcome] = field(default_factory=list)
    untouched: tuple[str, ...] = ()
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason and all(h.ok for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "name": self.name, "group": self.group, "from_revision": self.from_revision,
                "to_revision": self.to_revision, "changes": list(self.changes), "weights": self.weights,
                "hosts": [h.to_json() for h in self.hosts], "untouched": list(self.untouched),
                "reason": self.reason}


@dataclass(frozen=True)
class GroupRolloutAsk:
    """A rollout as one node's (what changes, the golden file, how many at once: hosts here) over a group."""

    rollout: RolloutRequest
    where: GroupChoices
    weights_shared: bool = False

    @property
    def name(self) -> str:
        return self.rollout.name


def plan_group_revision(settings: Settings, ask: GroupRolloutAsk, current: Revision, kept: Mapping[str, Any],
          on_event: Callable[[PlaybookEvent], None] | None) -> tuple[GroupLaunch, LaunchOrigin]:
    before = PlanRequest.from_json(kept["request"])
    request = (ask.rollout.tuned or before).with_flags(ask.rollout.flags)
    changes = request_changes(before.to_json(), request.to_json())
    choices = LaunchChoices.from_json(kept["choices"])
    if ask.rollout.vllm:
        changes.append(f"vllm: {choices.vllm or 'the serving venv'} -> {ask.rollout.vllm}")
        choices = replace(choices, vllm=ask.rollout.vllm)
    launch, hosts, _ = prepare_group(settings, request, choices, ask.where, on_event=on_event,
                                     served_name=current.served_model_name)
    if launch.strategy != "replicas":
        raise BadInputError(f"{ask.name} over {ask.where.group} is not --multinode replicas",
                            "a Ray or data-parallel instance is one engine over every host: launch it again")
    if tuple(h.name for h in hosts) != current.parts:
        raise BadInputError(f"group {ask.where.group} is now {', '.join(h.name for h in hosts)}; revision "
                            f"{current.number} runs on {', '.join(current.parts)}",
                            "launch the instance again over the group's new hosts")
    origin = LaunchOrigin(request.to_json(), choices.to_json(), "rollout", tuple(changes) or ("no change",))
    return launch, origin


def _place_weights(ask: GroupRolloutAsk, model: Path, on_event: Callable[[PlaybookEvent], None] | None
                   ) -> tuple[bool, dict[str, Any]]:
    manifest = weights_manifest(model)
    run = run_playbook(PLACE_WEIGHTS_PLAYBOOK, inventory=ask.where.inventory, artifacts_dir=ask.where.artifacts_dir,
                       limit=ask.where.group, forks=ask.where.forks, on_event=on_event, extravars={
                           "npuops_group": ask.where.group, "npuops_weights_src": str(model),
                           "npuops_weights_dest": str(model), "npuops_weights_copy": not ask.weights_shared,
                           # A list of objects, not a mapping: every value (a file name too) is passed as data.
                           "npuops_weights_manifest": [{"path": k, "sha256": v} for k, v in manifest.items()]})
    report = {"model": str(model), "files": len(manifest), "copied": not ask.weights_shared,
              "hosts": {n: {"status": h.status, "message": h.message} for n, h in run.hosts.items()}}
    return run.ok, report


def _stage(part: HostPart, name: str, staging: Path) -> list[dict[str, str]]:
    """The host's replicas' files under a private staging directory, and the copy manifest to <part>/<file>."""
    entries = []
    try:
        for replica, placed in replica_files(part, name).items():
            directory = staging / part.host.name / replica
            directory.mkdir(parents=True, mode=0o700)
            for f in placed:
                source = directory / f.path.name
                fd = os.open(source, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # env files may hold the API key
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(f.text)
                entries.append({"src": str(source), "dest": f"{replica}/{f.path.name}", "mode": f"{f.mode:04o}"})
    except OSError as exc:
        raise BadInputError(f"cannot stage {part.host.name}'s files in {exc.filename or staging}: {exc.strerror}",
                            "make the artifacts directory (--artifacts) writable, then roll out again") from None
    return entries


def switch_hosts(ask: GroupRolloutAsk, launch: GroupLaunch, batch: Sequence[HostPart], number: int,
                 staging: Path, on_event: Callable[[PlaybookEvent], None] | None, *,
                 put_back: bool = True) -> list[HostOutcome]:
    """rollout-host.yml on `batch`: each host's replicas out of the router, switched to the staged files, and back
    in (`put_back` False: a host whose switch failed stays out, its replicas stopped)."""
    files = {p.host.name: _stage(p, ask.name, staging) for p in batch}
    urls = {p.host.name: replica_urls(replica_files(p, ask.name)) for p in batch}
    run = run_playbook(ROLLOUT_HOST_PLAYBOOK, inventory=ask.where.inventory, artifacts_dir=ask.where.artifacts_dir,
                       limit=ask.where.group, forks=ask.where.forks, on_event=on_event, extravars={
                           "npuops_instance": ask.name, "npuops_router_host": launch.parts[0].host.name,
                           "npuops_rollout_hosts": [p.host.name for p in batch],
                           "npuops_worker_urls_by_host": urls, "npuops_files": files, "npuops_revision": number,
                           "npuops_put_back": put_back,
                           "npuops_golden": str(ask.rollout.golden) if ask.rollout.golden else ""})
    outcomes = []
    for part in batch:
        result = run.hosts.get(part.host.name)
        switch = _switch_answer(result.data.get("npuops_switch") if result is not None else None)
        ok = result is not None and result.status == "ok" and bool(switch and switch.get("ok") is True)
        reason = (switch or {}).get("reason")
        message = (reason if isinstance(reason, str) and reason else
                   result.message if result is not None else "not reached")
        outcomes.append(HostOutcome(part.host.name, ok, "" if ok else message, switch))
    return outcomes


def _switch_answer(said: object) -> dict[str, Any] | None:
    """A host's `rollout --from-files --json` as it printed it: a JSON object, or None (another host's answer is
    data: anything else is no answer)."""
    if not isinstance(said, str) or not said:
        return None
    try:
        answer = loads_json(said)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def current_group_revision(ask: GroupRolloutAsk) -> tuple[Path, Revision, dict[str, Any]]:
    """The controller's store of the group's revisions, the revision serving now and its kept request."""
    store = group_store(ask.where.artifacts_dir, ask.where.group)
    history = read_history(store, ask.name)
    serving = [r for r in history if r.outcome != OUTCOME_ROLLED_BACK]
    if not serving:
        raise BadInputError(f"no revision of {ask.name} over {ask.where.group} is kept on this controller (in "
                            f"{store})", "launch it over the group from this controller (with the same --artifacts)")
    current = serving[-1]
    kept = kept_launch(store, ask.name, current.number)  # checked: every value of the type npuops writes
    if kept is None or kept.request is None:
        raise BadInputError(f"the request of {ask.name}'s revision {current.number} is not kept in {store}",
                            "launch it over the group again")
    return store, current, kept.to_json()


def rollout_group(settings: Settings, ask: GroupRolloutAsk,
                  on_event: Callable[[PlaybookEvent], None] | None = None) -> GroupRolloutResult:
    store, current, kept = current_group_revision(ask)
    launch, origin = plan_group_revision(settings, ask, current, kept, on_event)
    number = next_revision(store, ask.name)
    result = GroupRolloutResult(ask.name, ask.where.group, current.number, number, origin.changes)
    model = Path(launch.plan.model.path or "").resolve()  # as the rendered files name it
    placed, result.weights = _place_weights(ask, model, on_event)
    if not placed:
        bad = [f"{n}: {h['message']}" for n, h in result.weights["hosts"].items() if h["status"] != "ok"]
        result.reason = "the weights are not on every host as the controller has them: " + "; ".join(bad)
        result.untouched = tuple(p.host.name for p in launch.parts)
        return result
    keep_group_revision(store, ask.name, number, origin, str(model), current.served_model_name,
                        current.parts, outcome=OUTCOME_ROLLING_OUT)
    staging = ask.where.artifacts_dir / f"staging-rollout-{ask.name}-{os.getpid()}"
    host_by_host(ask, launch, result, staging,
                 lambda batch: switch_hosts(ask, launch, batch, number, staging, on_event))
    moved = any(h.ok for h in result.hosts)
    outcome = OUTCOME_SERVING if result.ok else OUTCOME_STOPPED if moved else OUTCOME_ROLLED_BACK
    finish_revision(store, ask.name, number, outcome, result.reason)
    return result


def host_by_host(ask: GroupRolloutAsk, launch: GroupLaunch, result: GroupRolloutResult, staging: Path,
                 switch: Callable[[Sequence[HostPart]], list[HostOutcome]]) -> None:
    """The group's hosts in order, `--max-unavailable` at a time, each batch switched by `switch`: the first host
    that fails stops the rollout with its reason, the hosts after it untouched. The staging directory is removed
    whatever happened (the staged env files may hold the API key)."""
    step = max(1, ask.rollout.max_unavailable)
    try:
        for start in range(0, len(launch.parts), step):
            outcomes = switch(launch.parts[start:start + step])
            result.hosts += outcomes
            failed = [o for o in outcomes if not o.ok]
            if failed:
                result.reason = f"{failed[0].host}: {failed[0].message}"
                result.untouched = tuple(p.host.name for p in launch.parts[start + step:])
                break
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def render_group_rollout_text(result: GroupRolloutResult) -> str:
    from npuops.textout import wrapped

    verb = "rolled out" if result.ok else "stopped"
    lines = [f"{result.name} over {result.group}: rollout {verb}, revision {result.from_revision} -> "
             f"{result.to_revision}"]
    lines += [wrapped(change, "  change    ") for change in result.changes]
    weights = result.weights
    if weights:
        lines.append(f"  weights   {weights['files']} file(s) of {weights['model']} "
                     f"{'copied and ' if weights['copied'] else ''}checked (sha256) on "
                     f"{sum(h['status'] == 'ok' for h in weights['hosts'].values())} of {len(weights['hosts'])} "
                     "host(s)")
    for host in result.hosts:
        lines.append(wrapped(f"serves revision {result.to_revision}" if host.ok else
                             f"NOT switched: {host.message}", f"  {host.host:<9} "))
        if host.stack and host.stack.get("versions"):  # a stack rollout's host that was provisioned
            lines.append(wrapped(_stack_changes(host.stack), f"  {'':<9} stack "))
    if result.untouched:
        lines.append(f"  untouched {', '.join(result.untouched)}")
    if result.reason:
        lines.append(wrapped(result.reason, "  reason    "))
    return "\n".join(lines)


def _stack_changes(stack: Mapping[str, Any]) -> str:
    """What a stack rollout's provisioning changed on a host: each package of the row, before -> after."""
    versions = ((stack.get("versions") or {}).get("python_stack") or {})
    before, after = versions.get("before") or {}, versions.get("after") or {}
    changed = [f"{k} {before.get(k, '-')} -> {v}" for k, v in sorted(after.items()) if before.get(k) != v]
    return ", ".join(changed) or "no package of the row changed"
