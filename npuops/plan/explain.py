"""Why each value of a plan is what it is: produced once, from the finished plan, in a fixed order.

Every explanation reads only the plan (its options, decisions, memory and rules), so it cannot depend on the order
the planner decided in. Where a value departs from the advice npuops tests (docs/claims.md: TP=8, block 32, 4096
batched tokens, max_model_len 2048, float16, one OpenMP thread) its `seed` says how and why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from npuops.plan.constants import perf_constants
from npuops.plan.environment import MOE_EP_HCCL_BUFFSIZE_MB, feature_available
from npuops.plan.layout import MAX_CAPTURE_SIZE
from npuops.plan.memory import max_concurrency
from npuops.plan.performance import cpu_peak
from npuops.plan.quantization import kv_cache_schemes, schemes
from npuops.plan.result import Explanation, Plan
from npuops.plan.streaming import MAX_STREAM_INTERVAL, STREAM_PERIOD_MS
from npuops.textout import human_bytes

# The advice the explanations compare against: claims 2-7 of docs/claims.md.
SEED = {"tensor_parallel_size": 8, "block_size": 32, "max_num_batched_tokens": 4096, "max_model_len": 2048,
        "dtype": "float16"}


def _gb(n: float) -> str:
    """Memory in the plan's one unit (GiB, MiB for small amounts), as the memory lines give it."""
    return human_bytes(n)


def _device_memory(plan: Plan) -> str:
    """The chip's memory in the same unit (a vendor's "64 GB" 910B holds 65536 MiB: 64.0 GiB)."""
    return human_bytes(plan.target.memory_bytes_per_device)


def _dtype(plan: Plan) -> Iterator[Explanation]:
    dtype = str(plan.server.dtype)
    why, seed = plan.rules.dtype_why(dtype, plan.options.fixed("dtype"), plan.model)
    yield Explanation("dtype", dtype, why, seed)


def _block_size(plan: Plan) -> Iterator[Explanation]:
    block = plan.server_int("block_size")
    why, seed = plan.rules.block_why(block, plan.options.fixed("block_size"))
    yield Explanation("block_size", block, why, seed)


def _utilization(plan: Plan) -> Iterator[Explanation]:
    why = plan.rules.utilization_why(plan.options.fixed("gpu_memory_utilization"))
    if why is not None:
        yield Explanation("gpu_memory_utilization", plan.server.gpu_memory_utilization, why)


def _tp_seed(plan: Plan) -> str:
    layout, target = plan.layout, plan.target
    weights = plan.weight_bytes
    fits_one = weights < target.memory_bytes_per_device * 0.8
    if layout.tp == SEED["tensor_parallel_size"]:
        if not fits_one:
            return "the tested advice's tensor_parallel_size=8 agrees here"
        return (f"the tested advice's tensor_parallel_size=8 agrees for the latency objective only: "
                f"{_gb(weights)} of weights fit one {_device_memory(plan)} chip, so for throughput "
                f"{target.devices_per_node} independent TP=1 replicas serve more requests than one TP=8 instance")
    better = (f"{plan.replica_count} independent TP={layout.tp} replicas serve more requests" if plan.replica_count > 1
              else f"TP={layout.tp} is the better trade here")
    return (f"the tested advice uses tensor_parallel_size=8: for {_gb(weights)} of weights on "
            f"{target.devices_per_node} x {_device_memory(plan)} chips that leaves each chip {_gb(weights / 8)} of "
            f"weights and mostly idle memory, and pays two all-reduces per layer on every token; {better}")


