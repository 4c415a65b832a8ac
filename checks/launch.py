"""Launch: what one launched instance needs before its engine starts (its executable, its model, its port, its Ray
cluster).

These checks read the instance's record from the context (DoctorOptions.instance): the start gate
(`npuops run --preflight NAME`, the unit's ExecStartPre, the first step of `launch --foreground`) gives it. Without
one they skip; they carry the `instance` tag, so a plain `npuops doctor` run leaves them out.
"""

from __future__ import annotations

import abc
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity
from npuops.httpclient import client_host
from npuops.instance.access import AccessProblem, ServiceIdentity, executable_problems, model_problems
from npuops.instance.control import port_taken
from npuops.instance.manager import systemd_booted
from npuops.instance.membership import ClusterMembership
from npuops.instance.ray import RayState, probe_ray_cluster
from npuops.instance.record import InstanceRecord

NO_INSTANCE_FIX = "run it for a launched instance: `npuops run --preflight NAME` (the start gate)"

# How long the start gate of a Ray head's engine waits for every node to join before refusing: a worker
# booting a little later than the head is normal.
RAY_JOIN_WAIT_S = 120.0
_RAY_POLL_S = 3.0


class InstanceCheck(Check):
    """A check of one launched instance: it reads the instance's record, and skips without one."""

    area = "launch"
    severity = Severity.CRITICAL
    level = 1
    tags = ("gate", "instance")

    def run(self, ctx: CheckContext) -> Result:
        record = ctx.options.instance
        if record is None:
            return Result.skip("no instance given: this check runs in an instance's start gate "
                               "(`npuops run --preflight NAME`)", NO_INSTANCE_FIX)
        return self.check(record, ctx)

    @abc.abstractmethod
    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        """The check's answer for this instance."""


def service_identity(record: InstanceRecord, ctx: CheckContext) -> ServiceIdentity | None:
    """Who the instance's unit runs as (with the NPU group when it has chips); None for a foreground run. The
    unit's sandbox applies when real systemd runs the node (not docker-systemctl-replacement)."""
    if record.service_user is None:
        return None
    return ServiceIdentity.of(record.service_user, record.supplementary_groups,
                              sandboxed=systemd_booted(ctx.settings))


def _access_failed(record: InstanceRecord, problems: list[AccessProblem], **evidence: object) -> Result:
    first = problems[0]
    return Result.fail(f"{record.service_user} (the unit's user) cannot use {first.problem()}", first.fix,
                       user=record.service_user, path=first.path, where=first.where,
                       problems=[p.problem() for p in problems], **evidence)


class EngineExecutable(InstanceCheck):
    """The vLLM executable the instance runs, and its interpreter, exist and run as the unit's user."""

    id = "engine-executable"

    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        exe = record.vllm_command[0]
        identity = service_identity(record, ctx)
        if identity is not None and os.path.isabs(exe):
            # As the service user, under the sandbox: root (the gate) can run what the unit cannot (203/EXEC).
            problems = executable_problems("the vllm executable", Path(exe), identity)
            # The supervisor the unit runs (ExecStart=), and the interpreter running this gate, must be reachable
            # too: root runs the gate ("+") where the unit's user may not follow (a venv or a symlink into /root).
            supervisor = record.supervisor_command[0] if record.supervisor_command else None
            if supervisor is not None and os.path.isabs(supervisor):
                problems += executable_problems("the npuops executable", Path(supervisor), identity)
            else:
                problems += executable_problems("the npuops interpreter", Path(sys.executable), identity)
            if problems:
                return _access_failed(record, problems, executable=exe)
            return Result.passed(f"{exe} runs as {identity.user}", executable=exe, user=identity.user)
        if not os.path.isabs(exe):
            ok = any(os.access(os.path.join(d, exe), os.X_OK) for d in os.environ.get("PATH", "").split(":") if d)
        else:
            ok = os.path.isfile(exe) and os.access(exe, os.X_OK)
        if ok:
            return Result.passed(f"{exe} is executable", executable=exe)
        return Result.fail(f"the vLLM executable {exe} is missing or not executable",
                           "install the serving stack (`npuops provision --tags python`), or re-launch with "
                           "--vllm PATH", executable=exe)


class ModelDirectory(InstanceCheck):
    """The model directory holds a Hugging Face config.json, and the unit's user can read all of it."""

    id = "model-directory"

    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        model = Path(record.model_path)
        if not ((model / "config.json").is_file() or (model / "params.json").is_file()):
            what = "does not exist" if not model.exists() else "holds no config.json (or params.json)"
            return Result.fail(f"the model directory {model} {what}",
                               "put the model back (config.json, tokenizer and weights) or re-launch with the right "
                               "directory", model=str(model))
        identity = service_identity(record, ctx)
        if identity is not None:
            # Weights saved 0600 by root pass a check made as root and fail the engine on every restart.
            problems = model_problems(model, identity)
            if problems:
                return _access_failed(record, problems, model=str(model))
        return Result.passed(f"{model} holds config.json" + (f", readable by {identity.user}" if identity else ""),
                             model=str(model))


