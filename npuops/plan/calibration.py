"""Calibration: what `npuops bench` measured corrects the performance model for that node and stack.

The model's constants (npuops/data/perf_model.toml) are shared by every node; a real node differs from them by
its host CPU, its driver and its stack. A bench stores a sample — the configuration and load it measured (the
instance's PerfInputs), the uncalibrated prediction for it, and the measured median TTFT and TPOT — in
`<state_dir>/calibration.json` under the node's hardware label and its stack (vllm, vllm-ascend, torch,
torch_npu versions). A later plan for the same hardware and stack scales the two parts of the model a bench can
see apart, TTFT (request overhead and prefill) and the decode step, by the geometric mean of measured/predicted
over the stored samples; throughput and end-to-end latency follow from them through the same load model.

The geometric mean keeps one odd bench from dominating and treats a 2x too slow and a 2x too fast alike. Only the
newest samples per node and stack are kept (a tune stores one per trial), so an old stack's benches age out.

The same file keeps a CPU host's measured memory bandwidth (the roofline a bench sets its decode step against)
and its dense matmul rate by dtype (the prefill's), each measured once by the first plan or bench of the host.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError
from npuops.hardware.matmul_rate import MeasuredMatmul
from npuops.plan.performance import CalibrationFactors, PerfInputs, predict

CALIBRATION_FILE = "calibration.json"
MAX_SAMPLES = 20  # per hardware and stack
# Only the components that change what a node computes: a new npuops release does not.
STACK_COMPONENTS = ("vllm", "vllm_ascend", "torch", "torch_npu")


def stack_key(versions: dict[str, str | None]) -> dict[str, str | None]:
    return {component: versions.get(component) for component in STACK_COMPONENTS}


def describe_stack(stack: dict[str, str | None]) -> str:
    return ", ".join(f"{k} {v}" for k, v in stack.items() if v) or "no stack versions"


@dataclass(frozen=True)
class CalibrationSample:
    """One bench: what ran under which load, and what it measured (median figures)."""

    hardware: str  # the target's label, e.g. "910B3x8" or "cpu (2 CPUs, 23 GiB RAM, 1 NUMA)"
    stack: dict[str, str | None]
    model: str
    perf: PerfInputs  # the configuration and the bench's load
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float
    at: float

    def ratios(self) -> tuple[float, float]:
        """measured / uncalibrated prediction, for TTFT and the decode step."""
        predicted = predict(self.perf)
        return self.ttft_ms / predicted.ttft_ms, self.tpot_ms / predicted.tpot_ms

    def throughput_ratio(self, factors: CalibrationFactors) -> float:
        """measured / predicted throughput once TTFT and the step are calibrated by `factors`."""
        predicted = predict(self.perf, factors=factors).output_tokens_per_s
        return self.output_tokens_per_s / predicted if predicted > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "stack": self.stack, "model": self.model, "perf": self.perf.to_json(),
                "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "output_tokens_per_s": self.output_tokens_per_s,
                "at": self.at}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CalibrationSample:
        return cls(hardware=str(data["hardware"]), stack=dict(data["stack"]), model=str(data["model"]),
                   perf=PerfInputs.from_json(data["perf"]), ttft_ms=float(data["ttft_ms"]),
                   tpot_ms=float(data["tpot_ms"]), output_tokens_per_s=float(data["output_tokens_per_s"]),
                   at=float(data["at"]))


HOST_BANDWIDTH_KEY = "host_memory_bandwidth"
HOST_MATMUL_KEY = "host_matmul_rate"


@dataclass(frozen=True)
class HostBandwidth:
    """A CPU host's memory bandwidth as measured once (npuops/hardware/memory_bandwidth.py), kept by its label."""

    bytes_per_s: float
    how: str  # what measured it
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"bytes_per_s": self.bytes_per_s, "how": self.how, "at": self.at}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostBandwidth:
        value = float(data["bytes_per_s"])
        if not value > 0:
            raise ValueError(f"bandwidth {value} is not positive")
        return cls(value, str(data["how"]), float(data["at"]))

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d", time.localtime(self.at))
        return f"{self.bytes_per_s / 1e9:.1f} GB/s measured on this host {when} ({self.how})"


@dataclass(frozen=True)
class NodeCalibration:
    """The correction a plan applies on one hardware and stack, and what it was fitted from."""

    hardware: str
    stack: dict[str, str | None]
    factors: CalibrationFactors
    samples: int
    models: tuple[str, ...]
    newest: float

    def as_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "stack": self.stack,
                "ttft_factor": round(self.factors.ttft, 4),
                "step_factor": round(self.factors.step, 4),
                "throughput_factor": round(self.factors.throughput, 4), "samples": self.samples,
                "models": list(self.models), "newest": self.newest}

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.newest))
        benches = f"{self.samples} bench{'es' if self.samples != 1 else ''}"
        return (f"TTFT x{self.factors.ttft:.2f}, decode step x{self.factors.step:.2f}, closed-loop throughput "
                f"x{self.factors.throughput:.2f} from {benches} on "
                f"{self.hardware} ({describe_stack(self.stack)}; {', '.join(self.models)}; newest {when})")


@dataclass(frozen=True)
class CalibrationChoice:
    """Whether a plan is calibrated, and why (what `npuops plan` explains as `calibration`)."""

    applied: NodeCalibration | None
    why: str

    @property
    def factors(self) -> CalibrationFactors | None:
        return self.applied.factors if self.applied is not None else None


UNCALIBRATED = CalibrationChoice(None, "no bench of this node stored: the model's shared constants")