def _single_node_parallelism(plan: Plan) -> Iterator[Explanation]:
    layout, target, arch, workload = plan.layout, plan.target, plan.model.arch, plan.workload
    if plan.rules.engine_per_host:
        yield Explanation("tensor_parallel_size", 1, "one CPU engine process on one NUMA node",
                          "the tested advice's TP=8 is for an 8-NPU server; the CPU engine plan uses one process")
        yield Explanation("pipeline_parallel_size", 1, "the model fits one process")
        if plan.replica_count > 1:
            cores = [r.cpus for r in plan.replicas if r.cpus]
            yield Explanation("data_parallel_size", plan.replica_count,
                              f"--dp {plan.replica_count}: independent engines behind one router"
                              + (f", each bound to its own cores ({', '.join(cores)})" if cores else
                                 f" sharing the host's {plan.target.cpu_count} CPUs (fewer than one each)"))
        else:
            yield Explanation("data_parallel_size", 1, "one engine")
        return
    chip_name = target.chip.name if target.chip else "device"
    constraint = f"TP divides the {arch.num_attention_heads} heads and suits the {arch.num_kv_heads} KV heads"
    if workload.objective == "latency":
        why = (f"of the splits that fit ({constraint}), the one with the lowest predicted TPOT at "
               f"{workload.concurrency} concurrent requests: {_gb(plan.memory.weights_bytes)} of weights per device")
    elif layout.tp == 1 and layout.pp == 1:
        why = (f"{_gb(plan.weight_bytes)} of weights fit one {_device_memory(plan)} {chip_name} with "
               f"{_gb(plan.memory.kv_budget_bytes)} left for KV: no collectives on the decode path")
    else:
        why = (f"the smallest split whose {_gb(plan.memory.weights_bytes)} of weights per device plus a KV budget fit "
               f"({constraint})")
    yield Explanation("tensor_parallel_size", layout.tp, why, _tp_seed(plan))
    yield Explanation("pipeline_parallel_size", layout.pp, "one stage: TP within a node holds the model"
                      if layout.pp == 1 else f"{layout.pp} stages: TP alone within a node cannot hold the weights"
                      + (" (stages span nodes over Ray)" if layout.chips > target.devices_per_node else ""))
    if plan.replica_count > 1:
        forced = plan.options.replicas is not None
        yield Explanation("data_parallel_size", plan.replica_count,
                          (f"--dp {plan.replica_count}: " if forced else
                           f"the model needs {layout.chips} of {target.total_devices} chips, so ")
                          + f"{plan.replica_count} independent instances (one vllm serve each, own device mask) "
                          "behind one router multiply throughput without collectives between them")
    else:
        spare = workload.objective == "latency" and layout.chips < target.total_devices
        yield Explanation("data_parallel_size", 1, "one instance" + (
            ": the latency objective gives it the fastest split; spare chips can run other models" if spare else ""))
    if arch.is_moe and layout.chips > 1:
        yield Explanation("enable_expert_parallel", True,
                          f"{arch.num_experts} experts spread whole over the {layout.chips} devices instead of "
                          f"slicing each expert; {_all_to_all_buffer(plan, MOE_EP_HCCL_BUFFSIZE_MB)}")


def _all_to_all_buffer(plan: Plan, fallback_mb: int) -> str:
    """Where the all-to-all's buffer is sized: the env setting's own row when the plan sets HCCL_BUFFSIZE (its
    value is said there, once), else the size the launch gives each node."""
    if any(setting.name == "HCCL_BUFFSIZE" for setting in plan.env_settings):
        return "the all-to-all's buffer is env.HCCL_BUFFSIZE (below)"
    return f"HCCL_BUFFSIZE={fallback_mb} for the all-to-all"


def _router(plan: Plan) -> Iterator[Explanation]:
    router = plan.router
    if router is None:
        return
    chosen = "as asked (--router-policy)" if plan.options.router_policy else "the default"
    which = (f"the {plan.replica_count} replicas (vllm-router on --host/--port, the replicas on 127.0.0.1 behind "
             "it)" if plan.replica_count > 1 else "one replica (vllm-router on --host/--port, the replica on "
             "127.0.0.1 behind it: `rollout --surge` can then switch it without a gap)")
    yield Explanation("router_policy", router.policy, f"one endpoint for {which}; {router.policy}, {chosen}: "
                      f"{router.why}")


