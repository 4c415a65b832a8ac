"""Operator precision: the suite's output parser, the tolerances and the verdict, the suite on real torch (the
engine venv's CPU torch), and the op-precision check end to end, including proof that a wrong kernel fails it."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.checks.precision_ops import OperatorPrecision, assess
from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Result, Status
from npuops.doctor.registry import discover_checks
from npuops.hardware.probe import RC_NOT_FOUND, RC_TIMEOUT, CommandResult, Probe, SubprocessRunner
from npuops.parsing import ParseError
from npuops.precision import op_suite
from npuops.precision.operators import (
    DTYPES,
    FAIL,
    OPS,
    PASS,
    UNJUDGED,
    Bound,
    OpResult,
    OpSuiteConfig,
    OpSuiteOutput,
    OpSuiteRun,
    dtypes_for,
    judge,
    load_tolerances,
    parse_op_suite_output,
    run_op_suite,
    suite_source,
)
from npuops.settings import Settings
from tests.support.captures import capture
from tests.support.engine import ENGINE_PYTHON_ENV, REQUIRE_ENGINE_ENV
from tests.support.nodes import ROW_0_13, bare_node, make_stack
from tests.support.paths import FIXTURES, REPO

PRECISION_FIXTURES = FIXTURES / "precision"
CORRECT = "op-suite-cpu-torch2.13.json"
FP16_ACCUMULATE = "op-suite-cpu-torch2.13-fp16-accumulate.json"
DEFAULT_ENGINE_PYTHON = Path.home() / ".cache" / "npuops" / "engine-venv" / "bin" / "python"
SUITE_TIMEOUT_S = 600.0  # generous: CI shares the CPU; the suite takes ~10 s on 2 idle cores


def fixture_text(name: str) -> str:
    return (PRECISION_FIXTURES / name).read_text(encoding="utf-8")


def make_result(op: str = "matmul", dtype: str = "float16", *, normalized: float | None = 1e-4,
                one_minus_cos: float | None = 1e-9, rel: float | None = 1e-4, nonfinite: int = 0) -> OpResult:
    return OpResult(op=op, dtype=dtype, impl="test", shape=(2, 2), elements=4, max_abs_err=normalized,
                    max_rel_err=rel, cosine=None if one_minus_cos is None else 1.0 - one_minus_cos,
                    ref_max_abs=1.0, normalized_err=normalized, nonfinite=nonfinite, seconds=0.0)


# --- the real capture ----------------------------------------------------------------------------------------------


def test_parse_the_real_capture() -> None:
    out = parse_op_suite_output(fixture_text(CORRECT))
    assert (out.torch, out.device, out.size, out.fatal, out.errors) == ("2.13.0+cpu", "cpu", "small", None, ())
    assert {(r.op, r.dtype) for r in out.results} == {(op, dtype) for op in OPS for dtype in DTYPES}
    matmul = next(r for r in out.results if (r.op, r.dtype) == ("matmul", "float16"))
    assert matmul.dims == {"tokens": 128, "in": 4096, "out": 4096} and matmul.shape == (128, 4096)
    assert matmul.elements == 128 * 4096 and matmul.nonfinite == 0 and matmul.injected is None
    # One output rounding: the error is about the float16 unit roundoff 2^-11.
    assert matmul.normalized_err is not None and 0.5 * 2**-11 < matmul.normalized_err < 2**-11
    assert matmul.one_minus_cosine is not None and 0 < matmul.one_minus_cosine < 2**-22


def test_correct_kernels_pass_with_the_margin_the_tolerance_file_claims() -> None:
    verdicts = judge(parse_op_suite_output(fixture_text(CORRECT)).results, load_tolerances())
    assert [v.verdict for v in verdicts] == [PASS] * len(OPS) * len(DTYPES)
    # "4-5x above the worst measured value" (precision_tolerances.toml): no metric above a third of its bound.
    assert max(v.worst_ratio for v in verdicts) < 1 / 3


def test_the_captured_fp16_accumulation_fault_fails_matmul_only() -> None:
    out = parse_op_suite_output(fixture_text(FP16_ACCUMULATE))
    assert out.inject == "matmul:fp16-accumulate"
    verdicts = {(v.result.op, v.result.dtype): v for v in judge(out.results, load_tolerances())}
    for dtype in DTYPES:
        failed = verdicts[("matmul", dtype)]
        assert failed.verdict == FAIL and failed.result.injected == "matmul:fp16-accumulate"
        assert any(e.startswith("one_minus_cosine") for e in failed.exceeded)
        assert failed.worst_ratio > 10  # a clear factor, not a near miss
        assert verdicts[("softmax", dtype)].verdict == PASS


# --- the verdict at and around the bounds --------------------------------------------------------------------------


BOUND = Bound(normalized_err=1e-3, one_minus_cosine=1e-7, max_rel_err=2e-3)
TOLERANCES = {("float16", "matmul"): BOUND, ("float16", "rotary"): Bound(1e-3, 1e-7, None)}


def test_a_result_at_its_bounds_passes() -> None:
    at = make_result(normalized=1e-3, one_minus_cos=1e-7, rel=2e-3)
    (verdict,) = judge([at], TOLERANCES)
    assert verdict.verdict == PASS and verdict.exceeded == ()
    assert verdict.worst_ratio == pytest.approx(1.0)


@pytest.mark.parametrize(("field", "metric"), [("normalized", "normalized_err"), ("one_minus_cos", "one_minus_cosine"),
                                                ("rel", "max_rel_err")])
def test_a_result_just_above_one_bound_fails_naming_it(field: str, metric: str) -> None:
    at = {"normalized": 1e-3, "one_minus_cos": 1e-7, "rel": 2e-3}
    at[field] = at[field] * 1.01
    (verdict,) = judge([make_result(**at)], TOLERANCES)  # type: ignore[arg-type]
    assert verdict.verdict == FAIL
    assert len(verdict.exceeded) == 1 and verdict.exceeded[0].startswith(metric + " ")
    assert verdict.worst_ratio == pytest.approx(1.01)


def test_non_finite_output_fails_and_unknown_ops_are_unjudged() -> None:
    broken = make_result(normalized=None, one_minus_cos=None, rel=None, nonfinite=7)
    unknown = make_result(op="conv2d")
    verdicts = judge([broken, unknown], TOLERANCES)
    assert verdicts[0].verdict == FAIL and verdicts[0].exceeded == ("7 non-finite output values",)
    assert math.isinf(verdicts[0].worst_ratio)
    assert verdicts[1].verdict == UNJUDGED and verdicts[1].bound is None


def test_max_rel_err_is_not_judged_where_the_file_gives_no_bound() -> None:
    # rotary's x1*cos - x2*sin cancels: a large relative error near zero is no fault.
    (verdict,) = judge([make_result(op="rotary", rel=500.0)], TOLERANCES)
    assert verdict.verdict == PASS


def test_the_tolerance_file_covers_every_op_and_dtype_and_scales_with_u() -> None:
    tolerances = load_tolerances()
    assert set(tolerances) == {(dtype, op) for dtype in DTYPES for op in OPS}
    for op in OPS:
        fp16, bf16 = tolerances[("float16", op)], tolerances[("bfloat16", op)]
        # Derived in units of u (2^-11 vs 2^-8): the same multiple for both dtypes.
        assert bf16.normalized_err == pytest.approx(8 * fp16.normalized_err)
        assert bf16.one_minus_cosine == pytest.approx(64 * fp16.one_minus_cosine)
        assert (bf16.max_rel_err is None) == (fp16.max_rel_err is None)
        assert 4 * 2**-11 <= fp16.normalized_err <= 8 * 2**-11
    for op in ("layer_norm", "rotary", "sdpa"):
        assert tolerances[("float16", op)].max_rel_err is None


# --- the parser on garbage -----------------------------------------------------------------------------------------


def _doc(**overrides: object) -> str:
    data = json.loads(fixture_text(CORRECT))
    data.update(overrides)
    return json.dumps(data)


def _with_result(**fields: object) -> str:
    data = json.loads(fixture_text(CORRECT))
    data["results"][0].update(fields)
    return json.dumps(data)


@pytest.mark.parametrize("text", [
    "", "\n  \n", "Traceback (most recent call last):\n  File ...", "[1, 2]", "{not json", '"a string"',
    '{"suite": 2, "results": [], "errors": []}', '{"results": [], "errors": []}',
    '{"suite": 1, "fatal": "import torch"}', '{"suite": 1, "results": {}, "errors": []}',
    _doc(errors=[{"op": "matmul"}]), _doc(results=[1]),
    _with_result(max_abs_err="0.1"), _with_result(shape=[128, True]), _with_result(shape="128x4096"),
    _with_result(cosine=None), _with_result(nonfinite=False), _with_result(dims={"tokens": "128"}),
    _with_result(elements=1.5), _with_result(op=None),
    _with_result(max_abs_err=float("nan")), _with_result(normalized_err=float("inf")),
    _with_result(seconds=10**400), fixture_text(CORRECT)[:-40] + "\n",
])
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="operator precision suite output"):
        parse_op_suite_output(text)


def test_noise_around_the_json_line_is_ignored_and_fatal_is_an_answer() -> None:
    out = parse_op_suite_output("/opt/venv/lib/python3.11/site-packages/torch/warning: something\n"
                                + fixture_text(CORRECT) + "[W compiler_depend.ts:123] Warning: at exit\n")
    assert len(out.results) == 18
    fatal = parse_op_suite_output('{"suite": 1, "fatal": {"stage": "import torch", "error": "No module"}}\n')
    assert fatal.fatal is not None and fatal.fatal.stage == "import torch" and fatal.results == ()


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _total(text: str) -> None:
    try:
        out = parse_op_suite_output(text)
    except ParseError:
        return
    assert isinstance(out, OpSuiteOutput)


@FUZZ
@given(text=st.text())
def test_parse_is_total_on_any_text(text: str) -> None:
    _total(text)


@st.composite
def mutated_capture(draw: st.DrawFn) -> str:
    text = fixture_text(CORRECT)
    for _ in range(draw(st.integers(1, 5))):
        start = draw(st.integers(0, len(text) - 1))
        end = draw(st.integers(start, min(len(text), start + 20)))
        text = text[:start] + draw(st.text(alphabet='{}[]":,.-0123456789eE nulltrue', max_size=8)) + text[end:]
    return text


@FUZZ
@given(text=mutated_capture())
def test_parse_is_total_on_mutated_captures(text: str) -> None:
    _total(text)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                      max_size=3), max_leaves=8)


@FUZZ
@given(key=st.sampled_from(["op", "dtype", "impl", "shape", "dims", "elements", "max_abs_err", "max_rel_err",
                            "cosine", "ref_max_abs", "normalized_err", "nonfinite", "seconds", "injected"]),
       value=JSON_VALUES)
def test_parse_is_total_on_any_value_of_a_result_field(key: str, value: object) -> None:
    _total(_with_result(**{key: value}))


# --- dtypes per chip family, and the suite's own config ------------------------------------------------------------


@pytest.mark.parametrize(("device", "family", "dtypes"), [
    ("cpu", None, ("bfloat16", "float16")), ("npu", "A2", ("bfloat16", "float16")),
    ("npu", "A3", ("bfloat16", "float16")), ("npu", "310P", ("float16",)), ("npu", "A1", ("float16",)),
    ("npu", None, ("float16",)), ("npu", "A5", ("float16",)),
])
def test_dtypes_for(device: str, family: str | None, dtypes: tuple[str, ...]) -> None:
    assert dtypes_for(device, family) == dtypes


def test_the_parent_and_the_suite_agree_on_ops_and_dtypes() -> None:
    assert op_suite.OPS == OPS and op_suite.DTYPES == DTYPES
    assert set(op_suite.SHAPES["small"]) == set(op_suite.SHAPES["full"]) == set(OPS) == set(op_suite.DIMS)
    assert suite_source().startswith('"""The operator precision suite')