def fit(samples: list[CalibrationSample]) -> CalibrationFactors:
    """Geometric means of measured/predicted over the samples (a sample without a positive TTFT and TPOT, which
    no bench stores since it checks its stream, says nothing and is left out)."""
    samples = [s for s in samples if s.ttft_ms > 0 and s.tpot_ms > 0]
    if not samples:
        return CalibrationFactors()
    def geometric_mean(values: list[float]) -> float:
        return math.exp(sum(math.log(v) for v in values) / len(values))

    ratios = [s.ratios() for s in samples]
    latencies = CalibrationFactors(ttft=geometric_mean([r[0] for r in ratios]),
                                   step=geometric_mean([r[1] for r in ratios]))
    # Throughput last: what is left once the latencies are right.
    closed_loop = [s.throughput_ratio(latencies) for s in samples if s.perf.request_rate is None]
    return replace(latencies, throughput=geometric_mean(closed_loop) if closed_loop else 1.0)


class CalibrationStore:
    """`<state_dir>/calibration.json`: the samples of every hardware and stack this node has benched."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / CALIBRATION_FILE

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"samples": []}
        except OSError as exc:
            raise BadInputError(f"cannot read {self.path}: {exc.strerror}", "check its permissions") from None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get(HOST_BANDWIDTH_KEY, {}), dict):
                raise TypeError("not an object of samples and host bandwidths")
            return data
        except (ValueError, TypeError) as exc:
            raise self._not_ours(exc) from None

    def _not_ours(self, exc: Exception) -> BadInputError:
        return BadInputError(f"{self.path} is not a calibration file npuops wrote ({exc})",
                             "delete it (the next bench writes a new one) or plan with --no-calibration")

    def _write(self, data: dict[str, Any]) -> None:
        write_text_atomic(self.path, json.dumps(data, indent=1) + "\n", mode=0o644)

    def samples(self) -> list[CalibrationSample]:
        try:
            return [CalibrationSample.from_json(item) for item in self._read()["samples"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self._not_ours(exc) from None

    def add(self, sample: CalibrationSample) -> NodeCalibration:
        """Store a sample (keeping the newest MAX_SAMPLES of its hardware and stack) and return the new fit."""
        data = self._read()
        kept = self.samples()
        same = [s for s in kept if s.hardware == sample.hardware and s.stack == sample.stack]
        others = [s for s in kept if s not in same]
        same = [*same, sample][-MAX_SAMPLES:]
        self._write({**data, "samples": [s.to_json() for s in others + same]})
        calibration = self.for_node(sample.hardware, sample.stack)
        assert calibration is not None
        return calibration

    def host_bandwidth(self, hardware: str) -> HostBandwidth | None:
        """The memory bandwidth measured on this CPU host (its roofline), when it was."""
        entry = self._read().get(HOST_BANDWIDTH_KEY, {}).get(hardware)
        try:
            return HostBandwidth.from_json(entry) if entry is not None else None
        except (KeyError, TypeError, ValueError) as exc:
            raise self._not_ours(exc) from None

    def keep_host_bandwidth(self, hardware: str, measured: HostBandwidth) -> None:
        data = self._read()
        self._write({**data, HOST_BANDWIDTH_KEY: {**data.get(HOST_BANDWIDTH_KEY, {}), hardware: measured.to_json()}})

    def host_matmul(self, hardware: str) -> MeasuredMatmul | None:
        """The dense matmul rates measured on this CPU host (its prefill's roofline), when they were."""
        entry = self._read().get(HOST_MATMUL_KEY, {}).get(hardware)
        try:
            return MeasuredMatmul.from_json(entry) if entry is not None else None
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise self._not_ours(exc) from None

    def keep_host_matmul(self, hardware: str, measured: MeasuredMatmul) -> None:
        data = self._read()
        self._write({**data, HOST_MATMUL_KEY: {**data.get(HOST_MATMUL_KEY, {}), hardware: measured.to_json()}})

    def hardware_benched(self, hardware: str) -> bool:
        return any(s.hardware == hardware for s in self.samples())

    def for_node(self, hardware: str, stack: dict[str, str | None]) -> NodeCalibration | None:
        same = [s for s in self.samples() if s.hardware == hardware and s.stack == stack_key(stack)]
        if not same:
            return None
        return NodeCalibration(hardware=hardware, stack=stack_key(stack), factors=fit(same), samples=len(same),
                               models=tuple(dict.fromkeys(s.model for s in same)), newest=max(s.at for s in same))

    def choose(self, hardware: str, stack: dict[str, str | None] | None) -> CalibrationChoice:
        """The calibration of `hardware` with `stack`, or why none applies."""
        if not self.hardware_benched(hardware):
            return CalibrationChoice(None, f"no bench of {hardware} stored in {self.path}: the model's shared "
                                           "constants (`npuops bench NAME` on this node calibrates it)")
        found = self.for_node(hardware, stack or {})
        if found is None:
            others = "; ".join(describe_stack(s) for s in self.other_stacks(hardware))
            return CalibrationChoice(None, f"benched on other stacks only ({others}), not on this one "
                                           f"({describe_stack(stack_key(stack or {}))}): not applied")
        return CalibrationChoice(found, f"{found.describe()}; --no-calibration ignores it")

    def other_stacks(self, hardware: str) -> list[dict[str, str | None]]:
        """Stacks this hardware was benched with (to say why a calibration does not apply)."""
        seen: list[dict[str, str | None]] = []
        for s in self.samples():
            if s.hardware == hardware and s.stack not in seen:
                seen.append(s.stack)
        return seen