def _cpu_rates(plan: Plan) -> Iterator[Explanation]:
    """What the CPU engine's prediction starts from: its peak rate from the CPU's facts and its memory bandwidth."""
    target = plan.target
    if target.kind != "cpu":
        return
    c = perf_constants()
    peak = cpu_peak(target.cpu_features, target.cpu_count or 1, str(plan.server.dtype), c, target.cpu_matmul)
    flops = peak.flops_per_s if peak is not None else (target.cpu_count or 1) * c.cpu_flops_per_core
    bandwidth = target.bandwidth_bytes_per_s or c.cpu_memory_bandwidth_bytes_per_s
    compute = (f"{peak.describe()}, of which prefill reaches {c.prefill_mfu:g} and batched decode "
               f"{c.decode_mfu:g}" if peak is not None else
               f"{c.cpu_flops_per_core / 1e9:g} GFLOP/s a CPU (the node model names no CPU flags)")
    memory = ("the bandwidth measured once on this host and kept" if target.bandwidth_bytes_per_s else
              "the bandwidth is the shared constant (nothing measured is kept for this host)")
    if target.cpu_matmul is None:
        # Hosts with the same flags differ ~3x (npuops/hardware/matmul_rate.py): say what would make it sure.
        compute += " (no matmul timed on this host yet: the serving stack's torch times one, at the next plan)"
    yield Explanation("performance.cpu_rates", f"{flops / 1e9:.0f} GFLOP/s, {bandwidth / 1e9:.1f} GB/s",
                      f"{compute}; {memory}")


def _calibration(plan: Plan) -> Iterator[Explanation]:
    applied = plan.calibration.applied
    yield Explanation("calibration", "applied" if applied is not None else "none", plan.calibration.why)


def _cluster_parallelism(plan: Plan) -> Iterator[Explanation]:
    """A cluster's parallel sizes explained as one instance over its nodes."""
    cluster = plan.cluster
    assert cluster is not None
    per_device = _gb(plan.memory.weights_bytes)
    single = {e.key: e for e in _single_node_parallelism(plan)}
    if cluster.strategy == "ray":
        yield Explanation("tensor_parallel_size", cluster.tp,
                          f"TP inside each node over its {cluster.devices_per_node} devices: the all-reduces twice "
                          f"per layer stay on the node's own links; {per_device} of weights per device")
        yield Explanation("pipeline_parallel_size", cluster.pp, f"{cluster.pp} stages over {cluster.nodes} nodes "
                          "(Ray): only activations cross between nodes")
        yield Explanation("data_parallel_size", 1, "one instance over the cluster")
    else:
        experts = " (attention and the dense layers; the experts are spread by expert parallel)"
        yield Explanation("tensor_parallel_size", cluster.tp, f"TP {cluster.tp} inside each data-parallel rank"
                          + (experts if cluster.expert_parallel else "") + f": {per_device} of weights per device")
        yield (Explanation("pipeline_parallel_size", 1, "one stage: each data-parallel rank runs every layer"
                           + (", with its share of the experts" if cluster.expert_parallel else ""))
               if cluster.pp == 1 else single["pipeline_parallel_size"])
        yield Explanation("data_parallel_size", cluster.dp,
                          f"{cluster.dp} data-parallel ranks, {cluster.dp_local} per node, behind the leader's one "
                          "endpoint (vLLM's --data-parallel-*; followers --headless)"
                          + (": the ranks run the expert layers together (all-to-all every MoE layer)"
                             if cluster.expert_parallel else ": independent engines, no collectives between them"))
    if cluster.expert_parallel:
        buffer = cluster.hccl_buffsize_mb or MOE_EP_HCCL_BUFFSIZE_MB
        yield Explanation("enable_expert_parallel", True,
                          f"the {plan.model.arch.num_experts} routed experts spread whole over the {cluster.ep_size} "
                          "devices of the expert-parallel group instead of slicing each expert; "
                          + _all_to_all_buffer(plan, buffer))
    elif "enable_expert_parallel" in single:
        yield single["enable_expert_parallel"]
    yield Explanation("multinode", cluster.strategy, f"{cluster.why}; not {cluster.rejected[0]}")


def _parallelism(plan: Plan) -> Iterator[Explanation]:
    yield from (_cluster_parallelism(plan) if plan.cluster else _single_node_parallelism(plan))


