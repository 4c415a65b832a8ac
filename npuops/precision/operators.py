"""Operator precision, the parent side: run the suite (op_suite.py) in the stack's interpreter, parse, judge.

No torch here: the suite's source text goes to the serving interpreter in a subprocess (torch lives there, and
torch_npu can take a process down with it), its JSON comes back, a pure parser turns it into `OpResult`s, and a pure
`judge` holds them against the tolerances in npuops/data/precision_tolerances.toml.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.hardware.chips import chip_catalog
from npuops.hardware.probe import RC_NOT_EXECUTABLE, CommandResult, CommandRunner
from npuops.parsing import ParseError

SUITE_PATH = Path(__file__).with_name("op_suite.py")
# The op names and dtypes the suite knows (op_suite.OPS / DTYPES; that file is a script, not imported here).
OPS = ("matmul", "bmm", "softmax", "layer_norm", "rms_norm", "rotary", "sdpa", "silu", "gelu")
DTYPES = ("bfloat16", "float16")
DEVICES = ("cpu", "npu")


@lru_cache(maxsize=1)
def suite_source() -> str:
    """The text of op_suite.py, shipped in the package beside this module."""
    return SUITE_PATH.read_text(encoding="utf-8")


# --- the suite's config and output ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpSuiteConfig:
    device: str = "cpu"
    dtypes: tuple[str, ...] = DTYPES
    ops: tuple[str, ...] | None = None  # None: all
    size: str | None = None  # None: small on the CPU, full on an NPU
    seed: int = 0
    device_index: int = 0
    threads: int | None = None  # torch's CPU threads (the float64 reference runs on them)
    inject: str | None = None  # "<op>:<fault>", the self-test's wrong kernel; never set by a normal run

    def to_json(self) -> str:
        return json.dumps({"device": self.device, "dtypes": list(self.dtypes),
                           "ops": list(self.ops) if self.ops else None, "size": self.size, "seed": self.seed,
                           "device_index": self.device_index, "threads": self.threads, "inject": self.inject})


@dataclass(frozen=True)
class OpResult:
    """One op in one dtype against its float64 reference. Error metrics are None when the output had
    non-finite values (counted in `nonfinite`)."""

    op: str
    dtype: str
    impl: str
    shape: tuple[int, ...]
    elements: int
    max_abs_err: float | None
    max_rel_err: float | None
    cosine: float | None
    ref_max_abs: float
    normalized_err: float | None
    nonfinite: int
    seconds: float
    injected: str | None = None
    dims: Mapping[str, int] = field(default_factory=dict)  # the op's sizes by name, e.g. {"tokens": 128, "in": 4096}

    @property
    def one_minus_cosine(self) -> float | None:
        return None if self.cosine is None else 1.0 - self.cosine


@dataclass(frozen=True)
class OpError:
    """An op that raised instead of returning (an unsupported dtype, a kernel error)."""

    op: str
    dtype: str
    error: str


@dataclass(frozen=True)
class SuiteFatal:
    """The suite could not start: stage is "config", "import torch", "import torch_npu" or "open npu"."""

    stage: str
    error: str


@dataclass(frozen=True)
class OpSuiteOutput:
    torch: str | None = None
    torch_npu: str | None = None
    device: str | None = None
    device_name: str | None = None
    size: str | None = None
    threads: int | None = None
    inject: str | None = None
    results: tuple[OpResult, ...] = ()
    errors: tuple[OpError, ...] = ()
    fatal: SuiteFatal | None = None


_WHAT = "operator precision suite output"


def _suite_line(text: str) -> tuple[int, dict[str, Any]]:
    """The last line that is the suite's document (it starts with '{"suite"'): torch, torch_npu and CANN may print
    warnings on stdout before or after it."""
    if not isinstance(text, str):
        raise ParseError(_WHAT, f"expected text, got {type(text).__name__}")
    lines = text.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index].strip()
        if not line.startswith('{"suite"'):
            continue
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise ParseError(_WHAT, f"the suite's line is not JSON ({exc.__class__.__name__})", index + 1,
                             line) from None
        if not isinstance(data, dict):  # pragma: no cover - a line starting with '{' that parses is an object
            raise ParseError(_WHAT, "the suite's line is not a JSON object", index + 1, line)
        return index + 1, data
    last = next(((i + 1, line) for i, line in reversed(list(enumerate(lines))) if line.strip()), None)
    if last is None:
        raise ParseError(_WHAT, "empty output")
    raise ParseError(_WHAT, "no line with the suite's JSON document", last[0], last[1])


def _field(entry: Mapping[str, Any], name: str, kind: type | tuple[type, ...], line_no: int, line: str,
           optional: bool = False) -> Any:
    value = entry.get(name)
    if value is None and optional:
        return None
    # bool is an int to Python, never a number here; JSON's NaN/Infinity are not numbers the suite writes.
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ParseError(_WHAT, f"result field {name!r} is {value!r}", line_no, line)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            finite = math.isfinite(float(value))
        except OverflowError:  # an int beyond float's range
            finite = False
        if not finite:
            raise ParseError(_WHAT, f"result field {name!r} is not a finite number", line_no, line)
    return value


def _optional_str(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    return value if isinstance(value, str) else None


def parse_op_suite_output(text: str) -> OpSuiteOutput:
    """The suite's JSON document (its line on stdout) as typed results; ParseError on anything else.

    Returns the whole document rather than only the results: the check also reports the torch version, the
    device and the ops that raised, and a fatal start-up error is an answer too ("torch does not import").
    """
    line_no, data = _suite_line(text)
    line = text.splitlines()[line_no - 1]
    if data.get("suite") != 1:
        raise ParseError(_WHAT, f"unknown suite format {data.get('suite')!r}", line_no, line)
    fatal = data.get("fatal")
    if fatal is not None:
        if not isinstance(fatal, dict) or not isinstance(fatal.get("stage"), str) \
                or not isinstance(fatal.get("error"), str):
            raise ParseError(_WHAT, "fatal is not {stage, error}", line_no, line)
        return OpSuiteOutput(fatal=SuiteFatal(fatal["stage"], fatal["error"]))
    raw_results, raw_errors = data.get("results"), data.get("errors")
    if not isinstance(raw_results, list) or not isinstance(raw_errors, list):
        raise ParseError(_WHAT, "the document lacks the results and errors lists", line_no, line)
    number = (int, float)
    results: list[OpResult] = []
    for entry in raw_results:
        if not isinstance(entry, dict):
            raise ParseError(_WHAT, "a result is not an object", line_no, line)
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
            raise ParseError(_WHAT, f"result shape is {shape!r}", line_no, line)
        op = _field(entry, "op", str, line_no, line)
        dtype = _field(entry, "dtype", str, line_no, line)
        nonfinite = _field(entry, "nonfinite", int, line_no, line)
        metrics = {name: _field(entry, name, number, line_no, line, optional=True)
                   for name in ("max_abs_err", "max_rel_err", "cosine", "normalized_err")}
        if nonfinite == 0 and any(v is None for v in metrics.values()):
            raise ParseError(_WHAT, f"{op}/{dtype} lacks a metric but has no non-finite output", line_no, line)
        injected = entry.get("injected")
        dims = entry.get("dims", {})
        if not isinstance(dims, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in dims.values()):
            raise ParseError(_WHAT, f"result dims is {dims!r}", line_no, line)
        results.append(OpResult(
            op=op, dtype=dtype, impl=str(entry.get("impl") or ""), shape=tuple(shape),
            elements=_field(entry, "elements", int, line_no, line),
            max_abs_err=_float(metrics["max_abs_err"]), max_rel_err=_float(metrics["max_rel_err"]),
            cosine=_float(metrics["cosine"]), ref_max_abs=float(_field(entry, "ref_max_abs", number, line_no, line)),
            normalized_err=_float(metrics["normalized_err"]), nonfinite=nonfinite,
            seconds=float(_field(entry, "seconds", number, line_no, line)),
            injected=injected if isinstance(injected, str) else None, dims={str(k): v for k, v in dims.items()}))
    errors: list[OpError] = []
    for entry in raw_errors:
        if not isinstance(entry, dict):
            raise ParseError(_WHAT, "an error entry is not an object", line_no, line)
        errors.append(OpError(_field(entry, "op", str, line_no, line), _field(entry, "dtype", str, line_no, line),
                              _field(entry, "error", str, line_no, line)))
    threads = data.get("threads")
    return OpSuiteOutput(
        torch=_optional_str(data, "torch"), torch_npu=_optional_str(data, "torch_npu"),
        device=_optional_str(data, "device"), device_name=_optional_str(data, "device_name"),
        size=_optional_str(data, "size"), threads=threads if isinstance(threads, int) else None,
        inject=_optional_str(data, "inject"), results=tuple(results), errors=tuple(errors))


def _float(value: int | float | None) -> float | None:
    return None if value is None else float(value)


# --- running the suite ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpSuiteRun:
    """What running the suite gave: the command's result, and its parsed output when it printed one."""

    command: CommandResult
    output: OpSuiteOutput | None = None
    parse_error: str | None = None

    @property
    def fatal(self) -> SuiteFatal | None:
        return self.output.fatal if self.output is not None else None

    def stderr_tail(self, lines: int = 5) -> str:
        return "\n".join(self.command.stderr.strip().splitlines()[-lines:])


def run_op_suite(runner: CommandRunner, python: str, config: OpSuiteConfig, *, timeout: float,
                 env: Mapping[str, str] | None = None) -> OpSuiteRun:
    """Run the suite in `python` (`python -c <source> <config>`); never raises.

    Not `-I`: CANN's set_env.sh puts its Python packages (te, tbe: torch_npu compiles operators with them) on
    PYTHONPATH, and the engine runs with it. The suite drops the working directory from sys.path itself.
    """
    argv = (python, "-c", suite_source(), config.to_json())
    try:
        result = runner.run(argv, timeout=timeout, env=env)
    except Exception as exc:  # noqa: BLE001 - the boundary promises never to raise
        result = CommandResult(argv, RC_NOT_EXECUTABLE, "", "", 0.0, f"runner failed: {exc!r}")
    if result.error is not None or not result.stdout.strip():
        return OpSuiteRun(result)
    try:
        return OpSuiteRun(result, parse_op_suite_output(result.stdout))
    except ParseError as exc:
        return OpSuiteRun(result, parse_error=str(exc))


def dtypes_for(device: str, chip_family: str | None) -> tuple[str, ...]:
    """The dtypes to test: what the chip family computes in (chips.toml's bf16 flag: A2 and A3 have bfloat16 and
    float16, 310P and the first-generation 910 "A1" only float16). An unknown family gets float16, which every
    Ascend chip has; the CPU gets both."""
    if device == "cpu":
        return DTYPES
    specs = [spec for spec in chip_catalog().values() if spec.family == chip_family]
    if specs and all(spec.bf16 for spec in specs):
        return DTYPES
    return ("float16",)


# --- tolerances and the verdict ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """The most error a correct kernel of one op in one dtype shows (see precision_tolerances.toml)."""

    normalized_err: float
    one_minus_cosine: float
    max_rel_err: float | None = None  # only where elements cannot cancel


Tolerances = Mapping[tuple[str, str], Bound]  # (dtype, op) -> bound


def parse_tolerances(data: Mapping[str, Any]) -> dict[tuple[str, str], Bound]:
    """precision_tolerances.toml's parsed TOML: [<dtype>.<op>] tables of bounds."""
    bounds: dict[tuple[str, str], Bound] = {}
    for dtype in DTYPES:
        for op, raw in data.get(dtype, {}).items():
            rel = raw.get("max_rel_err")
            bounds[(dtype, op)] = Bound(float(raw["normalized_err"]), float(raw["one_minus_cosine"]),
                                        float(rel) if rel is not None else None)
    return bounds


@lru_cache(maxsize=1)
def load_tolerances() -> dict[tuple[str, str], Bound]:
    return parse_tolerances(load_data_toml("precision_tolerances.toml"))


PASS, FAIL, UNJUDGED = "pass", "fail", "unjudged"


@dataclass(frozen=True)
class OpVerdict:
    result: OpResult
    bound: Bound | None
    verdict: str  # pass, fail, or unjudged (no bound for this op and dtype)
    exceeded: tuple[str, ...] = ()  # e.g. "normalized_err 6.2e-03 > 2.0e-03"
    # The largest metric/bound ratio: 1.0 is at the bound; inf for non-finite output.
    worst_ratio: float = 0.0


def judge(results: Iterable[OpResult], tolerances: Tolerances) -> list[OpVerdict]:
    """Each result against its bound: it fails when any bounded metric is above its bound (equal passes) or
    the output has non-finite values."""
    verdicts: list[OpVerdict] = []
    for r in results:
        bound = tolerances.get((r.dtype, r.op))
        if bound is None:
            verdicts.append(OpVerdict(r, None, UNJUDGED))
            continue
        if r.nonfinite:
            verdicts.append(OpVerdict(r, bound, FAIL, (f"{r.nonfinite} non-finite output values",), math.inf))
            continue
        checks: list[tuple[str, float | None, float | None]] = [
            ("normalized_err", r.normalized_err, bound.normalized_err),
            ("one_minus_cosine", r.one_minus_cosine, bound.one_minus_cosine),
            ("max_rel_err", r.max_rel_err, bound.max_rel_err),
        ]
        exceeded: list[str] = []
        worst = 0.0
        for name, value, limit in checks:
            if value is None or limit is None:
                continue
            ratio = value / limit if limit > 0 else (math.inf if value > 0 else 0.0)
            worst = max(worst, ratio)
            if value > limit:
                exceeded.append(f"{name} {value:.2e} > {limit:.2e}")
        verdicts.append(OpVerdict(r, bound, FAIL if exceeded else PASS, tuple(exceeded), worst))
    return verdicts


def verdict_rows(verdicts: Sequence[OpVerdict]) -> list[dict[str, Any]]:
    """The evidence table: one row per op and dtype, numbers to four significant digits (cosine in full)."""
    rows: list[dict[str, Any]] = []
    for v in verdicts:
        r, b = v.result, v.bound
        rows.append({
            "op": r.op, "dtype": r.dtype, "impl": r.impl, "dims": dict(r.dims), "shape": list(r.shape),
            "max_abs_err": _sig(r.max_abs_err), "max_rel_err": _sig(r.max_rel_err), "cosine": r.cosine,
            "one_minus_cosine": _sig(r.one_minus_cosine), "normalized_err": _sig(r.normalized_err),
            "bound_normalized_err": b.normalized_err if b else None,
            "bound_one_minus_cosine": b.one_minus_cosine if b else None,
            "bound_max_rel_err": b.max_rel_err if b else None,
            "nonfinite": r.nonfinite, "verdict": v.verdict, "exceeded": list(v.exceeded), "seconds": r.seconds,
            **({"injected": r.injected} if r.injected else {}),
        })
    return rows


def _sig(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")