@pytest.mark.parametrize(("config", "problem"), [
    ("nope", "not JSON"), ("[]", "not a JSON object"), ('{"device": "cuda"}', "unknown device"),
    ('{"dtypes": ["float8"]}', "unknown dtype"), ('{"ops": ["conv"]}', "unknown op"),
    ('{"size": "huge"}', "unknown size"), ('{"inject": "softmax:perturb"}', "unknown fault"),
    ('{"threads": 0}', "threads"),
])
def test_the_suite_refuses_a_bad_config(config: str, problem: str) -> None:
    with pytest.raises(op_suite.ConfigError, match=problem):
        op_suite.read_config(config)


def test_the_suite_defaults_small_on_the_cpu_and_full_on_an_npu() -> None:
    assert op_suite.read_config("{}")["size"] == "small"
    assert op_suite.read_config('{"device": "npu"}')["size"] == "full"
    assert op_suite.read_config("{}")["ops"] == list(OPS)


def test_the_suite_reports_a_bad_config_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert op_suite.main(['{"device": "tpu"}']) == 2
    out = parse_op_suite_output(capsys.readouterr().out)
    assert out.fatal is not None and out.fatal.stage == "config" and "tpu" in out.fatal.error


# --- running the suite never raises --------------------------------------------------------------------------------