def _lengths(plan: Plan) -> Iterator[Explanation]:
    workload, arch, need = plan.workload, plan.model.arch, plan.workload.request_tokens
    max_model_len = plan.server_int("max_model_len")
    if plan.options.fixed("max_model_len") is not None:
        why = "as asked"
    elif plan.rules.family.modest_max_model_len:
        why = (f"explicit and modest on 310P: its attention mask is max_model_len^2 float16; {need} tokens per request "
               "rounded up")
    else:
        why = (f"headroom above the workload's {need} tokens, within the model's {arch.max_position_embeddings} "
               "positions; paged KV makes a longer limit cost nothing until used")
    seed = None if max_model_len == SEED["max_model_len"] else (
        f"the tested advice uses max_model_len=2048; {max_model_len} "
        + ("fits this workload and model" if max_model_len >= need else "is what fits"))
    yield Explanation("max_model_len", max_model_len, why, seed)
    batched = plan.server_int("max_num_batched_tokens")
    if plan.options.fixed("max_num_batched_tokens") is not None:
        bwhy = "as asked"
    elif workload.objective == "throughput":
        bwhy = ("a large prefill chunk: prompts are processed in fewer, more efficient steps (higher throughput, "
                "slightly longer decode steps while a chunk runs)")
    else:
        bwhy = ("a prefill chunk that takes the workload's prompt in one step (low TTFT) without stalling running "
                "decodes for long")
    yield Explanation("max_num_batched_tokens", batched, bwhy, None if batched == SEED["max_num_batched_tokens"]
                      else f"the tested advice uses 4096; {batched} suits the {workload.objective} objective here")


def _batching_and_memory(plan: Plan) -> Iterator[Explanation]:
    need = plan.workload.request_tokens
    block = plan.server_int("block_size")
    kv_conc = int(max_concurrency(plan.memory.kv_cache_tokens, need, block))
    if plan.options.fixed("max_num_seqs") is not None:
        why = "as asked"
    elif plan.workload.objective == "throughput":
        why = (f"as many sequences as the KV cache holds at {need} tokens each ({kv_conc}), capped at {plan.seq_cap}: "
               "a bigger decode batch reads the same weights for more tokens")
    else:
        per_replica = math.ceil(plan.workload.concurrency / plan.replica_count)
        why = (f"room for the workload's {per_replica} concurrent requests with little slack: a small decode batch "
               "keeps each step short")
    yield Explanation("max_num_seqs", plan.server.max_num_seqs, why)
    budget = plan.memory
    if plan.server.kv_cache_memory_bytes is not None:
        yield Explanation("kv_cache_memory_bytes", budget.kv_budget_bytes,
                          "the CPU engine's KV budget is exactly this (--kv-cache-memory-bytes); the plan's token "
                          "count is computed the way vLLM does and matches its 'KV cache size' log line")
    yield Explanation("memory.kv_cache_tokens", budget.kv_cache_tokens,
                      f"{_gb(budget.kv_budget_bytes)} of KV budget / {budget.kv_bytes_per_token} bytes per token, in "
                      f"whole blocks: {kv_conc} concurrent {need}-token requests")


def _graphs(plan: Plan) -> Iterator[Explanation]:
    mode = plan.graph_mode
    if mode == "cpu_compiled":
        why = ("vLLM's CPU engine compiles the model (torch.compile, inductor): fused kernels and less Python in "
               "every step, for a longer first start (the compiled graph is kept in VLLM_CACHE_ROOT for the next); "
               "--enforce-eager starts fast and runs slower")
        if plan.layout.pp > 1:
            why += ("; pipeline stages need the compile warm-up anyway: in eager mode the first request fails (the "
                    "tensors passed between stages are only created by the warm-up run)")
        yield Explanation("enforce_eager", False, why)
    elif mode == "full_decode_only":
        config = plan.server.compilation_config or {}
        sizes = config.get("cudagraph_capture_sizes") or []
        spec = plan.speculative
        sizes_why = (f"{len(sizes)} capture sizes, each a multiple of K + 1 = {spec.num_tokens + 1} (a decode step "
                     f"carries K + 1 tokens of each request), the largest max_num_seqs x (K + 1) (vllm-ascend's "
                     "workaround for MTP capture errors)" if spec else
                     f"{len(sizes)} capture sizes up to min(max_num_seqs, {MAX_CAPTURE_SIZE}) stay clear of the "
                     "207008/207005 capture errors")
        limit = plan.rules.family.tp_capture_sizes
        if limit and plan.layout.tp > 1 and not spec:
            sizes_why = (f"the {len(sizes)} largest capture sizes only: a {plan.target.family} TP group's event ids "
                         f"hold {limit} graphs (vllm-ascend's 310P guide)")
        default = ("FULL_AND_PIECEWISE" if plan.release and feature_available("full_and_piecewise_default",
                                                                                plan.release) else "PIECEWISE")
        yield Explanation("compilation_config", config,
                          f"whole decode steps replay as ACL graphs, removing most per-layer launch cost; {sizes_why}; "
                          f"vllm-ascend {plan.release}'s own default is {default}: FULL_DECODE_ONLY (what its "
                          "tutorials pin) captures no prefill graphs, so start-up is shorter and the capture stays "
                          "within the ACL stream budget")
    elif mode == "piecewise":
        yield Explanation("compilation_config", None,
                          f"vllm-ascend {plan.release} predates FULL_DECODE_ONLY; its default piecewise ACL graphs are "
                          "kept")
    else:
        why = ("as asked: a fast start (nothing compiled), slower steps" if plan.target.kind == "cpu"
               else "as asked") if plan.options.fixed("enforce_eager") else plan.rules.eager_why(plan.release)
        yield Explanation("enforce_eager", True, why)


