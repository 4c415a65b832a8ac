"""Which Ray nodes of a multi-node instance are alive, by host: the check behind `npuops status` on a Ray cluster,
the launch's "every node joined" wait, and the head's supervisor noticing a lost worker.

The nodes come from Ray's public API (`ray.nodes()`, through a driver connection to the head's GCS), run with
the Python beside the instance's `ray` executable, the one the cluster itself runs. `ray status` lists node ids
without addresses, so it cannot say which host is missing. `parse_ray_nodes` and `cluster_state` are pure and
tested on JSON recorded from a real Ray 2.60 cluster (tests/fixtures/ray/).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npuops.envfile import parse_env_file

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
        data = json.loads(text.strip().splitlines()[-1] if text.strip() else "")
    except (ValueError, IndexError):
        try:
            data = json.loads(text)
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


def cluster_state(expected: Sequence[Mapping[str, Any]], nodes: Sequence[RayNode],
                  resources: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Which of the expected hosts ({"name", "address"}) have a live Ray node, and, given the resources each node
    should advertise (e.g. {"NPU": 8}), which live nodes offer less. Ray keeps dead nodes in its table; a host whose
    node died and came back has one dead and one live entry, and counts as alive. Pure."""
    live = {n.address for n in nodes if n.alive}
    offered = {n.address: n.resources for n in nodes if n.alive}
    short = [str(h["name"]) for h in expected if h["address"] in offered and any(
        offered[h["address"]].get(key, 0.0) < amount for key, amount in (resources or {}).items())]
    dead = {n.address for n in nodes if not n.alive} - live
    alive_hosts = [str(h["name"]) for h in expected if h["address"] in live]
    missing = [str(h["name"]) for h in expected if h["address"] not in live]
    lost = [str(h["name"]) for h in expected if h["address"] in dead]
    known = {str(h["address"]) for h in expected}
    strangers = sorted(a for a in live if a not in known)
    return {
        # Complete: every host's node is alive and offers what the engine's placement group will ask for.
        "complete": not missing and not short,
        "short": short,
        "alive": alive_hosts,
        "missing": missing,
        "lost": lost,  # missing hosts whose node was there and died (vs never joined)
        "unexpected": strangers,
        "nodes": len(alive_hosts),  # of the expected hosts; strangers are listed apart
        "expected": len(expected),
    }


def describe_ray_state(state: Mapping[str, Any]) -> str:
    """One line for people: how many of the hosts' nodes are alive, and which hosts are missing, lost or short."""
    if state.get("error"):
        return str(state["error"])
    line = f"{state['nodes']}/{state['expected']} nodes alive"
    if state.get("missing"):
        line += f"; missing: {', '.join(state['missing'])}"
    if state.get("lost"):
        line += f" (lost: {', '.join(state['lost'])})"
    if state.get("short"):
        line += f"; offering too little: {', '.join(state['short'])}"
    return line


def ray_python(ray_command: Sequence[str]) -> str:
    """The interpreter of the venv that holds the `ray` executable the units run."""
    return str(Path(ray_command[0]).parent / "python") if ray_command else "python3"


def ray_auth_env(cluster: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str] | str:
    """The token variables the probe needs to join a token-authenticated cluster: from this process's environment
    (the supervisor gets them from its env file), else from the instance's Ray env file (0600: root reads it);
    a message when neither has them."""
    if cluster.get("ray_auth") != "token":
        return {}
    if environ.get("RAY_AUTH_TOKEN"):
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": environ["RAY_AUTH_TOKEN"]}
    path = str(cluster.get("ray_env_file") or "")
    try:
        values = parse_env_file(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        return f"cannot read the cluster's Ray token in {path or '(no file recorded)'}: {reason} (run as root)"
    token = values.get("RAY_AUTH_TOKEN")
    if not token:
        return f"{path} holds no RAY_AUTH_TOKEN: re-launch the instance"
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def probe_ray_cluster(cluster: Mapping[str, Any], *, timeout_s: float = _PROBE_TIMEOUT_S) -> dict[str, Any]:
    """The state of a record's Ray cluster: cluster_state(...) plus `error` when the head cannot be asked."""
    expected = list(cluster.get("nodes") or [])
    address = str(cluster.get("ray_address") or "")
    python = ray_python(list(cluster.get("ray_command") or []))
    base: dict[str, Any] = {"complete": False, "short": [], "alive": [],
                            "missing": [str(h.get("name")) for h in expected], "lost": [], "unexpected": [],
                            "nodes": 0, "expected": len(expected), "address": address}
    auth = ray_auth_env(cluster, os.environ)
    if isinstance(auth, str):
        return {**base, "error": auth}
    try:
        # The token goes through the environment, never the command line.
        done = subprocess.run([python, "-c", RAY_NODES_SCRIPT, address], capture_output=True, text=True,
                              timeout=timeout_s, check=False, env={**_probe_env(), **auth})
    except FileNotFoundError:
        return {**base, "error": f"{python} does not exist (the Ray venv of the instance)"}
    except subprocess.TimeoutExpired:
        return {**base, "error": f"the Ray head at {address} did not answer within {timeout_s:.0f} s"}
    if done.returncode != 0:
        said = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
        return {**base, "error": f"cannot reach the Ray head at {address}: {said[-1] if said else done.returncode}"}
    try:
        nodes = parse_ray_nodes(done.stdout)
    except RayNodesError as exc:
        return {**base, "error": str(exc)}
    resources = cluster.get("ray_resources") or None
    return {**cluster_state(expected, nodes, resources), "address": address}


def _probe_env() -> dict[str, str]:
    env = dict(os.environ)
    # The probe is a driver of its own: it must not inherit the engine's RAY_ADDRESS or a job's runtime env.
    env.pop("RAY_ADDRESS", None)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env
