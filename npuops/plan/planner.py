"""make_plan: a vLLM configuration for a model on a target, as a pipeline of small decisions.

The planner is pure: a ModelSpec, a HardwareTarget, a Workload and the operator's PlanOptions in, a Plan out. The
target's rules object (npuops/plan/rules.py) answers every question where targets differ; each decision below is
one small function; spreading over several nodes is npuops/plan/cluster.py; the explanations are produced once,
from the finished plan (npuops/plan/explain.py). The vLLM options of the plan are one ServerOptions
(npuops/plan/server_options.py); npuops' own decisions (graph mode, replicas, cluster, environment) are fields of
the Plan beside it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from npuops.errors import BadInputError
from npuops.plan.additional_config import AdditionalSetting, as_config, plan_additional_config
from npuops.plan.calibration import UNCALIBRATED, CalibrationChoice
from npuops.plan.cluster import ClusterPlan, HcclBufferSize, hccl_buffsize_for_ep, plan_cluster
from npuops.plan.constants import MemoryConstants, memory_constants
from npuops.plan.environment import EnvSetting, feature_available
from npuops.plan.explain import explain
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.layout import Evaluated, Layout, Sizing, choose_layout, layout_group, perf_inputs
from npuops.plan.layout import round_up as _round_up
from npuops.plan.memory import MemoryBudget, max_concurrency
from npuops.plan.model import ModelSpec, dtype_bytes, weight_bytes_from_arch
from npuops.plan.performance import Prediction, predict
from npuops.plan.quantization import kv_cache_schemes
from npuops.plan.result import Plan
from npuops.plan.router import plan_router
from npuops.plan.rules import Replica, TargetRules, rules_for
from npuops.plan.server_options import ServerOptions
from npuops.plan.speculative import SpeculativePlan, capture_sizes_for, plan_speculative
from npuops.plan.streaming import stream_interval
from npuops.plan.target import HardwareTarget
from npuops.textout import human_bytes


class PlanDoesNotFit(BadInputError):
    """The model and workload cannot be served on the given hardware; the message says what would fit."""


# --- the single-valued decisions ---------------------------------------------------------------------------------

def serving_weight_bytes(model: ModelSpec, dtype: str) -> int:
    """Weight bytes in device memory at the serving dtype (a float32 plan doubles a bf16 checkpoint)."""
    arch = model.arch
    if model.weight_bytes is None:
        return weight_bytes_from_arch(arch, dtype, model.quantization)
    if model.quantization is not None:
        return model.weight_bytes
    return int(model.weight_bytes * dtype_bytes(dtype) / dtype_bytes(arch.torch_dtype))


def _wanted_max_model_len(rules: TargetRules, options: PlanOptions, model: ModelSpec, workload: Workload) -> int:
    """--max-model-len before the KV cache has a say: as fixed (within the model and the workload), else the rule's."""
    positions = model.arch.max_position_embeddings
    need = workload.request_tokens
    if need > positions:
        raise BadInputError(f"input {workload.input_len} + output {workload.output_len} = {need} tokens exceeds the "
                            f"model's {positions} positions",
                            f"shorten the workload to at most {positions} tokens per request")
    fixed = options.fixed("max_model_len")
    if fixed is None:
        return rules.max_model_len(need, positions)
    if fixed > positions:
        raise BadInputError(f"--max-model-len {fixed} exceeds the model's {positions} positions",
                            f"use at most {positions}")
    if fixed < need:
        raise BadInputError(f"--max-model-len {fixed} is shorter than a workload request ({need} tokens)",
                            f"use at least {need}, or shorten --input-len/--output-len")
    return int(fixed)


