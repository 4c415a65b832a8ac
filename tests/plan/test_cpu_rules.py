"""What the CPU engine's plan makes of a host's recorded /proc/cpuinfo (tests/fixtures/cpuinfo, each with its source):
the dtype it serves in and why, compiled or eager, and the peak rate its performance model uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from npuops.hardware.matmul_rate import parse_measurement
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.performance import cpu_peak, cpu_peak_flops_per_s
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target
from tests.hardware.test_cpu_features import RECORDED, recorded
from tests.hardware.test_matmul_rate import ZEN5_LINE


def plan_dtype(name: str | None, model_dir: Path, **fixed: object) -> tuple[str, str]:
    features = recorded(name) if name else None
    plan = make_plan(load_model(str(model_dir)), cpu_target(16 * 2**30, 8, 1, features=features),
                     Workload(128, 32), PlanOptions(**fixed))  # type: ignore[arg-type]
    why = next(e.why for e in plan.explanations if e.key == "dtype")
    return str(plan.server.dtype), why


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_cpu_rules_pick_bfloat16_only_where_the_cpu_computes_it_and_say_why(name: str,
                                                                                 tiny_model_dir: Path) -> None:
    native = RECORDED[name][0]
    dtype, why = plan_dtype(name, tiny_model_dir)  # a float32 checkpoint
    if native:
        assert dtype == "bfloat16"
        assert f"natively ({native})" in why and "--dtype float32 keeps it" in why
    else:
        assert dtype == "float32"
        assert "no native bfloat16" in why and "slower than float32" in why


def test_an_operator_asking_for_a_dtype_gets_it_and_no_flags_falls_back_to_the_checkpoint(
        tiny_model_dir: Path) -> None:
    assert plan_dtype("amd-epyc-kvm-avx512bf16-test-machine.txt", tiny_model_dir, dtype="float32") == (
        "float32", "float32 as asked (the vLLM CPU engine computes in float32 or bfloat16)")
    assert plan_dtype("kunpeng920.txt", tiny_model_dir, dtype="bfloat16")[0] == "bfloat16"
    dtype, why = plan_dtype(None, tiny_model_dir)
    assert dtype == "float32" and "names no CPU flags" in why


def test_the_cpu_plan_compiles_unless_a_fast_start_is_asked_for(tiny_model_dir: Path) -> None:
    target = cpu_target(16 * 2**30, 8, 1, features=recorded("xeon-e5-2678v3.txt"))
    model = load_model(str(tiny_model_dir))
    compiled = make_plan(model, target, Workload(128, 32))
    eager = make_plan(model, target, Workload(128, 32), PlanOptions(enforce_eager=True))
    assert compiled.graph_mode == "cpu_compiled" and "--enforce-eager" not in compiled.vllm_args
    assert eager.graph_mode == "eager" and "--enforce-eager" in eager.vllm_args
    why = {e.key: e.why for e in compiled.explanations}["enforce_eager"]
    assert "torch.compile" in why and "--enforce-eager starts fast" in why
    # Eager steps cost more host time each, so the same load is predicted slower.
    assert eager.prediction.tpot_ms >= compiled.prediction.tpot_ms


def test_the_peak_rate_follows_cores_clock_and_the_dtypes_instructions() -> None:
    epyc = recorded("amd-epyc-kvm-avx512bf16-test-machine.txt")
    fp32 = cpu_peak_flops_per_s(epyc, 2, "float32")
    bf16 = cpu_peak_flops_per_s(epyc, 2, "bfloat16")
    assert fp32 is not None and bf16 is not None
    assert fp32 == pytest.approx(2 * 2.596e9 * 32) and bf16 == pytest.approx(2 * fp32)
    # No native bfloat16: widened to float32 around every operation, slower than float32 itself.
    haswell = recorded("xeon-e5-2678v3.txt")
    assert cpu_peak_flops_per_s(haswell, 2, "bfloat16") < cpu_peak_flops_per_s(haswell, 2, "float32")  # type: ignore
    # SMT siblings share a core's vector units: 8 CPUs of a 2-thread core are 4 cores.
    spr = recorded("xeon-platinum-8480c-amx.txt")
    assert cpu_peak_flops_per_s(spr, 8, "float32") == pytest.approx(4 * 2.0e9 * 32)
    assert cpu_peak_flops_per_s(spr, 8, "bfloat16") == pytest.approx(4 * 2.0e9 * 1024)
    # ARM's cpuinfo names no clock: the default one.
    assert cpu_peak_flops_per_s(recorded("kunpeng920.txt"), 4, "float32") == pytest.approx(4 * 2.5e9 * 16)
    assert cpu_peak_flops_per_s(None, 4, "float32") is None


@pytest.mark.parametrize(("name", "own"), [("amd-epyc-kvm-avx512bf16-test-machine.txt", "bfloat16"),
                                           ("kunpeng920.txt", "float32")])
def test_float16_asked_on_the_cpu_gets_the_hosts_own_dtype_and_says_so(name: str, own: str,
                                                                        tiny_model_dir: Path) -> None:
    plan = make_plan(load_model(str(tiny_model_dir)), cpu_target(16 * 2**30, 8, 1, features=recorded(name)),
                     Workload(128, 32), PlanOptions(dtype="float16"))
    assert plan.server.dtype == own
    assert f"planned {own} instead" in " ".join(plan.warnings)
    why = {e.key: e.why for e in plan.explanations}["dtype"]
    assert why.startswith("float16 asked, which the CPU engine runs slowly")


def test_two_hosts_with_the_same_flags_plan_from_their_measured_rates(tiny_model_dir: Path) -> None:
    # The Zen 4 and Zen 5 test machines name the same flags and clock: the flags alone give both one peak.
    zen4 = recorded("amd-epyc-kvm-avx512bf16-test-machine.txt")
    zen5 = recorded("amd-epyc-zen5-kvm-avx512bf16-test-machine.txt")
    assert cpu_peak_flops_per_s(zen4, 2, "bfloat16") == cpu_peak_flops_per_s(zen5, 2, "bfloat16")
    measured = parse_measurement(ZEN5_LINE, at=1.0)
    peak = cpu_peak(zen5, 2, "bfloat16", matmul=measured)
    assert peak is not None and peak.flops_per_s == measured.rates["bfloat16"]
    assert peak.describe() == f"a matmul's rate measured on this host ({measured.how})"
    # Without CPU facts (an older node model) the measured rate still stands.
    assert cpu_peak_flops_per_s(None, 2, "float32", matmul=measured) == measured.rates["float32"]
    model = load_model(str(tiny_model_dir))
    workload = Workload(512, 32, concurrency=4, fixed_lengths=True)
    flags = make_plan(model, cpu_target(16 * 2**30, 2, 1, features=zen5), workload)
    timed = make_plan(model, cpu_target(16 * 2**30, 2, 1, features=zen5, matmul=measured), workload)
    assert str(timed.server.dtype) == "bfloat16"
    # The measured rate is ~3x the flags' figure here, so the same prompts prefill sooner.
    assert timed.prediction.ttft_ms < flags.prediction.ttft_ms
    rates = {e.key: e for e in timed.explanations}["performance.cpu_rates"]
    assert rates.value.startswith("1024 GFLOP/s") and "measured on this host" in rates.why
    untimed = {e.key: e for e in flags.explanations}["performance.cpu_rates"]
    assert "no matmul timed on this host yet" in untimed.why