class _Runner:
    def __init__(self, result: CommandResult | None = None, raises: Exception | None = None) -> None:
        self.result, self.raises = result, raises
        self.argv: tuple[str, ...] = ()

    def run(self, argv: Sequence[str], *, timeout: float, env: object = None) -> CommandResult:
        self.argv = tuple(argv)
        if self.raises is not None:
            raise self.raises
        assert self.result is not None
        return self.result


def test_run_op_suite_sends_the_source_and_the_config() -> None:
    runner = _Runner(CommandResult((), 0, fixture_text(CORRECT), "", 1.0))
    run = run_op_suite(runner, "/venv/bin/python", OpSuiteConfig(dtypes=("float16",), ops=("matmul",)), timeout=5)
    assert runner.argv[:2] == ("/venv/bin/python", "-c") and runner.argv[2] == suite_source()
    assert json.loads(runner.argv[3])["ops"] == ["matmul"] and json.loads(runner.argv[3])["inject"] is None
    assert run.output is not None and len(run.output.results) == 18


@pytest.mark.parametrize("runner", [
    _Runner(raises=OSError("boom")),
    _Runner(CommandResult((), RC_TIMEOUT, "", "", 5.0, "timed out after 5 s")),
    _Runner(CommandResult((), 0, "Segmentation fault\n", "", 1.0)),
    _Runner(CommandResult((), -11, "", "Fatal Python error: Segmentation fault", 1.0)),
])
def test_run_op_suite_never_raises(runner: _Runner) -> None:
    run = run_op_suite(runner, "python", OpSuiteConfig(), timeout=5)
    assert run.output is None


