"""Prefill/decode disaggregation: what a PD engine (`npuops launch --pd P:D`) needs before it starts (its gate runs
these after launch.py's checks of the instance itself: modules are discovered in name order).

Its KV connector's ports free and outside Mooncake's AscendDirectTransport range and HCCL's host socket ports
(npuops/plan/disaggregation.py says why each range), Mooncake importable in the serving venv, and the NPU NICs the
transfers go over up and healthy. These run in the engine's start gate with its record (tag `instance`); the
connection between the P and D hosts of a group is the network checks' (`npu-peer-ping`, `host-peer-reach`), which a
group launch runs with the group's hosts as peers.
"""

from __future__ import annotations

import json
from pathlib import Path

from npuops.datafiles import load_data_toml
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Result, Severity, Status
from npuops.instance.control import port_taken
from npuops.instance.record import InstanceRecord
from npuops.plan.disaggregation import EXAMPLE_CONNECTOR, hccl_host_range, transport_range

from .launch import InstanceCheck
from .network import HccnLinkUp, HccnNetHealthy

# What the serving venv is asked: whether `mooncake` imports, and the versions of its distributions.
_MOONCAKE_PROBE = """
import importlib, importlib.metadata as md, json
out = {"versions": {}}
for dist in ("mooncake-transfer-engine-npu", "mooncake-transfer-engine", "vllm-ascend"):
    try:
        out["versions"][dist] = md.version(dist)
    except md.PackageNotFoundError:
        pass
try:
    importlib.import_module("mooncake.engine")
    out["import"] = None
except Exception as exc:
    out["import"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""
MOONCAKE_PACKAGE = "mooncake-transfer-engine-npu"


def expected_mooncake(release: str | None) -> str | None:
    """The Mooncake version of a vllm-ascend release's compatibility row, where its sources name one."""
    if release is None:
        return None
    for row in load_data_toml("compat.toml")["stack"]:
        if row["vllm_ascend"] == release or release.startswith(f"{row['vllm_ascend']}.post"):
            wanted = row.get("mooncake")
            return str(wanted) if wanted else None
    return None


def _not_pd(record: InstanceRecord) -> Result:
    return Result.skip(f"{record.name} is not an engine of a disaggregated instance",
                       "nothing to check: only `npuops launch --pd` engines move KV caches")


class PdKvPorts(InstanceCheck):
    """A PD engine's KV connector ports are free and outside Mooncake's and HCCL's port ranges."""

    id = "pd-kv-ports"

    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        if record.pd_role is None:
            return _not_pd(record)
        if record.kv_port is None:
            return Result.skip(f"{record.name}'s connector ({record.kv_connector}) opens no ports: it hands the KV "
                               f"over through {record.kv_shared_path}", "nothing to check",
                               connector=record.kv_connector)
        ports = range(record.kv_port, record.kv_port + max(record.kv_port_span, 1))
        evidence = {"kv_ports": [ports.start, ports.stop - 1], "connector": record.kv_connector}
        ranges = [("HCCL's host socket ports", hccl_host_range())]
        if record.target_kind == "npu":
            chips = len(ctx.node.chips) if ctx.node.has_npus else max(record.devices, default=7) + 1
            ranges.insert(0, ("Mooncake's AscendDirectTransport range", transport_range(chips)))
        for what, taken_range in ranges:
            if ports.start < taken_range.stop and taken_range.start < ports.stop:
                return Result.fail(
                    f"{record.name}'s KV ports {ports.start}-{ports.stop - 1} overlap {what} "
                    f"{taken_range.start}-{taken_range.stop - 1}: transfers fail or time out",
                    f"re-launch with a --kv-port outside it (npuops plan --pd picks {transport_range(8).stop} and up "
                    "on 8 NPUs)", **evidence)
        taken = [p for p in ports if port_taken(record.host, p)]
        if taken:
            return Result.fail(f"ports {', '.join(map(str, taken))} of {record.name}'s KV connector are taken",
                               f"stop what holds them (`ss -ltnp 'sport = :{taken[0]}'`), or re-launch with another "
                               "--kv-port", taken=taken, **evidence)
        return Result.passed(f"KV ports {ports.start}-{ports.stop - 1} free and outside the transport ranges",
                             **evidence)


