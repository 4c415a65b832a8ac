"""Prefill/decode disaggregation (`npuops plan MODEL --pd P:D`): P prefill engines and D decode engines of one model,
the prompt's KV moved from the one to the other by a KV connector, vllm-router in PD mode as the one endpoint.

Why: in a co-located engine every decode step also carries the prompts chunked prefill interleaves, so a long prompt
arriving lengthens every running request's next token; disaggregated, the decode pool only decodes (its TPOT is the
lockstep step) and the prefill pool only prefills (sized for `max_num_batched_tokens`, few sequences), at the cost
of moving each prompt's KV once and of each pool having only its share of the chips.

On Ascend the connector is vllm-ascend's `MooncakeConnectorV1` (its PD tutorials): each engine gets a
`kv_transfer_config` with its role, its `kv_port` and both pools' parallel sizes; its ranks listen on
kv_port + dp_rank x tp x pp + device index (vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py), so
the engines of one host get disjoint port ranges, all above Mooncake's AscendDirectTransport range
[20000, 20000 + NPUs x 1000) and below HCCL's host socket ports (HCCL_IF_BASE_PORT, 60000-60031 by default: CANN 8.5
environment variable reference, envref_07_0074). When P and D share a host, HCCL_INTRA_ROCE_ENABLE=1 makes their
transfers take the RoCE ports rather than the intra-node links Mooncake cannot use. vllm-ascend asks k=1 on P and
k >= 1 on D for MTP: the prefill engine proposes the first draft, the decode engine runs the plan's K.

On the CPU engine the connector is vLLM's `ExampleConnector`: the producer writes each prompt's KV to a directory the
consumer reads ("External Cache Hit!" in its log, vllm:external_prefix_cache_hits_total in its metrics), so the same
launch path runs here for real.

This module is pure: it plans each pool with the planner on its share of the target and adds the rest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from npuops.errors import BadInputError
from npuops.plan.calibration import UNCALIBRATED, CalibrationChoice
from npuops.plan.constants import PerfConstants, perf_constants
from npuops.plan.environment import EnvSetting
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.model import ModelSpec
from npuops.plan.performance import (
    CalibrationFactors,
    PerfInputs,
    Prediction,
    decode_step_s,
    predict,
    prefill_s,
    request_overhead_s,
)
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.rules import Replica
from npuops.plan.target import HardwareTarget, cpu_target, restrict_devices

PD_AUTO = "auto"
MOONCAKE_CONNECTOR = "MooncakeConnectorV1"
EXAMPLE_CONNECTOR = "ExampleConnector"
KV_PRODUCER = "kv_producer"
KV_CONSUMER = "kv_consumer"
# Mooncake's AscendDirectTransport listens from 20000, 1000 ports for each NPU of the host (vllm-ascend tutorial
# docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md, the kv_port table).
TRANSPORT_BASE_PORT = 20000
TRANSPORT_PORTS_PER_NPU = 1000
# HCCL's host-NIC socket ports: 60000 + 32 (CANN 8.5 envref_07_0074, HCCL_IF_BASE_PORT's default).
HCCL_HOST_BASE_PORT = 60000
HCCL_HOST_PORTS = 32
MAX_INSTANCES_PER_POOL = 16
_SHAPE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class PdShape:
    """How many prefill and decode engines (`--pd P:D`)."""

    prefill: int
    decode: int

    def __str__(self) -> str:
        return f"{self.prefill}:{self.decode}"


def parse_pd(text: str) -> PdShape | None:
    """`--pd P:D` (a shape) or `--pd auto` (None: the plan judges). Pure."""
    if text.strip().lower() == PD_AUTO:
        return None
    match = _SHAPE.match(text)
    if not match:
        raise BadInputError(f"--pd {text!r} is not P:D", "write it like --pd 1:1 (one prefill, one decode engine) "
                            "or --pd auto")
    shape = PdShape(int(match.group(1)), int(match.group(2)))
    if not (1 <= shape.prefill <= MAX_INSTANCES_PER_POOL and 1 <= shape.decode <= MAX_INSTANCES_PER_POOL):
        raise BadInputError(f"--pd {text}: each pool needs 1 to {MAX_INSTANCES_PER_POOL} engines",
                            "use e.g. --pd 1:1 or --pd 2:1")
    return shape


def transport_range(devices_per_node: int) -> range:
    """The ports Mooncake's AscendDirectTransport takes on a host with this many NPUs."""
    return range(TRANSPORT_BASE_PORT, TRANSPORT_BASE_PORT + devices_per_node * TRANSPORT_PORTS_PER_NPU)