# --- the check's verdict on a run (no subprocess) ------------------------------------------------------------------


def _assess(stdout: str = "", *, rc: int = 0, error: str | None = None, stderr: str = "",
            device: str = "cpu", inject: str | None = None) -> Result:
    command = CommandResult(("python",), rc, stdout, stderr, 3.0, error)
    try:
        run = OpSuiteRun(command, parse_op_suite_output(stdout)) if stdout else OpSuiteRun(command)
    except ParseError as exc:
        run = OpSuiteRun(command, parse_error=str(exc))
    evidence: dict[str, object] = {"python": "/venv/bin/python", "timeout_s": 300.0}
    if inject:
        evidence["inject"] = inject
    return assess(run, device, evidence)


def test_assess_passes_the_real_capture_with_the_table() -> None:
    result = _assess(fixture_text(CORRECT))
    assert result.status is Status.PASS
    table = result.evidence["table"]
    assert len(table) == 18 and {row["verdict"] for row in table} == {"pass"}
    assert len({row["op"] for row in table}) == 9 and {row["dtype"] for row in table} == {"bfloat16", "float16"}
    assert set(table[0]) >= {"op", "dtype", "max_abs_err", "max_rel_err", "cosine", "normalized_err",
                             "bound_normalized_err", "bound_one_minus_cosine", "verdict"}
    assert result.evidence["torch"] == "2.13.0+cpu"


def test_assess_fails_the_captured_fault_naming_the_worst_op() -> None:
    result = _assess(fixture_text(FP16_ACCUMULATE), inject="matmul:fp16-accumulate")
    assert result.status is Status.FAIL and result.evidence["inject"] == "matmul:fp16-accumulate"
    verdicts = [(row["op"], row["verdict"]) for row in result.evidence["table"]]
    assert len(verdicts) == 4 and sorted(v for v in verdicts if v[1] == "fail") == [("matmul", "fail")] * 2
    assert "`npuops doctor --only stack-row`" in (result.remediation or "")  # on the CPU: the stack's torch


def test_assess_on_an_npu_names_the_kernel_fixes() -> None:
    result = _assess(fixture_text(FP16_ACCUMULATE), device="npu")
    assert result.status is Status.FAIL and result.remediation is not None
    assert "cann-kernels" in result.remediation and "chip-ecc" in result.remediation


