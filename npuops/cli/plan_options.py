"""The flags plan and launch share, and turning them into planner inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from npuops.errors import EnvironmentMissingError

F = Callable[..., Any]

PLAN_FLAGS: list[Callable[[F], F]] = [
    click.argument("model"),
    click.option("--hardware", default="auto", show_default=True,
                 help="auto (this node), a spec like 910B3x8 / 310P3x2 / Ascend910x16, or cpu."),
    click.option("--nodes", type=click.IntRange(1, 64), default=1, show_default=True, help="Identical nodes."),
    click.option("--devices", help="Plan for a subset of devices, e.g. 0-3."),
    click.option("--input-len", type=click.IntRange(1), default=512, show_default=True),
    click.option("--output-len", type=click.IntRange(1), default=128, show_default=True),
    click.option("--concurrency", type=click.IntRange(1), default=1, show_default=True),
    click.option("--request-rate", type=click.FloatRange(min=0, min_open=True), help="Requests per second."),
    click.option("--objective", type=click.Choice(["throughput", "latency"]), default="throughput",
                 show_default=True),
    click.option("--quantization", help="Weights quantization as vllm-ascend names it (W8A8, W4A8, ...)."),
    click.option("--tp", "tp", type=click.IntRange(1, 128), help="Force the tensor-parallel size."),
    click.option("--pp", "pp", type=click.IntRange(1, 128), help="Force the pipeline-parallel size."),
    click.option("--multinode", type=click.Choice(["auto", "ray", "dp"]), default="auto", show_default=True,
                 help="With --nodes > 1: ray (TP in a node x PP across nodes) or dp (vLLM's native data parallel, "
                      "expert parallel for MoE); auto picks and explains."),
    click.option("--max-model-len", type=click.IntRange(16)),
    click.option("--block-size", type=click.IntRange(1, 1024)),
    click.option("--max-num-seqs", type=click.IntRange(1)),
    click.option("--max-num-batched-tokens", type=click.IntRange(1)),
    click.option("--gpu-memory-utilization", type=click.FloatRange(0.05, 1.0)),
    click.option("--dtype", type=click.Choice(["auto", "bfloat16", "float16", "float32"])),
    click.option("--vllm-ascend-version", help="The vllm-ascend release the node runs (gates env keys)."),
    click.option("--enforce-eager", is_flag=True, help="No graph mode."),
    click.option("--kv-cache-memory-bytes", type=click.IntRange(1), help="CPU target: the KV cache size in bytes."),
]


def plan_flags(func: F) -> F:
    for decorator in reversed(PLAN_FLAGS):
        func = decorator(func)
    return func


def make_plan_from_flags(settings: Any, flags: dict[str, Any], target: Any = None) -> Any:
    """Build the planner inputs from the flags (the node for --hardware auto, the host for cpu) and plan.
    `target` replaces what --hardware would give (a serving group's hardware, read from its hosts)."""
    from npuops.plan.model import load_model
    from npuops.plan.planner import PlanOptions, Workload, make_plan
    from npuops.plan.target import cpu_target, parse_hardware_spec, target_from_node

    model = load_model(flags["model"], flags.get("quantization"))
    hardware = str(flags["hardware"]).strip()
    if target is not None:
        pass
    elif hardware.lower() == "cpu":
        from npuops.hardware.host import read_host_facts
        from npuops.hardware.probe import Probe

        # Only the host's RAM and CPUs matter here: no vendor tool needs to run.
        host = read_host_facts(Probe(settings))
        target = cpu_target(host.memory_total_bytes or 0, len(host.allowed_cpus) or host.cpu_count,
                            max(1, len(host.numa_nodes)), nodes=flags["nodes"])
    elif hardware.lower() == "auto":
        from npuops.hardware.node import discover_node
        from npuops.hardware.probe import Probe

        node = discover_node(Probe(settings))
        if not node.has_npus:
            reasons = "; ".join(node.no_npu_reasons())
            raise EnvironmentMissingError(f"--hardware auto found no NPU on this node ({reasons})",
                                          "pass --hardware explicitly (e.g. 910B3x8) or --hardware cpu")
        first = node.chips[0]
        memory_mb = first.device_memory_total_mb
        target = target_from_node(first.smi.name, len(node.chips),
                                  memory_mb * 1024 * 1024 if memory_mb else None,
                                  nodes=flags["nodes"], devices=flags.get("devices"))
    else:
        target = parse_hardware_spec(hardware, nodes=flags["nodes"], devices=flags.get("devices"))
    workload = Workload(flags["input_len"], flags["output_len"], flags["concurrency"], flags.get("request_rate"),
                        flags["objective"])
    dtype = flags.get("dtype")
    options = PlanOptions(
        tp=flags.get("tp"),
        pp=flags.get("pp"),
        multinode=flags.get("multinode") or "auto",
        max_model_len=flags.get("max_model_len"),
        block_size=flags.get("block_size"),
        max_num_seqs=flags.get("max_num_seqs"),
        max_num_batched_tokens=flags.get("max_num_batched_tokens"),
        gpu_memory_utilization=flags.get("gpu_memory_utilization"),
        dtype=None if dtype in (None, "auto") else dtype,
        vllm_ascend_version=flags.get("vllm_ascend_version"),
        enforce_eager=bool(flags.get("enforce_eager")),
        kv_cache_memory_bytes=flags.get("kv_cache_memory_bytes"),
    )
    return make_plan(model, target, workload, options)
