"""What a host's CPU computes fast: its vector and matrix instruction sets, its cores and its clock. Pure.

vLLM's CPU engine does the model's math in float32 or bfloat16 through oneDNN and its own kernels. Whether
bfloat16 is fast depends on the instructions the CPU has: x86 with AVX512-BF16 (`avx512_bf16`: a dot product of
bfloat16 pairs into float32, twice float32's rate per vector) or AMX (`amx_bf16`: bfloat16 tile multiplies), or
an ARM core with the BF16 extension (`bf16` in /proc/cpuinfo's Features). Without one of them bfloat16 is
converted to float32 around every operation: half the bytes to read, but slower math than float32 itself. The
kernel lists these as flags in /proc/cpuinfo ("flags" on x86, "Features" on ARM), which is all a plan needs: no
tool to run, nothing to measure.

The node model keeps the flags that bear on the engine's math (COMPUTE_FLAGS), the threads per core and the clock;
the performance model turns them into a peak rate (npuops/plan/performance.py, perf_model.toml [performance.cpu]).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The flags that say how fast the engine's matmuls can run; the rest of the kernel's list (~100 on a modern x86)
# says nothing a plan uses. x86: AVX2/FMA, AVX-512 and its bfloat16/fp16/VNNI parts, AMX; ARM: NEON (asimd),
# half-precision arithmetic, SVE, BF16 and the int8 matrix multiply.
COMPUTE_FLAGS = frozenset({
    "fma", "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16",
    "amx_int8", "asimd", "asimdhp", "fphp", "sve", "sve2", "bf16", "svebf16", "i8mm",
})

# The flags that compute bfloat16 natively, strongest first: what a plan names when it picks bfloat16.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")


@dataclass(frozen=True)
class CpuFeatures:
    """The compute-relevant facts of a host's CPU (see the module's docstring)."""

    flags: frozenset[str]
    threads_per_core: int = 1  # SMT: two hardware threads share one core's vector units
    ghz: float | None = None  # the nominal clock, where /proc/cpuinfo says it

    @property
    def native_bf16(self) -> str | None:
        """The flag that makes bfloat16 fast here, or None when bfloat16 would be emulated."""
        return next((flag for flag in NATIVE_BF16_FLAGS if flag in self.flags), None)

    @property
    def vector_isa(self) -> str:
        """The widest vector unit the flags show: "avx512", "avx2", "neon" or "scalar"."""
        if "avx512f" in self.flags:
            return "avx512"
        if "avx2" in self.flags and "fma" in self.flags:
            return "avx2"
        if "asimd" in self.flags:
            return "neon"
        return "scalar"

    def to_json(self) -> dict[str, object]:
        return {"flags": sorted(self.flags), "threads_per_core": self.threads_per_core, "ghz": self.ghz,
                "native_bf16": self.native_bf16, "vector_isa": self.vector_isa}


def _first_value(cpuinfo: str, *keys: str) -> str | None:
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in keys:
            return value.strip()
    return None


def _clock_ghz(cpuinfo: str) -> float | None:
    """The nominal clock: "@ 2.50GHz" in an Intel model name (the base clock, unlike "cpu MHz", which follows the
    governor down when idle), else "cpu MHz" (a VM's and AMD's usual figure); ARM's cpuinfo has neither."""
    model = _first_value(cpuinfo, "model name") or ""
    match = re.search(r"@\s*([0-9.]+)\s*GHz", model)
    if match:
        return float(match.group(1))
    mhz = _first_value(cpuinfo, "cpu MHz")
    try:
        return round(float(mhz) / 1000, 3) if mhz else None
    except ValueError:
        return None


def _threads_per_core(cpuinfo: str) -> int:
    """x86's "siblings" (threads per package) over "cpu cores" (cores per package); 1 where they are absent."""
    siblings, cores = _first_value(cpuinfo, "siblings"), _first_value(cpuinfo, "cpu cores")
    if siblings and cores and siblings.isdigit() and cores.isdigit() and int(cores) > 0:
        return max(1, int(siblings) // int(cores))
    return 1


def parse_cpu_features(cpuinfo: str) -> CpuFeatures:
    """The compute facts of /proc/cpuinfo (its first processor: the kernel lists the boot CPU's flags first, and a
    server's cores are alike). Text without a flags or Features line gives no flags: the engine then plans as for
    a CPU without bfloat16."""
    line = _first_value(cpuinfo, "flags", "Features") or ""
    flags = frozenset(line.split()) & COMPUTE_FLAGS
    return CpuFeatures(flags, _threads_per_core(cpuinfo), _clock_ghz(cpuinfo))