def test_assess_skips_without_torch() -> None:
    stdout = json.dumps({"suite": 1, "fatal": {"stage": "import torch",
                                              "error": "ModuleNotFoundError: No module named 'torch'"}})
    result = _assess(stdout, rc=3)
    assert result.status is Status.SKIP and result.evidence["error"] == "ModuleNotFoundError: No module named 'torch'"
    assert "NPUOPS_STACK_PYTHON" in (result.remediation or "")  # how to point npuops at the serving venv


def test_assess_skips_when_torch_npu_cannot_open_the_chip() -> None:
    stdout = json.dumps({"suite": 1, "fatal": {"stage": "import torch_npu", "error": "ImportError: libhccl.so"}})
    result = _assess(stdout, rc=3, device="npu")
    assert result.status is Status.SKIP and result.remediation is not None
    assert "torch-npu-import" in result.remediation


def test_assess_timeouts_warn_on_a_cpu_and_fail_on_an_npu() -> None:
    assert _assess(rc=RC_TIMEOUT, error="timed out after 300 s").status is Status.WARN
    assert _assess(rc=RC_TIMEOUT, error="timed out after 300 s", device="npu").status is Status.FAIL


def test_assess_missing_interpreter_crash_and_garbage() -> None:
    assert _assess(rc=RC_NOT_FOUND, error="python: command not found").status is Status.SKIP
    crashed = _assess(rc=-11, stderr="Fatal Python error: Segmentation fault", device="npu")
    assert crashed.status is Status.FAIL and crashed.evidence["returncode"] == -11
    assert "Segmentation fault" in crashed.evidence["stderr"]  # the evidence keeps the end of what it printed
    assert _assess("hello\n", rc=0).status is Status.ERROR


def test_assess_op_errors_warn_on_a_cpu_and_fail_on_an_npu() -> None:
    data = json.loads(fixture_text(CORRECT))
    data["results"] = [r for r in data["results"] if r["op"] != "sdpa"]
    data["errors"] = [{"op": "sdpa", "dtype": d, "error": "RuntimeError: not implemented for 'Half'"} for d in DTYPES]
    warned = _assess(json.dumps(data))
    assert warned.status is Status.WARN
    assert [(e["op"], e["dtype"]) for e in warned.evidence["errors"]] == [("sdpa", d) for d in DTYPES]
    assert _assess(json.dumps(data), device="npu").status is Status.FAIL


# --- the device and dtypes the check picks (recorded suite runs) ---------------------------------------------------