def _sizing(model: ModelSpec, rules: TargetRules, workload: Workload, options: PlanOptions, release: str | None,
            warnings: list[str], c: MemoryConstants) -> tuple[Sizing, str, str]:
    """Everything chosen before the layout (it sizes the memory each layout is judged by): the sizing, the dtype
    and the graph mode."""
    dtype = rules.dtype(model, options.fixed("dtype"), warnings)
    weight_bytes = serving_weight_bytes(model, dtype)
    block = rules.block_size(options.fixed("block_size"), warnings)
    mode = rules.graph_mode(release, eager=bool(options.fixed("enforce_eager")))
    # The prefill chunk, chosen before the layout because it sizes the activations.
    batched = options.fixed("max_num_batched_tokens") or rules.batched_tokens(
        workload.input_len, workload.objective, block)
    sizing = Sizing(
        arch=model.arch, weight_bytes=weight_bytes, act_bytes=dtype_bytes(dtype), block_size=block,
        utilization=rules.utilization(options.fixed("gpu_memory_utilization")), max_num_batched_tokens=batched,
        seq_cap=options.fixed("max_num_seqs") or rules.family.max_num_seqs, graph=mode != "eager",
        moe_ep=rules.expert_parallel(model.arch),
        cpu_kv_bytes=rules.kv_cache_bytes(weight_bytes, options.fixed("kv_cache_memory_bytes"), c),
        kv_dtype_bytes=kv_cache_schemes()[model.kv_cache_quantization].bytes if model.kv_cache_quantization
        else dtype_bytes(dtype))
    return sizing, dtype, mode


# --- parallelism ---------------------------------------------------------------------------------------------------

def _candidates(model: ModelSpec, rules: TargetRules, options: PlanOptions) -> list[Layout]:
    """The layouts to try, narrowed by the multi-node strategy asked for."""
    arch = model.arch
    target = rules.target
    candidates = rules.parallel_candidates(arch, options.fixed("tp"), options.fixed("pp"))
    strategy = options.multinode
    if strategy == "replicas":
        raise BadInputError("--multinode replicas is planned host by host",
                            "`npuops plan MODEL` without --nodes shows each host's plan; launch it with "
                            "`npuops launch MODEL -i INVENTORY --group GROUP --multinode replicas`")
    if strategy != "auto" and target.nodes == 1:
        raise BadInputError(f"--multinode {strategy} plans for several nodes", "add --nodes N (N > 1), or drop it")
    if strategy == "ray":
        spanning = [lay for lay in candidates if lay.chips > target.devices_per_node]
        if not spanning:
            raise BadInputError(f"--multinode ray: no TP x PP split of {arch.num_layers} layers spans "
                                f"{target.nodes} nodes of {target.devices_per_node} devices",
                                "use --multinode dp, or fewer --nodes")
        return spanning
    if (strategy == "dp" and not rules.expert_parallel(arch)) or rules.engine_per_host:
        # Native data parallel: every rank holds the whole model, so no rank spans nodes. (MoE ranks share the
        # experts instead: plan_cluster sizes that, whatever single-instance layouts fit.)
        return [lay for lay in candidates if lay.chips <= target.devices_per_node]
    return candidates


def _evaluate(rules: TargetRules, workload: Workload, options: PlanOptions, s: Sizing, candidates: list[Layout],
              required: int, c: MemoryConstants) -> list[Evaluated]:
    """The layouts that leave KV room for one request, of the simplest kind that has any."""
    evaluated: list[Evaluated] = []
    group_of = layout_group(rules.target)
    forced = options.replicas
    for layout in candidates:
        if evaluated and group_of(layout) != group_of(evaluated[0].layout):
            break  # a simpler kind of layout already fits: do not reach for pipeline stages or more nodes
        if forced is not None and not rules.engine_per_host and forced * layout.chips > rules.target.total_devices:
            continue  # --dp N: N copies of this layout must fit the node's chips
        # Expert parallel only makes sense with more than one device holding experts.
        sizing = s if layout.chips > 1 or not s.moe_ep else replace(s, moe_ep=False)
        budget = rules.budget(sizing, layout, c)
        if budget.kv_cache_tokens >= required:
            evaluated.append(Evaluated(layout, budget, forced or rules.replica_count(layout, workload.objective)))
    return evaluated


def _check_forced_replicas(rules: TargetRules, options: PlanOptions, candidates: list[Layout],
                           evaluated: list[Evaluated]) -> None:
    """--dp N is for one node, and N copies of a layout that fits must fit its chips."""
    forced = options.replicas
    if forced is None:
        return
    if rules.target.nodes > 1:
        raise BadInputError(f"--dp {forced} runs independent replicas on one node",
                            "drop --nodes (plan one node), or use --multinode dp for vLLM's data parallel over nodes")
    if not evaluated and candidates:
        smallest = min(lay.chips for lay in candidates)
        raise BadInputError(f"--dp {forced}: {forced} replicas of at least {smallest} chip(s) each do not fit "
                            f"{rules.target.total_devices} chips",
                            f"use --dp {max(1, rules.target.total_devices // smallest)} or fewer")


