"""The performance model's terms for long prompts at high concurrency (perf_model.toml, each explained there): each
grows with what it models and vanishes where its cause is absent. Properties over generated loads (hypothesis),
on real catalog architectures: a dense model (Qwen3-8B on one A2 device) and a MoE (Qwen3-30B-A3B at TP8)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from npuops.plan.catalog import load_model
from npuops.plan.constants import PerfConstants, perf_constants
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.performance import (
    PerfInputs,
    decode_step_s,
    kv_read_s,
    moe_prefill_step_s,
    predict,
    prefill_s,
)
from npuops.plan.planner import make_plan
from npuops.plan.target import parse_hardware_spec

lengths = st.integers(min_value=16, max_value=32768)
batches = st.integers(min_value=1, max_value=256)


@cache
def _base(model: str, hardware: str, tp: int) -> PerfInputs:
    plan = make_plan(load_model(model), parse_hardware_spec(hardware), Workload(1024, 1024, 8),
                     PlanOptions(tp=tp, vllm_ascend_version="0.23.0"))
    return plan.perf


def dense(**fields: object) -> PerfInputs:
    return replace(_base("qwen3-8b", "910B3x1", 1), **fields)  # type: ignore[arg-type]


def moe(**fields: object) -> PerfInputs:
    return replace(_base("qwen3-30b-a3b", "910B3x8", 8), **fields)  # type: ignore[arg-type]


def _without(c: PerfConstants, **fields: float) -> PerfConstants:
    return replace(c, **fields)  # type: ignore[arg-type]


@given(input_len=lengths, output_len=lengths, batch=batches)
@settings(max_examples=60, deadline=None)
def test_the_kv_read_grows_with_the_batch_and_its_context_and_vanishes_without_either(
        input_len: int, output_len: int, batch: int) -> None:
    c = perf_constants()
    p = dense(input_len=input_len, output_len=output_len)
    read = kv_read_s(p, batch, c)
    assert read > 0
    assert kv_read_s(p, batch + 1, c) > read
    assert kv_read_s(replace(p, input_len=input_len + 1024), batch, c) > read
    assert kv_read_s(p, 0, c) == 0.0
    assert kv_read_s(replace(p, kv_bytes_per_token=0), batch, c) == 0.0
    # Paged attention's reads run below the weights' stream: the step is longer than at the weights' efficiency,
    # and exactly as long where the two efficiencies are one.
    same = _without(c, kv_bandwidth_efficiency=c.bandwidth_efficiency)
    assert decode_step_s(p, batch, c)[0] >= decode_step_s(p, batch, same)[0]
    assert kv_read_s(p, batch, same) < read
    # The CPU engine's reads count as its other memory traffic.
    cpu = replace(p, kind="cpu", flops_per_s=1e12, bandwidth_bytes_per_s=40e9, cpu_count=2)
    assert kv_read_s(cpu, batch, c) == kv_read_s(cpu, batch, same)


@given(input_len=lengths)
@settings(max_examples=30, deadline=None)
def test_a_moe_prompt_step_pays_each_moe_layer_once_and_a_dense_one_nothing(input_len: int) -> None:
    c = perf_constants()
    none = _without(c, moe_prefill_layer_us=0.0)
    p = moe(input_len=input_len)
    assert p.arch.num_moe_layers > 0
    extra = prefill_s(p, c) - prefill_s(p, none)
    assert moe_prefill_step_s(p, c) > 0
    assert abs(extra - p.arch.num_moe_layers * c.moe_prefill_layer_us * 1e-6) < 1e-12
    # A fixed cost of the step: the same for a short prompt and a long one.
    assert moe_prefill_step_s(replace(p, input_len=input_len * 2), c) == moe_prefill_step_s(p, c)
    d = dense(input_len=input_len)
    assert d.arch.num_moe_layers == 0 and prefill_s(d, c) == prefill_s(d, none)
    assert moe_prefill_step_s(replace(p, kind="cpu"), c) == 0.0


@given(batch=st.integers(min_value=2, max_value=64), ratio=st.integers(min_value=1, max_value=16))
@settings(max_examples=40, deadline=None)
def test_interleaved_prompt_tokens_cost_a_moe_step_their_routing_serially(batch: int, ratio: int) -> None:
    """The routing of the prompt chunks a decode step carries is added to the step, never hidden under its
    weights' stream; it grows with the prompt tokens a step carries ((B - 1) x input / output), and is absent
    where no prompt interleaves (one sequence, or a wave's lockstep decode) and for a dense model."""
    c = perf_constants()
    serial_free = _without(c, moe_prefill_token_us=0.0, linear_attention_prefill_token_us=0.0)
    output_len = 256
    p = moe(input_len=output_len * ratio, output_len=output_len, max_num_batched_tokens=None)

    def routing(q: PerfInputs, b: int, interleave: bool = True) -> float:
        return decode_step_s(q, b, c, interleave=interleave)[0] - decode_step_s(q, b, serial_free,
                                                                               interleave=interleave)[0]

    carried = (batch - 1) * p.input_len / output_len
    expected = carried * p.arch.num_moe_layers * c.moe_prefill_token_us * 1e-6
    assert abs(routing(p, batch) - expected) < 1e-9
    assert routing(replace(p, input_len=p.input_len * 2), batch) > routing(p, batch)
    assert routing(p, 1) == 0.0 and routing(p, batch, interleave=False) == 0.0
    d = dense(input_len=output_len * ratio, output_len=output_len, max_num_batched_tokens=None)
    assert routing(d, batch) == 0.0


@given(input_len=st.integers(min_value=512, max_value=65536))
@settings(max_examples=40, deadline=None)
def test_the_kv_cache_limits_the_running_batch_at_long_context(input_len: int) -> None:
    """More in flight than the KV cache holds queue: the running batch is the cache over a request's tokens, never
    more than max-num-seqs, and falls as prompts grow; where the cache holds them all, all run."""
    p = dense(input_len=input_len, output_len=1024, concurrency=256, max_num_seqs=256, max_num_batched_tokens=None,
              kv_cache_tokens=400_000)
    running = predict(p).running_per_replica
    assert running == min(256, max(1.0, 400_000 / (input_len + 1024)))
    assert predict(replace(p, input_len=input_len * 2)).running_per_replica <= running
    ample = replace(p, kv_cache_tokens=10**9)
    assert predict(ample).running_per_replica == 256 and predict(ample).queued_per_replica == 0


@given(batch=st.integers(min_value=1, max_value=255))
@settings(max_examples=40, deadline=None)
def test_the_hosts_scheduling_and_sampling_grow_with_the_running_batch(batch: int) -> None:
    """Each running sequence costs the host its scheduling, sampling and detokenizing every step: a step of one
    more sequence is at least host_us_per_seq longer, and without that cost it is not."""
    c = perf_constants()
    p = dense(input_len=512, output_len=512)
    step = decode_step_s(p, batch, c, interleave=False)[0]
    assert decode_step_s(p, batch + 1, c, interleave=False)[0] - step >= c.host_us_per_seq * 1e-6 - 1e-12
    free = _without(c, host_us_per_seq=0.0)
    host = step - decode_step_s(p, batch, free, interleave=False)[0]
    assert abs(host - batch * c.host_us_per_seq * 1e-6) < 1e-9
