"""Which Ray nodes of a multi-node instance are alive, by host: the check behind `npuops status` on a Ray cluster,
the launch's "every node joined" wait, and the head's supervisor noticing a lost worker.

The nodes come from Ray's public API (`ray.nodes()`, through a driver connection to the head's GCS), run with
the Python beside the instance's `ray` executable, the one the cluster itself runs. `ray status` lists node ids
without addresses, so it cannot say which host is missing. `parse_ray_nodes` and `cluster_state` are pure and
tested on JSON recorded from a real Ray 2.60 cluster (tests/fixtures/ray/). The answer is a `RayState`, which also
travels inside `npuops status --json` (another host's status reads it back with `RayState.from_json`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npuops.envfile import read_env_file
from npuops.errors import BadInputError
from npuops.wire import WireObject, loads_json

if TYPE_CHECKING:
    # Only read here; the record imports the supervisor's state, which holds a RayState.
    from npuops.instance.membership import ClusterMembership, ClusterNode

# Connects as a short-lived driver (no dashboard needed), prints the node table as JSON, exits.
RAY_NODES_SCRIPT = (
    "import json, sys\n"
    "import ray\n"
    "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
    "print(json.dumps([{'address': n.get('NodeManagerAddress'), 'hostname': n.get('NodeManagerHostname'),\n"
    "                   'alive': bool(n.get('Alive')), 'resources': n.get('Resources') or {}} for n in ray.nodes()]))\n"
)
# A driver connects in ~1.5 s; a head that does not answer would otherwise hold `ray.init` for 40 s and more.
_PROBE_TIMEOUT_S = 20.0


class RayNodesError(ValueError):
    """The node listing could not be read or parsed."""


@dataclass(frozen=True)
class RayNode:
    address: str
    alive: bool
    resources: Mapping[str, float]
    hostname: str = ""


def parse_ray_nodes(text: str) -> list[RayNode]:
    """The JSON RAY_NODES_SCRIPT prints, or `ray.nodes()` dumped as JSON (both key styles). Pure."""
    try:
        data = loads_json(text.strip().splitlines()[-1] if text.strip() else "")
    except (ValueError, IndexError):
        try:
            data = loads_json(text)
        except ValueError:
            raise RayNodesError("the Ray node listing is not JSON") from None
    if not isinstance(data, list):
        raise RayNodesError("the Ray node listing is not a list")
    nodes = []
    for entry in data:
        if not isinstance(entry, dict):
            raise RayNodesError("a Ray node entry is not an object")
        address = entry.get("address", entry.get("NodeManagerAddress"))
        alive = entry.get("alive", entry.get("Alive"))
        if not isinstance(address, str) or not isinstance(alive, bool):
            raise RayNodesError("a Ray node entry lacks its address or alive flag")
        resources = entry.get("resources", entry.get("Resources")) or {}
        hostname = entry.get("hostname", entry.get("NodeManagerHostname")) or ""
        if not isinstance(resources, dict):
            raise RayNodesError(f"the Ray node {address} has resources that are not an object")
        try:
            amounts = {str(k): float(v) for k, v in resources.items()}
        except (TypeError, ValueError):
            raise RayNodesError(f"the Ray node {address} has a resource amount that is not a number") from None
        nodes.append(RayNode(address, alive, amounts, str(hostname)))
    return nodes


@dataclass(frozen=True)
class RayState:
    """Which of a Ray instance's hosts have a live node (host names, in the group's order)."""

    # Every host's node is alive and offers what the engine's placement group will ask for.
    complete: bool
    expected: int  # hosts in the group
    alive: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()  # missing hosts whose node was there and died (vs never joined)
    short: tuple[str, ...] = ()  # alive, but offering less than the engine needs
    unexpected: tuple[str, ...] = ()  # addresses of live nodes that are none of the group's hosts
    address: str | None = None  # the head asked (a probe's answer)
    error: str | None = None  # why the head could not be asked

    @property
    def nodes(self) -> int:
        """Live nodes of the expected hosts; strangers are listed apart."""
        return len(self.alive)

    def describe(self) -> str:
        """One line for people: how many of the hosts' nodes are alive, and which hosts are missing, lost or
        short."""
        if self.error:
            return self.error
        line = f"{self.nodes}/{self.expected} nodes alive"
        if self.missing:
            line += f"; missing: {', '.join(self.missing)}"
        if self.lost:
            line += f" (lost: {', '.join(self.lost)})"
        if self.short:
            line += f"; offering too little: {', '.join(self.short)}"
        return line

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"complete": self.complete, "short": list(self.short), "alive": list(self.alive),
                                "missing": list(self.missing), "lost": list(self.lost),
                                "unexpected": list(self.unexpected), "nodes": self.nodes, "expected": self.expected}
        if self.address is not None:
            data["address"] = self.address
        if self.error is not None:
            data["error"] = self.error
        return data

    @classmethod
    def from_json(cls, data: object) -> RayState:
        """A state as to_json writes it (inside another host's `npuops status --json`); `nodes` is derived, and
        `expected` defaults to the hosts named alive or missing."""
        state = WireObject.wrap(data, "Ray cluster state")
        alive, missing = state.texts("alive"), state.texts("missing")
        return cls(complete=state.flag("complete"), expected=state.integer("expected", len(alive) + len(missing)),
                   alive=alive, missing=missing, lost=state.texts("lost"), short=state.texts("short"),
                   unexpected=state.texts("unexpected"), address=state.opt_text("address"),
                   error=state.opt_text("error"))


def cluster_state(expected: Sequence[ClusterNode], nodes: Sequence[RayNode],
                  resources: Mapping[str, float] | None = None) -> RayState:
    """Which of the expected hosts have a live Ray node, and, given the resources each node should advertise
    (e.g. {"NPU": 8}), which live nodes offer less. Ray keeps dead nodes in its table; a host whose node died and
    came back has one dead and one live entry, and counts as alive. Pure."""
    live = {n.address for n in nodes if n.alive}
    offered = {n.address: n.resources for n in nodes if n.alive}
    short = tuple(h.name for h in expected if h.address in offered and any(
        offered[h.address].get(key, 0.0) < amount for key, amount in (resources or {}).items()))
    dead = {n.address for n in nodes if not n.alive} - live
    missing = tuple(h.name for h in expected if h.address not in live)
    known = {h.address for h in expected}
    return RayState(
        complete=not missing and not short,
        expected=len(expected),
        alive=tuple(h.name for h in expected if h.address in live),
        missing=missing,
        lost=tuple(h.name for h in expected if h.address in dead),
        short=short,
        unexpected=tuple(sorted(a for a in live if a not in known)),
    )


def ray_python(ray_command: Sequence[str]) -> str:
    """The interpreter of the venv that holds the `ray` executable the units run."""
    return str(Path(ray_command[0]).parent / "python") if ray_command else "python3"


def ray_auth_env(cluster: ClusterMembership, environ: Mapping[str, str]) -> dict[str, str] | str:
    """The token variables the probe needs to join a token-authenticated cluster: from this process's environment
    (the supervisor gets them from its env file), else from the instance's Ray env file (0600: root reads it);
    a message when neither has them."""
    if cluster.ray_auth != "token":
        return {}
    if environ.get("RAY_AUTH_TOKEN"):
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": environ["RAY_AUTH_TOKEN"]}
    path = cluster.ray_env_file or ""
    if not path:
        return "cannot read the cluster's Ray token: no file recorded (launch the instance again)"
    try:
        values = read_env_file(Path(path), "run as root")
    except BadInputError as exc:
        return f"cannot read the cluster's Ray token: {exc.one_line()}"
    token = values.get("RAY_AUTH_TOKEN")
    if not token:
        return f"{path} holds no RAY_AUTH_TOKEN: re-launch the instance"
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def probe_ray_cluster(cluster: ClusterMembership, *, timeout_s: float = _PROBE_TIMEOUT_S) -> RayState:
    """The state of a record's Ray cluster: cluster_state(...) with the head's address, or with the `error` why the
    head cannot be asked (every host then counts as missing)."""
    expected = cluster.nodes
    address = cluster.ray_address or ""
    python = ray_python(cluster.ray_command)
    unknown = RayState(complete=False, expected=len(expected), missing=tuple(h.name for h in expected),
                       address=address)
    auth = ray_auth_env(cluster, os.environ)
    if isinstance(auth, str):
        return replace(unknown, error=auth)
    try:
        # The token goes through the environment, never the command line.
        done = subprocess.run([python, "-c", RAY_NODES_SCRIPT, address], capture_output=True, text=True,
                              timeout=timeout_s, check=False, env={**_probe_env(), **auth})
    except FileNotFoundError:
        return replace(unknown, error=f"{python} does not exist (the Ray venv of the instance)")
    except subprocess.TimeoutExpired:
        return replace(unknown, error=f"the Ray head at {address} did not answer within {timeout_s:.0f} s")
    if done.returncode != 0:
        said = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
        return replace(unknown, error=f"cannot reach the Ray head at {address}: "
                                      f"{said[-1] if said else done.returncode}")
    try:
        nodes = parse_ray_nodes(done.stdout)
    except RayNodesError as exc:
        return replace(unknown, error=str(exc))
    return replace(cluster_state(expected, nodes, cluster.ray_resources or None), address=address)


def _probe_env() -> dict[str, str]:
    env = dict(os.environ)
    # The probe is a driver of its own: it must not inherit the engine's RAY_ADDRESS or a job's runtime env.
    env.pop("RAY_ADDRESS", None)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


# A driver that asks every live node, in a task pinned to it, for its stopped Ray worker processes (npuops'
# stopped_ray_workers, from the npuops in the Ray venv): {node address: [pid, ...], or null when the node's task
# failed}. A rank stopped on a worker host hangs the head's engine, and only that host's /proc shows it.
RAY_STOPPED_SCRIPT = (
    "import json, sys\n"
    "import ray\n"
    "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy\n"
    "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
    "@ray.remote(num_cpus=0)\n"
    "def stopped():\n"
    "    from npuops.service.stall import stopped_ray_workers\n"
    "    return stopped_ray_workers()\n"
    "nodes = [n for n in ray.nodes() if n.get('Alive')]\n"
    "refs = [stopped.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n['NodeID'], soft=False)).remote()\n"
    "        for n in nodes]\n"
    "found = {}\n"
    "for node, ref in zip(nodes, refs):\n"
    "    try:\n"
    "        found[node['NodeManagerAddress']] = ray.get(ref, timeout=float(sys.argv[2]))\n"
    "    except Exception:\n"
    "        found[node['NodeManagerAddress']] = None\n"
    "print(json.dumps(found))\n"
)


def parse_stopped_workers(text: str, nodes: Sequence[ClusterNode]) -> list[str]:
    """The hosts (by the group's names) whose nodes reported stopped Ray workers, from RAY_STOPPED_SCRIPT's last
    line; an address the group does not know stays an address. Pure; RayNodesError on output that is not that."""
    try:
        found = loads_json(text.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise RayNodesError(f"the stopped-worker listing is not JSON: {text.strip()[-200:]!r}") from exc
    if not isinstance(found, dict):
        raise RayNodesError("the stopped-worker listing is not an object of node addresses")
    names = {n.address: n.name for n in nodes}
    return [names.get(address) or str(address) for address, pids in found.items() if isinstance(pids, list) and pids]


def find_stopped_workers(cluster: ClusterMembership, *, timeout_s: float = 30.0) -> list[str]:
    """The group's hosts with a stopped Ray worker process, asked through Ray; none when Ray cannot be asked (the
    hang then stays unplaced: "a rank on one of ...")."""
    auth = ray_auth_env(cluster, os.environ)
    if isinstance(auth, str):
        return []
    try:
        done = subprocess.run([ray_python(cluster.ray_command), "-c", RAY_STOPPED_SCRIPT, cluster.ray_address or "",
                               str(timeout_s)], capture_output=True, text=True, timeout=timeout_s + _PROBE_TIMEOUT_S,
                              check=False, env={**_probe_env(), **auth})
        return parse_stopped_workers(done.stdout, cluster.nodes) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, RayNodesError):
        return []