def _does_not_fit(model: ModelSpec, rules: TargetRules, workload: Workload, s: Sizing, candidates: list[Layout],
                  required: int, c: MemoryConstants) -> PlanDoesNotFit:
    """Say what would fit: a shorter max_model_len, more chips or nodes, a quantization."""
    best = max((rules.budget(s, lay, c) for lay in candidates), key=lambda b: b.kv_budget_bytes, default=None)
    problem = (f"{model.served_name} ({human_bytes(s.weight_bytes)} of weights) does not fit {rules.target.label} "
               f"with KV room for one {required}-token request")
    alternatives: list[str] = []
    if best is not None and best.kv_cache_tokens >= workload.request_tokens:
        alternatives.append(
            f"a shorter --max-model-len (at most {best.kv_cache_tokens // s.block_size * s.block_size})")
    alternatives += rules.fit_alternatives(model, s, candidates, required, c)
    fix = "use " + "; or ".join(alternatives) if alternatives else "use a smaller model or a bigger target"
    return PlanDoesNotFit(problem, fix)


def _parallelism(model: ModelSpec, rules: TargetRules, workload: Workload, options: PlanOptions, s: Sizing, mode: str,
                 required: int, c: MemoryConstants) -> tuple[Evaluated, ClusterPlan | None]:
    candidates = _candidates(model, rules, options)
    evaluated = _evaluate(rules, workload, options, s, candidates, required, c)
    _check_forced_replicas(rules, options, candidates, evaluated)
    if not evaluated:
        raise _does_not_fit(model, rules, workload, s, candidates, required, c)
    chosen = choose_layout(model, rules.target, workload, s, evaluated, mode)
    if rules.target.nodes == 1:
        return chosen, None
    return plan_cluster(model, rules, workload, s, chosen, options.multinode, options.fixed("tp"), mode, required, c)


# --- after the layout ----------------------------------------------------------------------------------------------

