"""The node model of every host in an inventory: the building block of `npuops node -i INVENTORY`
and of the fleet doctor.

Runs playbooks/node-facts.yml (each host runs its own `npuops node --json`) and turns the run into
one entry per host: its node model (the same typed `Node` the host has, read with `Node.from_json`), or why
there is none (failed, unreachable, an answer that is not a node model).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.fleet.events import PlaybookEvent
from npuops.fleet.host_results import HostResult, HostStatus, PlaybookRun
from npuops.fleet.runner import run_playbook
from npuops.hardware.node import Node
from npuops.wire import WireFormatError

NODE_FACTS_PLAYBOOK = "node-facts.yml"
# The set_stats key node-facts.yml hands the model back under.
NODE_STATS_KEY = "npuops_node"

FIX_NOT_FOUND = (
    "install npuops on the host (`npuops provision` puts it in /opt/npuops/venv), or set npuops_command "
    "for the host in the inventory to the npuops executable's path"
)
FIX_UNREACHABLE = "check that the host is up and that `ssh` to it works with the inventory's user, port and key"
FIX_FAILED = "run `npuops node --json` on the host to see the problem there"
FIX_NO_MODEL = "check that npuops_command runs npuops on that host, and do not filter node-facts by tags"


@dataclass(frozen=True)
class HostNode:
    """One host's answer: its node model, or the reason there is none and what to do about it."""

    host: str
    status: HostStatus
    node: Node | None
    message: str = ""
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "fix": self.fix,
                "node": self.node.to_json() if self.node is not None else None}


@dataclass(frozen=True)
class FleetFacts:
    hosts: Mapping[str, HostNode]
    run: PlaybookRun

    @property
    def ok(self) -> bool:
        """Every targeted host gave its node model."""
        return bool(self.hosts) and all(h.status == "ok" for h in self.hosts.values())

    def nodes(self) -> dict[str, Node]:
        """The node models that came back, by host."""
        return {name: h.node for name, h in self.hosts.items() if h.node is not None}

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "artifacts": str(self.run.artifacts),
                "hosts": {name: h.to_json() for name, h in self.hosts.items()}}


def failure_fix(result: HostResult, fallback: str = FIX_FAILED) -> str:
    """The fix for a host whose npuops task failed: install npuops when it could not be started, else `fallback`."""
    failure = result.failures[-1] if result.failures else None
    # Ansible reports an executable it cannot start as rc = errno (see runner.result_message).
    if failure is not None and failure.rc == errno.ENOENT and failure.message.startswith("cannot execute"):
        return FIX_NOT_FOUND
    return fallback


def _host_node(result: HostResult) -> HostNode:
    node = result.data.get(NODE_STATS_KEY)
    if result.status == "unreachable":
        return HostNode(result.name, "unreachable", None, result.message or "unreachable", FIX_UNREACHABLE)
    if result.status == "failed":
        return HostNode(result.name, "failed", None, result.message or "failed", failure_fix(result))
    if node is None:
        # ok without a model: the hand-back task was filtered out (tags).
        return HostNode(result.name, "failed", None, "the host returned no npuops node model", FIX_NO_MODEL)
    try:
        return HostNode(result.name, "ok", Node.from_json(node))
    except WireFormatError as exc:
        # npuops_command printed something else than a node model.
        return HostNode(result.name, "failed", None, f"the host's answer is {exc.problem}", FIX_NO_MODEL)


def fleet_facts_from_run(run: PlaybookRun) -> FleetFacts:
    """One HostNode per host of a node-facts run. Pure."""
    return FleetFacts({name: _host_node(result) for name, result in run.hosts.items()}, run)


def node_facts_extravars(npuops_command: str | None = None, ascend_root: Path | str | None = None,
                         node_timeout_s: float | None = None) -> dict[str, Any]:
    """Extra vars for node-facts.yml; only what the caller set, so the inventory's host vars apply otherwise."""
    extravars: dict[str, Any] = {}
    if npuops_command:
        extravars["npuops_command"] = npuops_command
    if ascend_root is not None:
        extravars["npuops_ascend_root"] = str(ascend_root)
    if node_timeout_s is not None:
        extravars["npuops_node_timeout_s"] = max(1, int(node_timeout_s))
    return extravars


def collect_node_models(
    *,
    inventory: Path | Sequence[str],
    artifacts_dir: Path,
    limit: str | None = None,
    forks: int = 5,
    npuops_command: str | None = None,
    ascend_root: Path | str | None = None,
    node_timeout_s: float | None = None,
    check: bool = False,
    on_event: Callable[[PlaybookEvent], None] | None = None,
    ansible_playbook: Path | None = None,
) -> FleetFacts:
    """Run node-facts.yml on `inventory` (a file/directory, or host names as with --host) and return
    each host's node model or failure. `npuops_command` and `ascend_root`, when given, apply to every
    host (extra vars); leave them None to let the inventory set them per host."""
    run = run_playbook(
        NODE_FACTS_PLAYBOOK,
        inventory=inventory,
        artifacts_dir=artifacts_dir,
        limit=limit,
        extravars=node_facts_extravars(npuops_command, ascend_root, node_timeout_s),
        check=check,
        forks=forks,
        on_event=on_event,
        ansible_playbook=ansible_playbook,
    )
    return fleet_facts_from_run(run)
