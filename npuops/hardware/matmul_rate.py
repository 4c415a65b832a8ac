"""The dense matrix-multiply rate of this host in the CPU engine's dtypes, measured: the roofline of its prefill.

A prefill step is dense matmuls over the prompt's tokens, so its time is the prompt's FLOPs over the rate the
host's math library reaches. No file reports that rate: the CPU's flags name its instructions (AVX512-BF16, AMX)
but not how many of them a core issues a cycle, and two hosts with the same flags differ ~3x. Two KVM guests of the
test machines, both "AMD EPYC" with avx512_bf16: a Zen 4 (family 25) prefilled the small model's prompts at
~160 GFLOP/s in bfloat16, a Zen 5 (family 26, full-width 512-bit units) at ~470, and the flags-based peak
(perf_model.toml [performance.cpu]) gave both 332. So it is measured, like the memory bandwidth
(npuops/hardware/memory_bandwidth.py), once per host, and kept with the node's calibration.

The measurement runs in the serving stack's interpreter (torch's own kernels, oneDNN on x86 and ARM, are what the
CPU engine computes with), with torch's default threads (the CPUs this process may use): a prompt-sized linear layer
(512 tokens x 2048 -> 2048), two warm-up calls, then the best of several rounds. Where the stack has no torch (a
host not yet provisioned), nothing is measured and the plan keeps the flags' peak, saying so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from npuops.hardware.probe import Probe
from npuops.hardware.python_stack import stack_interpreter
from npuops.parsing import ParseError

# The dtypes the CPU engine serves in (npuops/plan/rules: bfloat16 where native, else float32).
DTYPES = ("float32", "bfloat16")
TOKENS, HIDDEN = 512, 2048
ROUNDS, CALLS_PER_ROUND = 5, 3
TIMEOUT_S = 120.0  # importing torch on a busy host, then ~1 s of math

# torch's device backend autoload would import torch_npu on an NPU node, which fails or even breaks `import torch`
# without CANN's environment (vllm-ascend #1440): this measures the CPU only.
#
# Timed by the process's CPU time, not the wall clock: on a host whose cores are busy (another engine, a test
# beside it) the wall clock measures the share the neighbour leaves (half, on the 2-core test machine with two busy
# loops beside it), the CPU time what the cores do while they run the matmul (within 5% of an idle host's). A
# neighbour that itself runs OpenMP threads still costs the all-thread run its barriers (537 of 1023 GFLOP/s there),
# not the one-thread one (508 of 486 x 2): so the rate kept is the better of all threads and one thread's rate times
# the physical cores (SMT siblings share one core's units).
_MEASURE_SCRIPT = """
import json, os, sys, time
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
import torch
tokens, hidden, rounds, calls = (int(a) for a in sys.argv[1:5])
cpus = sorted(os.sched_getaffinity(0))
cores = set()
for cpu in cpus:
    base = "/sys/devices/system/cpu/cpu%d/topology/" % cpu
    try:
        cores.add((open(base + "physical_package_id").read().strip(), open(base + "core_id").read().strip()))
    except OSError:
        cores.add(("cpu", str(cpu)))
flops = 2.0 * tokens * hidden * hidden
def rate(dtype, threads):
    torch.set_num_threads(threads)
    x = torch.randn(tokens, hidden).to(dtype)
    w = torch.randn(hidden, hidden).to(dtype)
    with torch.inference_mode():
        for _ in range(2):
            torch.nn.functional.linear(x, w)
        best = float("inf")
        for _ in range(rounds):
            began = time.process_time()
            for _ in range(calls):
                torch.nn.functional.linear(x, w)
            best = min(best, (time.process_time() - began) / calls)
    return flops / max(best, 1e-9)  # FLOPs a CPU-second
threads = len(cpus)
out = {"torch": torch.__version__, "threads": threads, "cores": len(cores), "shape": [tokens, hidden, hidden],
       "rates": {}, "all_threads": {}, "one_thread": {}}
for name in sys.argv[5:]:
    dtype = getattr(torch, name)
    every, one = rate(dtype, threads), rate(dtype, 1)
    out["all_threads"][name], out["one_thread"][name] = every * threads, one
    out["rates"][name] = max(every * threads, one * len(cores))