def _quantization(plan: Plan) -> Iterator[Explanation]:
    model = plan.model
    if model.quantization is not None and plan.release is not None:
        scheme = schemes()[model.quantization]
        per_weight = f"{scheme.weight_bytes:g} byte(s) per weight: {scheme.why}"
        if plan.server.quantization:
            yield Explanation("quantization", plan.server.quantization,
                              f"{model.quantization} weights (from {model.quantization_source or 'the checkpoint'}) "
                              f"load through vllm-ascend's ModelSlim method, --quantization "
                              f"{plan.server.quantization}; {per_weight}")
        else:
            yield Explanation("quantization", None,
                              f"an LLM-Compressor (compressed-tensors) {model.quantization} checkpoint: vLLM reads "
                              f"the method from config.json, so no --quantization flag; {per_weight}")
    if model.kv_cache_quantization is not None:
        kv = kv_cache_schemes()[model.kv_cache_quantization]
        yield Explanation("kv_cache_quantization", model.kv_cache_quantization,
                          f"{kv.why}; the memory plan counts {kv.bytes:g} byte per element")


def _remote_code(plan: Plan) -> Iterator[Explanation]:
    if not plan.server.trust_remote_code:
        return
    arch = plan.model.arch
    what = ("the checkpoint's config.json names its own Python classes (auto_map)" if arch.ships_code else
            "ChatGLM checkpoints load their model and tokenizer from the checkpoint's own code")
    yield Explanation("trust_remote_code", True,
                      f"{what}, which vLLM runs only with --trust-remote-code: that code runs in the service with "
                      "the service user's rights, so read the .py files of the model directory before launching")


def _speculative(plan: Plan) -> Iterator[Explanation]:
    spec = plan.speculative
    if spec is None:
        return
    how = ("chosen by the plan: the checkpoint ships MTP layers" if spec.chosen_by_plan else "as asked")
    rate = {"default": "the method's published rate (npuops/data/speculative.toml)",
            "flag": "--spec-acceptance"}[spec.acceptance_source]
    draft = (f"; the draft's {human_bytes(spec.draft_weight_bytes)} of weights and its KV layers are in the memory "
             "plan" if spec.draft_weight_bytes else "")
    if spec.draft_assumed:
        draft += f" ({spec.draft_assumed})"
    if spec.parallel and (plan.server.speculative_config or {}).get("parallel_drafting"):
        draft += ("; its config.json carries a parallel-drafting mask token, so one forward drafts all K "
                  "(parallel_drafting)")
    yield Explanation("speculative_config", plan.server.speculative_config,
                      f"{how}: {spec.why}; K = {spec.num_tokens}, {spec.acceptance:.0%} of drafts accepted "
                      f"({rate}) gives {spec.tokens_per_step:.2f} tokens per step{draft}")


def _additional(plan: Plan) -> Iterator[Explanation]:
    for setting in plan.additional_config:
        yield Explanation(f"additional_config.{setting.key}", setting.value, setting.why)


