"""The CPU's compute facts from recorded /proc/cpuinfo (tests/fixtures/cpuinfo, each with its source); what the CPU
engine's plan makes of them is in tests/plan/test_cpu_rules.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from npuops.hardware.cpu_features import CpuFeatures, parse_cpu_features

CPUINFO = Path(__file__).resolve().parents[1] / "fixtures" / "cpuinfo"

# file: (native bfloat16 flag, vector unit, threads per core, GHz)
RECORDED = {
    "amd-epyc-kvm-avx512bf16-test-machine.txt": ("avx512_bf16", "avx512", 1, 2.596),
    "amd-epyc-zen5-kvm-avx512bf16-test-machine.txt": ("avx512_bf16", "avx512", 1, 2.596),
    "xeon-platinum-8480c-amx.txt": ("amx_bf16", "avx512", 2, 2.0),
    "xeon-emerald-rapids-kvm-amx.txt": ("amx_bf16", "avx512", 1, 2.4),
    "xeon-silver-4510-kvm-avx512bf16-no-amx.txt": ("avx512_bf16", "avx512", 1, 2.4),
    "xeon-platinum-8272cl-avx512-no-bf16.txt": (None, "avx512", 1, 2.6),
    "xeon-e5-2678v3.txt": (None, "avx2", 1, 2.5),
    "kunpeng920.txt": (None, "neon", 1, None),
}


def recorded(name: str) -> CpuFeatures:
    text = (CPUINFO / name).read_text()
    assert text.startswith("# source: ")
    return parse_cpu_features(text)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_cpuinfo_gives_the_cpus_compute_facts(name: str) -> None:
    native, vector, threads, ghz = RECORDED[name]
    features = recorded(name)
    assert features.native_bf16 == native
    assert features.vector_isa == vector
    assert features.threads_per_core == threads
    assert features.ghz == ghz


def test_only_the_kernels_flags_line_counts_not_vmx_flags_or_a_model_name() -> None:
    # Sapphire Rapids' cpuinfo also has a "vmx flags" line; Intel's model names carry the base clock.
    features = recorded("xeon-platinum-8480c-amx.txt")
    assert "amx_tile" in features.flags and "ept" not in features.flags
    assert parse_cpu_features("") == CpuFeatures(frozenset())
    assert parse_cpu_features("garbage\n\x00 : : :\nflags\t: \n").native_bf16 is None