def hccl_host_range() -> range:
    return range(HCCL_HOST_BASE_PORT, HCCL_HOST_BASE_PORT + HCCL_HOST_PORTS)


def _overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def kv_port_ranges(spans: list[int], devices_per_node: int, asked: int | None, npu: bool) -> list[range]:
    """Each engine's connector port range on one host: consecutive from `asked`, else from the end of Mooncake's
    transport range; refused where one overlaps that range or HCCL's host ports. Pure."""
    transport = transport_range(devices_per_node) if npu else range(0)
    base = asked if asked is not None else (transport.stop if npu else 30000)
    ranges = []
    for span in spans:
        ranges.append(range(base, base + max(span, 1)))
        base += max(span, 1)
    whole = range(ranges[0].start, ranges[-1].stop)
    if npu and _overlaps(whole, transport):
        raise BadInputError(
            f"--kv-port {asked}: the connectors' ports {whole.start}-{whole.stop - 1} overlap Mooncake's "
            f"AscendDirectTransport range {transport.start}-{transport.stop - 1} on {devices_per_node} NPUs "
            "(transfers then fail or time out)", f"use --kv-port {transport.stop} or above")
    if _overlaps(whole, hccl_host_range()) or whole.stop > 65536:
        hccl = hccl_host_range()
        raise BadInputError(
            f"--kv-port {asked}: the connectors' ports {whole.start}-{whole.stop - 1} overlap HCCL's host socket "
            f"ports {hccl.start}-{hccl.stop - 1} or leave the port space",
            f"use a --kv-port from {transport.stop if npu else 1024} to {hccl.start - (whole.stop - whole.start)}")
    return ranges


@dataclass(frozen=True)
class PdPool:
    """One pool: its engines' plan (their options, memory and layout on the pool's share of the chips)."""

    role: str  # "prefill" | "decode"
    plan: Plan  # its engines on one node (over a group: on each of its hosts)
    kv_ports: tuple[range, ...]  # per engine of one node
    hosts: int = 0  # over an inventory group: the hosts the pool runs on (0: this node's share of the chips)

    @property
    def count(self) -> int:
        """The pool's engines in all."""
        return len(self.plan.replicas) * max(self.hosts, 1)

    @property
    def tp(self) -> int:
        return int(self.plan.server.tensor_parallel_size or 1)

    @property
    def kv_role(self) -> str:
        return KV_PRODUCER if self.role == "prefill" else KV_CONSUMER

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {"role": self.role, "engines": self.count, "hosts": self.hosts, "tensor_parallel_size": self.tp,
                "replicas": [r.as_dict() for r in plan.replicas], "config": plan.config,
                "memory": plan.to_json()["memory"], "kv_ports": [[r.start, r.stop - 1] for r in self.kv_ports],
                "env": plan.env, "prediction_alone": plan.prediction.as_dict()}


@dataclass(frozen=True)
class PdPrediction:
    """The pair's TTFT, TPOT and throughput: prefill alone, the KV transfer, decode without prompts in its steps."""

    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float
    transfer_ms: float
    prefill_ms: float
    e2e_ms: float
    prefill_bound: bool  # the prefill pool, not decode, limits the throughput

    def as_dict(self) -> dict[str, Any]:
        return {"ttft_ms": round(self.ttft_ms, 1), "tpot_ms": round(self.tpot_ms, 2),
                "output_tokens_per_s": round(self.output_tokens_per_s, 1), "transfer_ms": round(self.transfer_ms, 2),
                "prefill_ms": round(self.prefill_ms, 1), "e2e_ms": round(self.e2e_ms, 1),
                "prefill_bound": self.prefill_bound}