class PdMooncakeInstalled(InstanceCheck):
    """The serving venv has Mooncake, which a PD engine's Mooncake connector loads at start."""

    id = "pd-mooncake"

    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        if record.pd_role is None:
            return _not_pd(record)
        if record.kv_connector == EXAMPLE_CONNECTOR or not (record.kv_connector or "").startswith("Mooncake"):
            return Result.skip(f"{record.name}'s connector is {record.kv_connector}, part of vLLM itself",
                               "nothing to install", connector=record.kv_connector)
        python = str(Path(record.vllm_command[0]).parent / "python")
        answer = ctx.probe.run(python, "-c", _MOONCAKE_PROBE, timeout=120)
        if answer.missing:
            return Result.fail(f"no serving venv interpreter at {python}",
                               "provision the serving venv (`npuops provision --tags python`)", python=python)
        try:
            found = json.loads(answer.output.strip().splitlines()[-1])
            versions, error = dict(found["versions"]), found["import"]
        except (ValueError, KeyError, IndexError, TypeError):
            return Result.warn(f"could not ask {python} about Mooncake ({answer.describe()})",
                               f"run `{python} -c 'import mooncake.engine'` by hand", python=python)
        if error is not None:
            return Result.fail(f"Mooncake does not import in the serving venv ({error}): the {record.kv_connector} "
                               "engine dies at start ('Please install mooncake ...')",
                               f"install it into the serving venv: `{Path(python).parent}/pip install "
                               f"{MOONCAKE_PACKAGE}==<the release's version>` (vllm-ascend v0.23.0: 0.3.11.post1)",
                               versions=versions, python=python)
        release = versions.pop("vllm-ascend", None)
        listed = ", ".join(f"{d} {v}" for d, v in versions.items()) or "imported (no distribution metadata)"
        wanted = expected_mooncake(release)
        have = versions.get(MOONCAKE_PACKAGE) or versions.get("mooncake-transfer-engine")
        evidence = {"versions": versions, "python": python, "vllm_ascend": release, "expected": wanted}
        if wanted is not None and have is not None and have != wanted:
            return Result.warn(f"the serving venv has Mooncake {have}; vllm-ascend {release} is built against "
                               f"{wanted}", f"install {MOONCAKE_PACKAGE}=={wanted} into the serving venv "
                               f"(`{Path(python).parent}/pip install {MOONCAKE_PACKAGE}=={wanted}`)", **evidence)
        return Result.passed(f"Mooncake in the serving venv: {listed}"
                             + (f" (vllm-ascend {release}'s row: {wanted})" if wanted else ""), **evidence)


class PdNpuNics(InstanceCheck):
    """The NPU NICs a PD engine moves its KV over are link up and healthy."""

    id = "pd-npu-nics"
    severity = Severity.HIGH

    def check(self, record: InstanceRecord, ctx: CheckContext) -> Result:
        if record.pd_role is None:
            return _not_pd(record)
        if record.target_kind != "npu":
            return Result.skip(f"{record.name} runs on the CPU engine: its KV goes through files, not NPU NICs",
                               "nothing to check")
        # The gate's context selects the engine's devices: the link and health checks look at those NICs.
        results = [(cls.id, cls().run(ctx)) for cls in (HccnLinkUp, HccnNetHealthy)]
        worst = max(results, key=lambda r: _RANK[r[1].status])
        check_id, result = worst
        evidence = {cid: r.status.value for cid, r in results}
        if result.status in (Status.PASS, Status.SKIP):
            return (Result.passed(f"the NPU NICs of devices {list(record.devices)} are up and healthy", **evidence)
                    if result.status is Status.PASS else Result.skip(result.message, result.remediation or "",
                                                                      **evidence))
        message = f"{result.message} (Mooncake moves {record.name}'s KV over these ports; {check_id})"
        fix = result.remediation or f"see `npuops doctor --only {check_id}`"
        if result.status is Status.FAIL:
            return Result.fail(message, fix, **evidence)
        return Result.warn(message, fix, **evidence)


_RANK = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3}