def _environment(plan: Plan) -> Iterator[Explanation]:
    if plan.rules.engine_per_host:
        yield Explanation("env.OMP_NUM_THREADS", None,
                          "not set: on the CPU engine OpenMP threads do the model's math and vLLM binds them itself "
                          "(VLLM_CPU_OMP_THREADS_BIND)",
                          "the tested advice sets OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1, right for an NPU host, "
                          "crippling on the CPU engine")
        return
    buffer = plan.hccl_buffer
    for setting in plan.env_settings:
        if buffer is not None and setting.name == "HCCL_BUFFSIZE":
            yield Explanation("env.HCCL_BUFFSIZE", buffer.mb,
                              f"{buffer.why} ({plan.server.max_num_seqs} sequences per rank per step)",
                              f"the usual advice is a flat {MOE_EP_HCCL_BUFFSIZE_MB}: sized from the model and batch "
                              "instead")
        else:
            yield Explanation(f"env.{setting.name}", setting.value, setting.why, setting.seed)
    if len(plan.replicas) > 1:
        yield Explanation("env.ASCEND_RT_VISIBLE_DEVICES", "per replica",
                          "each replica gets its own ASCEND_RT_VISIBLE_DEVICES (see replicas)")


def _drain(plan: Plan) -> Iterator[Explanation]:
    timeout = plan.server.shutdown_timeout
    if plan.options.fixed("shutdown_timeout") is not None:
        yield Explanation("shutdown_timeout", timeout, "as asked (--drain-timeout)" + (
            ": a stop aborts the requests in flight" if not timeout else ""))
    elif timeout is None:
        yield Explanation("shutdown_timeout", None, f"vllm-ascend {plan.release}'s vLLM has no --shutdown-timeout: "
                          "a stop or restart aborts the requests in flight (0.18.0 and later drain them)")
    else:
        yield Explanation("shutdown_timeout", timeout,
                          "a stop, restart or rollout lets the requests in flight finish for up to this many seconds "
                          "(new ones are refused; vLLM's own default aborts them): twice the predicted end-to-end "
                          f"time of the workload's answer ({plan.prediction.e2e_ms / 1000:.1f} s), within "
                          "[30, 600] s; --drain-timeout sets it")


def _streaming(plan: Plan) -> Iterator[Explanation]:
    interval = plan.server.stream_interval
    if plan.options.fixed("stream_interval") is not None:
        yield Explanation("stream_interval", interval, "as asked (--stream-interval)")
    elif interval is None:
        yield Explanation("stream_interval", None, f"vllm-ascend {plan.release}'s vLLM streams every token on its own "
                          "(--stream-interval arrived with 0.13.0)")
    elif interval == 1:
        yield Explanation("stream_interval", 1, f"every token is streamed on its own: at the predicted TPOT "
                          f"({plan.prediction.tpot_ms:.0f} ms) a token already takes {STREAM_PERIOD_MS:.0f} ms or more")
    else:
        yield Explanation("stream_interval", interval,
                          f"a streaming client gets {interval} tokens a chunk, one chunk about every "
                          f"{STREAM_PERIOD_MS:.0f} ms at the predicted TPOT ({plan.prediction.tpot_ms:.1f} ms): "
                          "smooth to a reader, and the API server and client do a chunk's work (detokenize, JSON, "
                          "write) once per chunk instead of per token, host time a busy engine's steps want; the "
                          "first token still goes at once, and non-streaming requests are unchanged. "
                          f"--stream-interval 1 sends every token" + (
                              f" (capped at {MAX_STREAM_INTERVAL} tokens)" if interval == MAX_STREAM_INTERVAL else ""))


# In the order `npuops plan` shows them: what runs, how it is split, how long and how many, memory, graphs, env.
_SECTIONS: tuple[Callable[[Plan], Iterator[Explanation]], ...] = (
    _dtype, _block_size, _utilization, _parallelism, _router, _lengths, _batching_and_memory, _graphs, _quantization,
    _remote_code, _speculative, _additional, _drain, _streaming, _environment, _cpu_rates, _calibration,
)


def explain(plan: Plan) -> tuple[Explanation, ...]:
    """Every explanation of the plan, each key once."""
    out: dict[str, Explanation] = {}
    for section in _SECTIONS:
        for item in section(plan):
            if item.key in out:
                raise ValueError(f"the plan explains {item.key!r} twice")
            out[item.key] = item
    return tuple(out.values())