@dataclass(frozen=True)
class DisaggregatedPlan:
    shape: PdShape
    prefill: PdPool
    decode: PdPool
    connector: str
    colocated: Plan  # one co-located plan on the same chips, for comparison
    prediction: PdPrediction
    verdict: str  # the comparison with the co-located plan, in a sentence
    env_settings: tuple[EnvSetting, ...]  # what every PD engine adds to its pool's environment
    asked: str  # the --pd value (a shape or "auto")

    @property
    def pools(self) -> tuple[PdPool, PdPool]:
        return self.prefill, self.decode

    def transfer_config(self, pool: PdPool, index: int, shared_path: str | None = None) -> dict[str, Any]:
        """vLLM's --kv-transfer-config of engine `index` of `pool` (`shared_path`: the ExampleConnector's directory)."""
        if self.connector == EXAMPLE_CONNECTOR:
            return {"kv_connector": EXAMPLE_CONNECTOR, "kv_role": pool.kv_role,
                    "kv_connector_extra_config": {"shared_storage_path": shared_path or "/tmp"}}
        return {"kv_connector": self.connector, "kv_role": pool.kv_role, "kv_port": str(pool.kv_ports[index].start),
                "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": self.prefill.tp},
                                              "decode": {"dp_size": 1, "tp_size": self.decode.tp}}}

    def to_json(self) -> dict[str, Any]:
        return {"shape": str(self.shape), "asked": self.asked, "connector": self.connector,
                "prefill": self.prefill.to_json(), "decode": self.decode.to_json(),
                "kv_transfer_config": {pool.role: self.transfer_config(pool, 0, "<the instance's shared directory>")
                                       for pool in self.pools},
                "env": {s.name: s.value for s in self.env_settings},
                "env_why": {s.name: s.why for s in self.env_settings},
                "prediction": self.prediction.as_dict(),
                "colocated_prediction": self.colocated.prediction.as_dict(),
                "colocated_config": self.colocated.config, "verdict": self.verdict}


# --- splitting the target ----------------------------------------------------------------------------------------