print(json.dumps(out))
"""


@dataclass(frozen=True)
class MeasuredMatmul:
    """Dense matmul FLOP/s by dtype on `threads` threads, and what measured them."""

    rates: dict[str, float]  # dtype -> FLOP/s
    threads: int
    how: str
    at: float  # when (seconds since the epoch)

    def rate(self, dtype: str, cpus: int) -> float | None:
        """The rate on `cpus` CPUs (a share of the host, as a prefill/decode pool's engine gets): the measured one
        scaled by the CPUs (a GEMM's rate grows with its threads: 470 and 940 GFLOP/s on 1 and 2 cores here)."""
        rate = self.rates.get(dtype)
        return rate * cpus / self.threads if rate is not None else None

    def describe(self, dtype: str) -> str:
        when = time.strftime("%Y-%m-%d", time.localtime(self.at))
        return f"{self.rates[dtype] / 1e9:.0f} GFLOP/s measured on this host {when} ({self.how})"

    def to_json(self) -> dict[str, Any]:
        return {"rates": dict(self.rates), "threads": self.threads, "how": self.how, "at": self.at}

    @classmethod
    def from_json(cls, data: Any) -> MeasuredMatmul:
        """What the calibration store kept (npuops/plan/calibration.py); ValueError/KeyError/TypeError if not."""
        rates = {str(k): float(v) for k, v in data["rates"].items()}
        threads = int(data["threads"])
        if threads < 1 or any(k not in DTYPES or not v > 0 for k, v in rates.items()):
            raise ValueError(f"matmul rates {rates} on {threads} threads are not a measurement")
        return cls(rates, threads, str(data["how"]), float(data["at"]))


def parse_measurement(text: str, at: float) -> MeasuredMatmul:
    """The measuring script's JSON line, measured at `at` (pure)."""
    lines = text.strip().splitlines()
    try:
        data: Any = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        raise ParseError("matmul measurement", "output is not the expected JSON line", 1, text[:200]) from None
    if not isinstance(data, dict) or not isinstance(data.get("rates"), dict):
        raise ParseError("matmul measurement", "JSON lacks a rates object")
    threads = data.get("threads")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ParseError("matmul measurement", f"threads {threads!r} is not a positive integer")
    rates: dict[str, float] = {}
    for dtype, rate in data["rates"].items():
        if dtype not in DTYPES or not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
            raise ParseError("matmul measurement", f"rate {dtype!r}: {rate!r} is not a positive FLOP/s of a CPU dtype")
        rates[dtype] = float(rate)
    version = data.get("torch")
    torch = f"torch {version}" if isinstance(version, str) else "torch"
    cores = data.get("cores")
    per_core = (f", or one thread x {cores} core{'s' * (cores > 1)}"
                if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0 else "")
    return MeasuredMatmul(rates, threads, f"{torch} linear {TOKENS}x{HIDDEN}->{HIDDEN} by CPU time: {threads} "
                                          f"thread{'s' * (threads > 1)}{per_core}, best of {ROUNDS}", at)


@dataclass(frozen=True)
class MatmulOutcome:
    """A measurement, or why there is none (the stack has no torch, the script failed)."""

    measured: MeasuredMatmul | None
    why_not: str | None


def measure_matmul_rates(probe: Probe) -> MatmulOutcome:
    """Measure in the serving stack's interpreter (npuops/hardware/python_stack.py picks it)."""
    python = stack_interpreter(probe)
    result = probe.run(python, "-I", "-c", _MEASURE_SCRIPT, str(TOKENS), str(HIDDEN), str(ROUNDS),
                       str(CALLS_PER_ROUND), *DTYPES, timeout=TIMEOUT_S)
    if not result.ok:
        last = (result.stderr.strip().splitlines() or [""])[-1]
        why = ("the serving stack has no torch" if "No module named 'torch'" in result.stderr
               else f"{python} could not time a matmul ({last[:120] or result.error or f'exit {result.returncode}'})")
        return MatmulOutcome(None, why)
    try:
        return MatmulOutcome(parse_measurement(result.stdout, time.time()), None)
    except ParseError as exc:
        return MatmulOutcome(None, str(exc))