class PortFree(InstanceCheck):
    """Nothing else listens on the instance's port."""

    id = "port-free"

    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        if not record.serves_api:
            return Result.skip(f"{record.name}'s part here ({record.role}) serves no API: it has no port of its own",
                               "nothing to do: the part that serves the API checks its port", role=record.role)
        host = client_host(record.host)
        # The same bind test launch makes: it is what the engine will do with the port.
        if not port_taken(record.host, record.port):
            return Result.passed(f"{host}:{record.port} is free", port=record.port)
        return Result.fail(f"another process already listens on {host}:{record.port}",
                           f"stop it (`ss -ltnp 'sport = :{record.port}'` shows which) or re-launch with another "
                           "--port", port=record.port)


def wait_for_ray_cluster(record: InstanceRecord, cluster: ClusterMembership, *, wait_s: float,
                         probe: Callable[[ClusterMembership], RayState]) -> Result:
    """Ask the cluster (probe) every _RAY_POLL_S until every host has a live Ray node, for at most wait_s."""
    started = time.monotonic()
    while True:
        state = probe(cluster)
        if state.complete or time.monotonic() - started >= wait_s:
            break
        time.sleep(_RAY_POLL_S)
    if state.complete:
        return Result.passed(f"{state.nodes}/{state.expected} Ray nodes alive ({', '.join(state.alive)})",
                             alive=list(state.alive), address=state.address)
    missing = ", ".join(state.missing + state.short) or "?"
    ray_unit = record.ray_unit or "the Ray unit"
    return Result.fail(
        (f"the Ray cluster cannot be asked: {state.error}" if state.error else
         f"after {wait_s:.0f} s, no live Ray node on {', '.join(state.missing)}" if state.missing
         else f"the Ray nodes of {missing} offer less than {dict(cluster.ray_resources)}"),
        f"on each of {missing}: `systemctl status {ray_unit}` and `journalctl -u {ray_unit}`; check that it reaches "
        f"{cluster.ray_address} (`npuops doctor -i INVENTORY --group {cluster.group}` checks the network between the "
        "hosts)", missing=list(state.missing), short=list(state.short), error=state.error, address=state.address)


class CpuCompiler(InstanceCheck):
    """A compiled CPU engine finds the C++ compiler torch.compile's inductor backend builds its kernels with."""

    id = "cpu-compiler"

    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        """vLLM's CPU engine compiles unless --enforce-eager: inductor writes C++ and builds it with $CXX, else g++
        (torch/_inductor/config.py cpp.cxx), found on the engine's PATH. Without one the engine fails at its
        warm-up with InvalidCxxCompiler, after loading the weights; the gate says it before, with the two fixes."""
        if record.target_kind != "cpu" or not record.graph_mode or not record.runs_engine:
            return Result.skip(f"{record.name} is not a compiled CPU engine", "nothing to do: only torch.compile "
                               "on the CPU engine builds C++", target=record.target_kind, compiled=record.graph_mode)
        environ = ctx.settings.environ
        compiler = environ.get("CXX") or "g++"
        path = environ.get("PATH") or os.defpath
        found = shutil.which(compiler, path=path)
        if found is None:
            return Result.fail(f"the CPU engine compiles its model (torch.compile) and needs a C++ compiler, but "
                               f"{compiler} is not on its PATH", "install one (`apt-get install g++`, `dnf install "
                               "gcc-c++`), or re-launch with --enforce-eager (eager: a fast start, slower steps)",
                               compiler=compiler, path=path)
        return Result.passed(f"torch.compile builds with {found}", compiler=found)


class RayCluster(InstanceCheck):
    """Every host of the group has joined the Ray cluster."""

    id = "ray-cluster"

    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        """A Ray head's engine starts only once every host of the group has a live Ray node: vLLM would otherwise
        wait for its placement group and then fail with a resource error that names no host."""
        cluster = record.ray_cluster
        if cluster is None or not record.runs_engine:
            strategy = record.cluster.strategy if record.cluster else "single node"
            return Result.skip(f"{record.name}'s part here ({record.role}, {strategy}) is not a Ray head's engine",
                               "nothing to do: only the engine on a Ray head waits for the cluster",
                               role=record.role, strategy=strategy)
        # The wait and the probe are looked up here, at run time, so tests can shorten one and record the other.
        return wait_for_ray_cluster(record, cluster, wait_s=RAY_JOIN_WAIT_S, probe=probe_ray_cluster)