def _npu_split(target: HardwareTarget, shape: PdShape, fixed_tp: int | None) -> tuple[HardwareTarget, HardwareTarget]:
    """Each engine a power-of-two share of the node's chips (or the operator's --tp); the decode pool takes what is
    left, since its KV cache holds every running request."""
    total = target.devices_per_node
    engines = shape.prefill + shape.decode
    per_engine = fixed_tp or (1 << int(math.log2(total // engines)) if total >= engines else 0)
    if per_engine == 0 or per_engine * engines > total:
        raise BadInputError(f"--pd {shape}: {engines} engines of {max(per_engine, 1)} chip(s) do not fit "
                            f"{total} chips", "use fewer engines (e.g. --pd 1:1) or a target with more chips")
    ids = target.device_ids
    prefill_ids = ids[:shape.prefill * per_engine]
    return restrict_devices(target, prefill_ids), restrict_devices(target, ids[len(prefill_ids):])


def _cpu_split(target: HardwareTarget, shape: PdShape) -> tuple[HardwareTarget, HardwareTarget]:
    """Each pool its share of the cores and of the NUMA node's memory, by engine count."""
    cores = target.cpu_count or 1
    engines = shape.prefill + shape.decode
    if cores < engines:
        raise BadInputError(f"--pd {shape}: {engines} engines need at least as many cores ({cores} here)",
                            "use --pd 1:1")
    ram = target.total_ram_bytes or target.memory_bytes_per_device
    numa = target.numa_nodes or 1

    def share(count: int, cpus: int) -> HardwareTarget:
        return cpu_target(ram * count // engines, cpus, numa, memory_bandwidth_bytes_per_s=target.bandwidth_bytes_per_s,
                          flops_per_s=target.flops_per_s, features=target.cpu_features, matmul=target.cpu_matmul)

    prefill_cores = max(shape.prefill, cores * shape.prefill // engines)
    return share(shape.prefill, prefill_cores), share(shape.decode, cores - prefill_cores)


def _bind_cores(replicas: tuple[Replica, ...], first_core: int, cores: int) -> tuple[Replica, ...]:
    """A pool's engines bound to their own cores (VLLM_CPU_OMP_THREADS_BIND), the decode pool's after the prefill
    pool's: two engines left to vLLM's own binding would both take the first cores."""
    share = max(cores // max(len(replicas), 1), 1)
    return tuple(replace(r, cpus=f"{first_core + i * share}-{first_core + (i + 1) * share - 1}")
                 for i, r in enumerate(replicas))


# --- the pools ---------------------------------------------------------------------------------------------------

def _pool_options(options: PlanOptions, *, replicas: int | None, speculative: str | None, max_model_len: int | None,
                  tp: int | None) -> PlanOptions:
    fixed = dict(options.server.fixed())
    if max_model_len is not None:
        fixed["max_model_len"] = max_model_len
    if tp is not None and "tensor_parallel_size" not in fixed:
        fixed["tensor_parallel_size"] = tp
    return PlanOptions(vllm_ascend_version=options.vllm_ascend_version, multinode="auto", replicas=replicas,
                       router_policy=None, speculative=speculative, draft=options.draft,
                       spec_acceptance=options.spec_acceptance, additional=options.additional, **fixed)


def _engine_chips(pool: HardwareTarget, engines: int) -> int:
    """The largest power of two of the pool's chips each of its engines can have."""
    return 1 << int(math.log2(max(pool.devices_per_node // engines, 1)))


def _plan_pool(model: ModelSpec, target: HardwareTarget, workload: Workload, calibration: CalibrationChoice,
               options: PlanOptions) -> Plan:
    """A pool's plan with its engines spanning the pool's chips; where the model cannot split that way (heads,
    experts), the planner's own tensor-parallel size."""
    try:
        return make_plan(model, target, workload, options, calibration)
    except BadInputError:
        if options.fixed("tp") is None:
            raise
        loose = dict(options.server.fixed())
        loose.pop("tensor_parallel_size")
        return make_plan(model, target, workload, PlanOptions(
            vllm_ascend_version=options.vllm_ascend_version, replicas=options.replicas, speculative=options.speculative,
            draft=options.draft, spec_acceptance=options.spec_acceptance, additional=options.additional, **loose),
            calibration)


def _prefill_speculative(decode: Plan) -> str | None:
    """vllm-ascend: with MTP the prefill engine runs k=1 (its first draft goes with the KV), the decode engine the
    plan's k; other methods need nothing on the prefill side."""
    spec = decode.speculative
    if spec is None:
        return "none"
    return f"{spec.method}:1" if spec.draft_layers and not spec.draft_model else "none"


def _pd_environment(target: HardwareTarget, shared_host: bool) -> tuple[EnvSetting, ...]:
    if target.kind != "npu":
        return ()
    settings = [EnvSetting("HCCL_INTRA_ROCE_ENABLE", "1",
                           "the prefill and decode engines share this host: their KV transfers must take the NPU "
                           "RoCE ports Mooncake drives, not the intra-node links (vllm-ascend's PD tutorials)", None)
                ] if shared_host else []
    if target.family == "A3":
        settings.append(EnvSetting("ASCEND_A3_ENABLE", "1",
                                   "Mooncake's Ascend transport on an A3 superpod node (vllm-ascend's PD tutorials)",
                                   None))
    return tuple(settings)


def _with_connector(pool: PdPool, pd: DisaggregatedPlan) -> PdPool:
    plan = pool.plan
    server = replace(plan.server, kv_transfer_config=pd.transfer_config(pool, 0))
    settings = tuple(s for s in plan.env_settings if s.name not in {e.name for e in pd.env_settings})
    return replace(pool, plan=replace(plan, server=server, env_settings=settings + pd.env_settings, router=None))


# --- the prediction ----------------------------------------------------------------------------------------------

def transfer_s(perf: PerfInputs, c: PerfConstants) -> float:
    """One prompt's KV from a prefill engine to a decode engine: each device moves its own shard in parallel."""
    if perf.kind == "cpu":
        rate, fixed_ms = c.cpu_pd_transfer_bytes_per_s, c.cpu_pd_transfer_ms
    else:
        rate, fixed_ms = c.pd_transfer_bytes_per_s, c.pd_transfer_ms
    return perf.input_len * perf.kv_bytes_per_token / rate + fixed_ms / 1e3


def recomputed_tokens(input_len: int, block_size: int, connector: str) -> int:
    """Prompt tokens the decode engine computes itself. vLLM's ExampleConnector stores a prompt's whole blocks and
    the consumer looks up the whole blocks of all but its last token (example_connector.py, _found_match_for_prompt),
    so it computes the tail past the last whole block of input_len - 1 tokens (a prompt of exactly k blocks finds
    nothing: the producer stored k blocks, the consumer asks for k - 1). Mooncake moves every block but the last
    token's."""
    if connector != EXAMPLE_CONNECTOR:
        return 1
    stored = input_len // block_size * block_size
    asked = (input_len - 1) // block_size * block_size
    return input_len if asked != stored else input_len - asked


def predict_pd(prefill: PerfInputs, decode: PerfInputs, c: PerfConstants | None = None, *,
               recompute: int = 1, factors: CalibrationFactors | None = None) -> PdPrediction:
    """The pair under the decode pool's load (module docstring); `recompute`: prompt tokens the decode engine
    computes itself (recomputed_tokens); `factors`: this node's calibration, as the pools' own predictions use it.
    Pure."""
    c = c or perf_constants()
    factors = factors or CalibrationFactors()
    overhead = request_overhead_s(prefill.kind, c) * factors.ttft
    one_prompt = prefill_s(prefill, c) * factors.ttft
    move = transfer_s(decode, c)
    if recompute > 1:
        move += prefill_s(replace(decode, input_len=recompute), c) * factors.ttft
    # As in a co-located closed loop: with fewer requests in flight than decode engines, only as many are busy.
    busy = float(min(max(decode.replicas, 1), max(decode.concurrency, 1)))
    per_decoder = max(decode.concurrency, 1) / busy
    slots = min(float(decode.max_num_seqs), decode.kv_cache_tokens / max(decode.input_len + decode.output_len, 1))
    running = max(1.0, min(per_decoder, slots))
    step, _bound = decode_step_s(decode, running, c, factors.step, interleave=False)
    # The router sends each request to a prefill engine (max_tokens 1) and then to a decode engine, which loads the
    # KV and computes the first token in its next step: two requests' overheads, the prompt, the move, a step.
    ttft = 2 * overhead + one_prompt + move + step
    e2e = ttft + max(decode.output_len - 1, 0) * step
    decode_rate = busy * running * decode.output_len / e2e * factors.throughput
    # The prefill pool serves prompts one step each (many prompts of one step share the weights' pass).
    prefill_rate = max(prefill.replicas, 1) / (one_prompt + overhead) * decode.output_len
    bound = prefill_rate < decode_rate
    return PdPrediction(ttft_ms=ttft * 1e3, tpot_ms=step * 1e3, output_tokens_per_s=min(decode_rate, prefill_rate),
                        transfer_ms=move * 1e3, prefill_ms=one_prompt * 1e3, e2e_ms=e2e * 1e3, prefill_bound=bound)


def _verdict(pair: PdPrediction, colocated: Prediction, shape: PdShape) -> str:
    tpot = pair.tpot_ms / colocated.tpot_ms if colocated.tpot_ms else 1.0
    ttft = pair.ttft_ms / colocated.ttft_ms if colocated.ttft_ms else 1.0
    rate = pair.output_tokens_per_s / colocated.output_tokens_per_s if colocated.output_tokens_per_s else 1.0
    return (f"{shape} against one co-located plan on the same chips: TPOT {tpot:.2f}x, TTFT {ttft:.2f}x, output "
            f"tokens/s {rate:.2f}x (the KV transfer adds {pair.transfer_ms:.1f} ms to each first token"
            + ("; the prefill pool limits the rate" if pair.prefill_bound else "") + ")")


def worth_it(pair: PdPrediction, colocated: Prediction, objective: str) -> bool:
    """Whether the pair beats the co-located plan for the objective: throughput at no worse TPOT, or a TPOT at
    least 20% lower without losing more than a tenth of the throughput (latency)."""
    if objective == "latency":
        return (pair.tpot_ms <= 0.8 * colocated.tpot_ms
                and pair.output_tokens_per_s >= 0.9 * colocated.output_tokens_per_s)
    return pair.output_tokens_per_s > colocated.output_tokens_per_s and pair.tpot_ms <= colocated.tpot_ms


# --- planning ----------------------------------------------------------------------------------------------------

def plan_pools(model: ModelSpec, target: HardwareTarget, workload: Workload, options: PlanOptions, shape: PdShape,
               colocated: Plan, calibration: CalibrationChoice = UNCALIBRATED, kv_port: int | None = None,
               asked: str = "") -> DisaggregatedPlan:
    """The disaggregated plan of one shape on one node."""
    if target.nodes > 1:
        raise BadInputError("--pd plans one node's chips", "drop --nodes; over several hosts launch each pool on "
                            "its own hosts (not yet: see the README's PD section)")
    npu = target.kind == "npu"
    fixed_tp = options.fixed("tp")
    prefill_target, decode_target = _npu_split(target, shape, fixed_tp) if npu else _cpu_split(target, shape)
    # Each engine spans its share of its pool's chips: a pool's chips are its own, idle ones help nobody.
    decode_tp = _engine_chips(decode_target, shape.decode) if npu else None
    decode_plan = _plan_pool(model, decode_target, workload, calibration,
                             _pool_options(options, replicas=shape.decode, speculative=options.speculative,
                                           max_model_len=None, tp=decode_tp))
    # The prefill engines take whole prompts in one step and return one token: batch by tokens, few sequences;
    # they accept the decode pool's longest request.
    prefill_load = replace(workload, output_len=1, objective="latency")
    prefill_tp = _engine_chips(prefill_target, shape.prefill) if npu else None
    prefill_plan = _plan_pool(model, prefill_target, prefill_load, calibration,
                              _pool_options(options, replicas=shape.prefill,
                                            speculative=_prefill_speculative(decode_plan),
                                            max_model_len=decode_plan.server_int("max_model_len"), tp=prefill_tp))
    if not npu:
        prefill_cores, decode_cores = prefill_target.cpu_count or 1, decode_target.cpu_count or 1
        prefill_plan = replace(prefill_plan, replicas=_bind_cores(prefill_plan.replicas, 0, prefill_cores))
        decode_plan = replace(decode_plan, replicas=_bind_cores(decode_plan.replicas, prefill_cores, decode_cores))
    spans = [pool_plan.layout.chips for pool_plan in (prefill_plan, decode_plan) for _ in pool_plan.replicas]
    ranges = kv_port_ranges(spans, target.devices_per_node, kv_port, npu)
    prefill = PdPool("prefill", prefill_plan, tuple(ranges[:len(prefill_plan.replicas)]))
    decode = PdPool("decode", decode_plan, tuple(ranges[len(prefill_plan.replicas):]))
    decode_perf = replace(decode_plan.perf, concurrency=workload.concurrency)
    connector = MOONCAKE_CONNECTOR if npu else EXAMPLE_CONNECTOR
    prediction = predict_pd(prefill_plan.perf, decode_perf, recompute=recomputed_tokens(
        workload.input_len, decode_plan.server_int("block_size"), connector), factors=calibration.factors)
    pd = DisaggregatedPlan(shape=shape, prefill=prefill, decode=decode,
                           connector=connector, colocated=colocated,
                           prediction=prediction, verdict=_verdict(prediction, colocated.prediction, shape),
                           env_settings=_pd_environment(target, shared_host=True), asked=asked or str(shape))
    return replace(pd, prefill=_with_connector(prefill, pd), decode=_with_connector(decode, pd))


def plan_pools_over_hosts(model: ModelSpec, node: HardwareTarget, workload: Workload, options: PlanOptions,
                          shape: PdShape, calibration: CalibrationChoice = UNCALIBRATED, kv_port: int | None = None
                          ) -> DisaggregatedPlan:
    """Over an inventory group of P + D identical hosts: the first P hosts run the prefill pool, the next D the decode
    pool, each host its pool's one-node plan (the planner's engines on its chips, or one engine on its cores); the
    co-located plan to compare with is the one-node plan on every host (`--multinode replicas`)."""
    if options.replicas is not None:
        raise BadInputError("--dp and --pd both say how many engines run", "give --pd P:D alone")
    npu = node.kind == "npu"
    colocated = make_plan(model, node, workload, options, calibration)
    decode_plan = make_plan(model, node, workload, _pool_options(
        options, replicas=None, speculative=options.speculative, max_model_len=None, tp=None), calibration)
    prefill_plan = make_plan(model, node, replace(workload, output_len=1, objective="latency"), _pool_options(
        options, replicas=None, speculative=_prefill_speculative(decode_plan),
        max_model_len=decode_plan.server_int("max_model_len"), tp=None), calibration)
    # Each host has its own port space: a pool's engines on one host take consecutive ranges.
    pools = []
    for role, plan, hosts in (("prefill", prefill_plan, shape.prefill), ("decode", decode_plan, shape.decode)):
        ranges = kv_port_ranges([plan.layout.chips for _ in plan.replicas], node.devices_per_node, kv_port, npu)
        pools.append(PdPool(role, plan, tuple(ranges), hosts))
    prefill, decode = pools
    connector = MOONCAKE_CONNECTOR if npu else EXAMPLE_CONNECTOR
    # The whole pools: every host's engines, the group's concurrency over the decode hosts' engines.
    prefill_perf = replace(prefill_plan.perf, replicas=prefill.count)
    decode_perf = replace(decode_plan.perf, replicas=decode.count, concurrency=workload.concurrency)
    everywhere = replace(colocated.perf, replicas=len(colocated.replicas) * (shape.prefill + shape.decode))
    colocated = replace(colocated, perf=everywhere, prediction=predict(everywhere, factors=calibration.factors))
    prediction = predict_pd(prefill_perf, decode_perf, recompute=recomputed_tokens(
        workload.input_len, decode_plan.server_int("block_size"), connector), factors=calibration.factors)
    pd = DisaggregatedPlan(shape=shape, prefill=prefill, decode=decode, connector=connector, colocated=colocated,
                           prediction=prediction, verdict=_verdict(prediction, colocated.prediction, shape),
                           env_settings=_pd_environment(node, shared_host=False), asked=str(shape))
    return replace(pd, prefill=_with_connector(prefill, pd), decode=_with_connector(decode, pd))


def auto_shapes(target: HardwareTarget) -> list[PdShape]:
    """The shapes `--pd auto` weighs: 1:1, and on a node with chips for it 1:2, 2:1, 1:3."""
    engines = target.devices_per_node if target.kind == "npu" else (target.cpu_count or 1)
    candidates = [PdShape(1, 1), PdShape(1, 2), PdShape(2, 1), PdShape(1, 3)]
    return [s for s in candidates if s.prefill + s.decode <= engines]


def plan_disaggregated(model: ModelSpec, target: HardwareTarget, workload: Workload, options: PlanOptions,
                       asked: str, calibration: CalibrationChoice = UNCALIBRATED, kv_port: int | None = None
                       ) -> tuple[DisaggregatedPlan | None, Plan, str]:
    """(the PD plan or None, the co-located plan, why). `--pd P:D` always gives that shape; `--pd auto` the best
    shape when it beats the co-located plan for the workload's objective, else None and why not."""
    shape = parse_pd(asked)
    if options.replicas is not None:
        raise BadInputError("--dp and --pd both say how many engines run", "give --pd P:D alone (P prefill and D "
                            "decode engines), or --dp N alone for co-located replicas")
    colocated = make_plan(model, target, workload, options, calibration)
    if shape is not None:
        pd = plan_pools(model, target, workload, options, shape, colocated, calibration, kv_port, asked)
        return pd, colocated, pd.verdict
    if target.kind != "npu":
        return None, colocated, ("--pd auto: co-located; on the CPU engine the pools share one memory bus and the KV "
                                 "goes through files (ExampleConnector): disaggregation only proves the path here "
                                 "(--pd 1:1 launches it)")
    tried: list[DisaggregatedPlan] = []
    failures: list[str] = []
    for candidate in auto_shapes(target):
        try:
            tried.append(plan_pools(model, target, workload, options, candidate, colocated, calibration, kv_port,
                                    asked))
        except BadInputError as exc:
            failures.append(f"{candidate}: {exc.problem}")
    winners = [pd for pd in tried if worth_it(pd.prediction, colocated.prediction, workload.objective)]
    if not winners:
        best = max(tried, key=lambda pd: pd.prediction.output_tokens_per_s, default=None)
        why = (f"--pd auto: co-located; no split of {target.devices_per_node} chips beats it for "
               f"{workload.objective}" + (f" (best {best.verdict})" if best else "")
               + (f"; {'; '.join(failures)}" if failures and not tried else ""))
        return None, colocated, why
    if workload.objective == "latency":
        chosen = min(winners, key=lambda pd: pd.prediction.tpot_ms)
    else:
        chosen = max(winners, key=lambda pd: pd.prediction.output_tokens_per_s)
    return chosen, colocated, f"--pd auto chose {chosen.shape}: {chosen.verdict}"