def _max_model_len(wanted: int, options: PlanOptions, budget: MemoryBudget, required: int, block: int,
                   warnings: list[str]) -> int:
    """max_model_len must leave KV room for at least one full-length request (vLLM checks at start-up)."""
    if options.fixed("max_model_len") is not None or budget.kv_cache_tokens >= wanted:
        return wanted
    fitted = max(required, budget.kv_cache_tokens // block * block)
    warnings.append(f"max_model_len lowered from {wanted} to {fitted}: the KV cache holds only "
                    f"{budget.kv_cache_tokens} tokens")
    return fitted


def _max_num_seqs(options: PlanOptions, workload: Workload, s: Sizing, chosen: Evaluated, warnings: list[str]) -> int:
    """Throughput: as many sequences as the KV cache holds; latency: the workload's share with little slack."""
    need = workload.request_tokens
    kv_conc = int(max_concurrency(chosen.budget.kv_cache_tokens, need, s.block_size))
    per_replica = math.ceil(workload.concurrency / chosen.replicas)
    fixed = options.fixed("max_num_seqs")
    if fixed is not None:
        seqs = int(fixed)
    elif workload.objective == "throughput":
        seqs = max(1, min(s.seq_cap, kv_conc))
        if seqs >= 16:
            seqs = seqs // 8 * 8
    else:
        seqs = max(1, min(s.seq_cap, kv_conc, max(8, _round_up(per_replica, 8))))
    if kv_conc < per_replica:
        warnings.append(f"KV fits only {kv_conc} concurrent {need}-token requests per instance; the rest of the "
                        f"{workload.concurrency} queue (more chips, a quantization or shorter requests would help)")
    return min(seqs, s.max_num_batched_tokens)


def _environment(model: ModelSpec, rules: TargetRules, release: str | None, layout: Layout, moe_ep: bool,
                 replicas: tuple[Replica, ...], cluster: ClusterPlan | None, buffer: HcclBufferSize | None,
                 additional: tuple[AdditionalSetting, ...]) -> tuple[EnvSetting, ...]:
    """The variables of every replica (the device mask when there is one replica), with the expert-parallel
    HCCL buffer sized from the MC2 kernels' formula instead of the flat rule."""
    mask = replicas[0].devices if len(replicas) == 1 and replicas[0].devices else None
    settings = rules.environment(release, collective=layout.chips > 1 or cluster is not None, moe_ep=moe_ep,
                                 devices=mask)
    if any(a.key == "enable_cpu_binding" and a.value for a in additional):
        # vllm-ascend binds the threads itself: torch_npu's binding would pin them a second time.
        settings = [e for e in settings if e.name != "CPU_AFFINITY_CONF"]
    if buffer is None:
        return tuple(settings)
    sized = EnvSetting("HCCL_BUFFSIZE", str(buffer.mb), buffer.why, None)
    names = [s.name for s in settings]
    if sized.name in names:
        settings[names.index(sized.name)] = sized
    else:
        settings.append(sized)
    return tuple(settings)


def _hccl_buffer(model: ModelSpec, rules: TargetRules, layout: Layout, moe_ep: bool, cluster: ClusterPlan | None,
                 max_num_seqs: int) -> HcclBufferSize | None:
    """Expert parallel's HCCL buffer from the MC2 kernels' formula, for the EP group and the planned batch."""
    if not (moe_ep and rules.expert_parallel(model.arch)):
        return None
    return hccl_buffsize_for_ep(model.arch, cluster.ep_size if cluster else layout.tp, max_num_seqs)


def _speculative(model: ModelSpec, rules: TargetRules, options: PlanOptions, release: str | None, s: Sizing
                 ) -> tuple[SpeculativePlan | None, Sizing]:
    """The speculative decoding of the plan, and the sizing with the draft's weights and KV in it."""
    spec = plan_speculative(model, npu=rules.target.kind == "npu", release=release, asked=options.speculative,
                            draft=options.draft, acceptance=options.spec_acceptance, kv_dtype_bytes=s.kv_dtype_bytes)
    if spec is None:
        return None, s
    return spec, replace(s, draft_weight_bytes=spec.draft_weight_bytes,
                         draft_kv_bytes_per_token=spec.draft_kv_bytes_per_token)


def _additional(model: ModelSpec, rules: TargetRules, options: PlanOptions, release: str | None, moe_ep: bool,
                graph: bool) -> tuple[AdditionalSetting, ...]:
    if release is None:
        if options.additional:
            raise BadInputError("--additional-config is vllm-ascend's", "drop it with --hardware cpu")
        return ()
    return plan_additional_config(family=rules.target.family or "", release=release, arch=model.arch,
                                  moe_ep=moe_ep, operator=options.additional, graph=graph)


def _server_options(model: ModelSpec, rules: TargetRules, s: Sizing, dtype: str, layout: Layout,
                    cluster: ClusterPlan | None, mode: str, max_model_len: int, max_num_seqs: int, moe_ep: bool,
                    spec: SpeculativePlan | None, additional: tuple[AdditionalSetting, ...]) -> ServerOptions:
    capture = capture_sizes_for(rules.capture_sizes(mode, max_num_seqs, layout.tp), spec, max_num_seqs)
    ray = cluster.strategy == "ray" if cluster else layout.chips > rules.target.devices_per_node
    return ServerOptions(
        served_model_name=model.served_name, tensor_parallel_size=layout.tp, pipeline_parallel_size=layout.pp,
        dtype=dtype, block_size=s.block_size, max_model_len=max_model_len,
        max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=max_num_seqs,
        **rules.memory_options(s.utilization, s.cpu_kv_bytes),
        quantization=rules.quantization_option(model), enable_expert_parallel=moe_ep,
        compilation_config=({"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": list(capture)}
                            if mode == "full_decode_only" else None),
        enforce_eager=mode == "eager", distributed_executor_backend="ray" if ray else None,
        trust_remote_code="ChatGLMModel" in model.arch.architectures or model.arch.ships_code,
        speculative_config=spec.config() if spec else None, additional_config=as_config(additional))


# How long a stopping engine drains by default: twice the predicted end-to-end time of the workload's answer (a
# prediction, not a bound), within [DRAIN_MIN_S, DRAIN_MAX_S].
DRAIN_MIN_S = 30
DRAIN_MAX_S = 600


def _drain_timeout(options: PlanOptions, release: str | None, prediction: Prediction) -> int | None:
    """vLLM's --shutdown-timeout: what the operator asked, else from the prediction; None where the release's vLLM
    has no such option (a stop then aborts what is in flight, as before)."""
    asked = options.fixed("shutdown_timeout")
    supported = release is None or feature_available("shutdown_timeout", release)
    if asked is not None:
        if asked and not supported:
            raise BadInputError(f"--drain-timeout needs vLLM's --shutdown-timeout, which vllm-ascend {release} lacks",
                                "drop --drain-timeout, or plan for vllm-ascend 0.18.0 or later (--vllm-ascend-version)")
        return int(asked)
    if not supported:
        return None
    return min(DRAIN_MAX_S, max(DRAIN_MIN_S, math.ceil(2 * prediction.e2e_ms / 1000)))


def _closing_warnings(model: ModelSpec, workload: Workload, cluster: ClusterPlan | None, nodes: int,
                      prediction: Prediction) -> list[str]:
    out = []
    if cluster is not None and cluster.nodes < nodes:
        out.append(f"the plan uses {cluster.nodes} of the {nodes} nodes; launch another group on the rest")
    if not model.weights_present and model.path is not None:
        out.append(f"weights are not downloaded in {model.path}; the plan uses the architecture's size")
    if workload.request_rate is not None and prediction.saturated:
        out.append(f"{workload.request_rate} requests/s exceeds what the plan serves "
                   f"(~{prediction.output_tokens_per_s / workload.output_len:.2f} requests/s): the queue would grow")
    return out


def make_plan(model: ModelSpec, target: HardwareTarget, workload: Workload, options: PlanOptions | None = None,
              calibration: CalibrationChoice = UNCALIBRATED) -> Plan:
    options = options or PlanOptions()
    rules = rules_for(target)
    c = memory_constants()
    release = rules.release(options.vllm_ascend_version)
    rules.check_quantization(model, release)
    warnings: list[str] = list(model.notes)
    need = workload.request_tokens
    wanted_len = _wanted_max_model_len(rules, options, model, workload)
    s, dtype, mode = _sizing(model, rules, workload, options, release, warnings, c)
    spec, s = _speculative(model, rules, options, release, s)
    if spec is not None and spec.draft_assumed:
        warnings.append(f"--speculative {spec.method} without --draft-model: the plan assumes the usual draft; "
                        "a launch needs the draft itself (--draft-model DIR)")
    if spec is not None and options.draft is not None and options.draft.path is None:
        warnings.append(f"the draft {options.draft.served_name} is a catalog model: download {spec.draft_model} and "
                        "pass its directory to --draft-model before launching")
    required = max(_round_up(need, s.block_size), options.fixed("max_model_len") or 0)
    chosen, cluster = _parallelism(model, rules, workload, options, s, mode, required, c)
    layout = chosen.layout
    moe_ep = (s.moe_ep and layout.chips > 1) or (cluster is not None and cluster.expert_parallel)
    mode = rules.pipeline_mode(mode, layout, bool(options.fixed("enforce_eager")), warnings)
    max_model_len = _max_model_len(wanted_len, options, chosen.budget, required, s.block_size, warnings)
    max_num_seqs = _max_num_seqs(options, workload, s, chosen, warnings)
    replicas = rules.replicas(layout, chosen.replicas, cluster=cluster is not None)
    buffer = _hccl_buffer(model, rules, layout, moe_ep, cluster, max_num_seqs)
    if cluster is not None and buffer is not None:
        cluster = replace(cluster, hccl_buffsize_mb=buffer.mb)
    additional = _additional(model, rules, options, release, moe_ep, mode != "eager")
    env_settings = _environment(model, rules, release, layout, moe_ep, replicas, cluster, buffer, additional)
    perf = perf_inputs(model, target, workload, s, chosen, mode, max_num_seqs, spec,
                       ep_size=cluster.ep_size if cluster is not None else None)
    prediction = predict(perf, factors=calibration.factors)
    warnings += _closing_warnings(model, workload, cluster, target.nodes, prediction)
    plan = Plan(
        model=model, target=target, workload=workload, options=options, rules=rules,
        server=replace(_server_options(model, rules, s, dtype, layout, cluster, mode, max_model_len, max_num_seqs,
                                       moe_ep, spec, additional),
                       shutdown_timeout=_drain_timeout(options, release, prediction),
                       stream_interval=stream_interval(options, release, prediction)),
        release=release, graph_mode=mode, layout=layout, replica_count=chosen.replicas, replicas=replicas,
        router=plan_router(len(replicas), options.router_policy) if cluster is None else None,
        cluster=cluster, env_settings=env_settings, hccl_buffer=buffer, memory=chosen.budget,
        weight_bytes=s.weight_bytes, seq_cap=s.seq_cap, prediction=prediction, warnings=tuple(dict.fromkeys(warnings)),
        perf=perf, calibration=calibration, speculative=spec, additional_config=additional)
    return replace(plan, explanations=explain(plan))