class _RecordingRunner:
    """Answers the suite with a capture and keeps what it was asked to run."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.calls: list[tuple[tuple[str, ...], dict[str, str]]] = []

    def run(self, argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> CommandResult:
        self.calls.append((tuple(argv), dict(env or {})))
        return CommandResult(tuple(argv), 0, self.stdout, "", 1.0)


def _run_check(root: Path, npu_smi: str | None, versions: dict[str, str] | None,
               devices: tuple[int, ...] | None = None) -> tuple[Result, dict[str, object], dict[str, str]]:
    node = dataclasses.replace(bare_node(root, npu_smi=capture(npu_smi) if npu_smi else None),
                               python_stack=make_stack(versions))
    runner = _RecordingRunner(fixture_text(CORRECT))
    settings = Settings(root=root, stack_python="/venv/bin/python", environ={"OMP_NUM_THREADS": "1"})
    ctx = CheckContext(Probe(settings, runner=runner), DoctorOptions(devices=devices))
    ctx._node = node
    result = OperatorPrecision().run(ctx)
    ((argv, env),) = runner.calls
    assert argv[:3] == ("/venv/bin/python", "-c", suite_source())
    return result, json.loads(argv[3]), env


@pytest.mark.parametrize(("npu_smi", "dtypes"), [
    ("npu-smi-info_910b3_1.txt", ["bfloat16", "float16"]),
    ("npu-smi-info_a3-ascend910-2chip_1.txt", ["bfloat16", "float16"]),
    ("npu-smi-info_310p3-300iduo_1.txt", ["float16"]),
    ("npu-smi-info_910prob_8dev_1.txt", ["float16"]),
])
def test_on_an_npu_node_the_suite_runs_on_the_chip_in_its_dtypes(fake_root: Path, npu_smi: str,
                                                                 dtypes: list[str]) -> None:
    result, config, env = _run_check(fake_root, npu_smi, ROW_0_13, devices=(5, 6))
    assert (config["device"], config["dtypes"], config["size"], config["inject"]) == ("npu", dtypes, None, None)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "5" and config["device_index"] == 0  # the first of --devices
    assert env["OMP_NUM_THREADS"] == "1"  # the service's environment, with the suite setting torch's threads
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in env
    assert result.evidence["device"] == "npu:5" and "why_cpu" not in result.evidence


def test_without_torch_npu_or_chips_the_suite_runs_on_the_cpu_and_says_why(fake_root: Path) -> None:
    result, config, env = _run_check(fake_root, "npu-smi-info_910b3_1.txt", {"torch": "2.8.0"})
    assert config["device"] == "cpu" and config["dtypes"] == ["bfloat16", "float16"]
    assert env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    assert "torch_npu is not installed" in str(result.evidence["why_cpu"])
    result, config, _ = _run_check(fake_root, None, ROW_0_13)
    assert config["device"] == "cpu" and result.status is Status.PASS
    assert result.evidence["device"] == "cpu" and result.evidence["why_cpu"]
    result, config, _ = _run_check(fake_root, "npu-smi-info_910b3_1.txt", ROW_0_13, devices=(42,))
    assert config["device"] == "cpu" and "--devices selects none" in str(result.evidence["why_cpu"])


# --- the check is registered ---------------------------------------------------------------------------------------


def test_the_check_is_discovered_with_its_page() -> None:
    found = {c.id: c for c in discover_checks()}
    check = found["op-precision"]
    assert check is OperatorPrecision and check.area == "precision" and check.level == 3
    assert check.inject is None  # a shipped check never injects a fault
    page = (REPO / "checks" / "docs" / "op-precision.md").read_text(encoding="utf-8")
    assert page.startswith("# op-precision: ")


# --- real torch: the engine venv's CPU torch -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """NPUOPS_ENGINE_PYTHON, else the venv scripts/engine-venv.sh builds; skipped without one unless
    NPUOPS_REQUIRE_ENGINE=1."""
    value = os.environ.get(ENGINE_PYTHON_ENV, "")
    python = Path(value) if value else DEFAULT_ENGINE_PYTHON
    if python.is_file() and os.access(python, os.X_OK):
        return python
    reason = f"no engine python ({ENGINE_PYTHON_ENV} unset and no {DEFAULT_ENGINE_PYTHON}): run scripts/engine-venv.sh"
    if value:
        reason = f"{ENGINE_PYTHON_ENV}={value} is not an executable file"
    if os.environ.get(REQUIRE_ENGINE_ENV, "") == "1":
        pytest.fail(f"{REQUIRE_ENGINE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _run_suite(python: Path, config: OpSuiteConfig) -> OpSuiteOutput:
    runner = SubprocessRunner(os.environ.get("PATH", ""), dict(os.environ))
    run = run_op_suite(runner, str(python), config, timeout=SUITE_TIMEOUT_S)
    assert run.output is not None, (run.command.describe(), run.parse_error, run.stderr_tail())
    assert run.fatal is None, run.fatal
    return run.output


@pytest.fixture(scope="session")
def correct_run(engine_python: Path) -> OpSuiteOutput:
    return _run_suite(engine_python, OpSuiteConfig(device="cpu", threads=os.cpu_count()))


@pytest.mark.slow
@pytest.mark.engine
def test_correct_kernels_pass_for_every_op_and_both_dtypes(correct_run: OpSuiteOutput) -> None:
    assert correct_run.errors == ()
    verdicts = judge(correct_run.results, load_tolerances())
    assert {(v.result.op, v.result.dtype) for v in verdicts} == {(op, dtype) for op in OPS for dtype in DTYPES}
    failed = [(v.result.op, v.result.dtype, v.exceeded) for v in verdicts if v.verdict != PASS]
    assert failed == []


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize(("inject", "ops", "failing"), [
    ("matmul:perturb", ("matmul", "bmm", "softmax"), {("matmul", "bfloat16"), ("matmul", "float16")}),
    ("matmul:fp16-accumulate", ("matmul", "bmm", "softmax"), {("matmul", "bfloat16"), ("matmul", "float16")}),
    # float16 overflows in exp(); bfloat16 has float32's range, so the same fault only costs one more rounding.
    ("softmax:no-max-subtraction", ("softmax", "silu"), {("softmax", "float16")}),
    ("rotary:low-precision-angles", ("rotary", "rms_norm"), {("rotary", "bfloat16"), ("rotary", "float16")}),
])
def test_an_injected_fault_fails_its_op_and_only_its_op(engine_python: Path, inject: str, ops: tuple[str, ...],
                                                        failing: set[tuple[str, str]]) -> None:
    output = _run_suite(engine_python, OpSuiteConfig(device="cpu", ops=ops, inject=inject))
    assert output.inject == inject and output.errors == ()
    verdicts = judge(output.results, load_tolerances())
    assert {(v.result.op, v.result.dtype) for v in verdicts if v.verdict == FAIL} == failing
    assert all(v.verdict == PASS for v in verdicts if (v.result.op, v.result.dtype) not in failing)
    assert {v.result.injected for v in verdicts if v.result.op == inject.split(":")[0]} == {inject}


def test_the_suite_is_python_3_9_syntax() -> None:
    # vllm-ascend rows go back to Python 3.9 (compat.toml): the suite runs in the stack's interpreter, not npuops'.
    import ast

    ast.parse(suite_source(), feature_version=(3, 9))


@pytest.mark.engine
def test_the_suite_runs_without_npuops(engine_python: Path, tmp_path: Path) -> None:
    # The stack interpreter may lack npuops: the source runs from an empty directory with only torch at hand.
    proc = subprocess.run([str(engine_python), "-c", suite_source(), '{"ops": ["silu"], "dtypes": ["float16"]}'],
                          capture_output=True, text=True, cwd=tmp_path, timeout=SUITE_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    (result,) = parse_op_suite_output(proc.stdout).results
    assert (result.op, result.dtype) == ("silu", "float16")


# --- the check end to end ------------------------------------------------------------------------------------------


def _doctor(stack_python: Path | str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["NPUOPS_STACK_PYTHON"] = str(stack_python)
    return subprocess.run([sys.executable, "-m", "npuops", "doctor", "--level", "3", "--only", "op-precision",
                           "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=SUITE_TIMEOUT_S,
                          check=False)


@pytest.mark.slow
@pytest.mark.engine
def test_doctor_passes_with_the_engine_torch(engine_python: Path, tmp_path: Path) -> None:
    proc = _doctor(engine_python, tmp_path)
    assert proc.returncode == 0, proc.stderr
    (check,) = json.loads(proc.stdout)["checks"]
    assert (check["id"], check["status"]) == ("op-precision", "pass"), check["message"]
    evidence = check["evidence"]
    assert evidence["device"] == "cpu" and evidence["why_cpu"].startswith("ran on the CPU because")
    assert evidence["torch"].startswith("2.") and evidence["size"] == "small"
    assert sorted((row["op"], row["dtype"]) for row in evidence["table"]) == sorted(
        (op, dtype) for op in OPS for dtype in DTYPES)
    assert all(row["verdict"] == "pass" for row in evidence["table"])
    assert "ran on the CPU because there is no NPU" in check["message"]


def test_doctor_skips_when_the_stack_interpreter_has_no_torch(tmp_path: Path) -> None:
    # npuops' own venv has no torch.
    proc = _doctor(sys.executable, tmp_path)
    assert proc.returncode == 0, proc.stderr
    (check,) = json.loads(proc.stdout)["checks"]
    assert check["status"] == "skip" and "torch does not import" in check["message"]
    assert "No module named 'torch'" in check["evidence"]["error"]


class _WithFp16Accumulation(OperatorPrecision):
    """The op-precision check with the suite's matmul accumulating in the low precision (a test-only subclass)."""

    inject = "matmul:fp16-accumulate"
    ops = ("matmul", "softmax")


@pytest.mark.slow
@pytest.mark.engine
def test_the_check_fails_a_kernel_that_accumulates_in_the_low_precision(engine_python: Path,
                                                                        fake_root: Path) -> None:
    settings = Settings(root=fake_root, stack_python=str(engine_python), environ={"PATH": os.environ.get("PATH", "")})
    result = _WithFp16Accumulation().run(CheckContext(Probe(settings, machine=lambda: "x86_64")))
    assert result.status is Status.FAIL, result.message
    assert result.evidence["inject"] == "matmul:fp16-accumulate"
    rows = {(row["op"], row["dtype"]): row for row in result.evidence["table"]}
    assert {k for k, row in rows.items() if row["verdict"] == "fail"} == {("matmul", "bfloat16"), ("matmul", "float16")}
    assert rows[("softmax", "float16")]["verdict"] == "pass"


def test_results_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        make_result().op = "x"  # type: ignore[misc]
