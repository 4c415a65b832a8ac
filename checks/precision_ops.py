"""Operator precision: the kernels of this node compute what correct float16/bfloat16 arithmetic gives.

The suite (npuops/precision/op_suite.py) runs in a subprocess of the serving interpreter, on the NPU when there is
one and torch_npu is installed, else on the CPU; npuops/precision/operators.py judges its numbers against
npuops/data/precision_tolerances.toml.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity, Status
from npuops.hardware.node import Chip
from npuops.hardware.probe import RC_NOT_EXECUTABLE, RC_NOT_FOUND, RC_TIMEOUT
from npuops.hardware.python_stack import stack_interpreter
from npuops.precision.operators import (
    FAIL,
    UNJUDGED,
    OpSuiteConfig,
    OpSuiteRun,
    OpVerdict,
    dtypes_for,
    judge,
    load_tolerances,
    run_op_suite,
    verdict_rows,
)

# How long the suite may take: "small" on a CPU takes ~10 s on 2 idle cores; "full" on an NPU is dominated by
# the float64 reference of 2048x4096x4096 matmul and 32-head 4096-token attention on the host's CPUs.
OP_SUITE_TIMEOUT_S = {"cpu": 300.0, "npu": 1200.0}

PROVISION_PYTHON = "`npuops provision --tags python`"
NPU_KERNEL_FIX = ("the NPU kernels compute wrong numbers: check that the stack is one row built for this CANN and that "
                  "the CANN kernels/ops package matches the chip (`npuops doctor --only "
                  "stack-row,torch-npu-cann,cann-kernels`) and reinstall what differs; rule out a faulty chip with "
                  "`npuops doctor --only chip-ecc,chip-health-detail` and `--devices N` for another chip; if it "
                  "persists on a compatible row, report the evidence table (op, dtype, shape, torch_npu, CANN) to "
                  "Ascend/pytorch")
CPU_KERNEL_FIX = ("torch's CPU kernels in the stack interpreter compute wrong numbers (this run says nothing about NPU "
                  "kernels: there was none to test): reinstall torch of the stack's row (`npuops doctor --only "
                  f"stack-row`, {PROVISION_PYTHON})")


class OperatorPrecision(Check):
    """Kernels (matmul, attention, norms, rotary, activations) in fp16/bf16 match a float64 reference."""

    id = "op-precision"
    area = "precision"
    severity = Severity.HIGH
    level = 3

    # The self-test hook: "<op>:<fault>" swaps one kernel of the suite for a deliberately wrong one (op_suite.FAULTS)
    # so a test can prove the check fails. It is a class attribute on purpose: no flag, setting or environment
    # variable reaches it, so only code that subclasses the check (the tests) can turn it on, and the evidence
    # names it whenever it is on. `ops` narrows the suite the same way (None: every op).
    inject: ClassVar[str | None] = None
    ops: ClassVar[tuple[str, ...] | None] = None

    def run(self, ctx: CheckContext) -> Result:
        device, chip, why = choose_device(ctx)
        dtypes = dtypes_for(device, chip.family if chip else None)
        python = stack_interpreter(ctx.probe)
        env = dict(ctx.service_env())
        if device == "npu":
            assert chip is not None
            # One chip (the first selected), seen by the suite as npu:0; --devices picks another.
            env["ASCEND_RT_VISIBLE_DEVICES"] = str(chip.device_id)
        else:
            # A torch_npu without an NPU must not be autoloaded by `import torch` and fail it.
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        config = OpSuiteConfig(device=device, dtypes=dtypes, ops=self.ops, threads=os.cpu_count(),
                               inject=self.inject)
        timeout = OP_SUITE_TIMEOUT_S[device]
        suite = run_op_suite(ctx.probe.runner, python, config, timeout=timeout, env=env)
        evidence: dict[str, Any] = {
            "device": device if chip is None else f"npu:{chip.device_id}",
            "python": python,
            "dtypes": list(dtypes),
            "timeout_s": timeout,
            "seconds": round(suite.command.duration_s, 2),
        }
        if why:
            evidence["why_cpu"] = why
        if self.inject:
            evidence["inject"] = self.inject
        return assess(suite, device, evidence)


def choose_device(ctx: CheckContext) -> tuple[str, Chip | None, str | None]:
    """("npu", the chip to test, None) when the node has chips and the stack has torch_npu, else ("cpu", None, why)."""
    chips = ctx.selected_chips()
    stack = ctx.node.python_stack
    if not chips:
        reasons = ctx.node.no_npu_reasons()
        if ctx.node.chips:
            reasons = ["--devices selects none of the node's chips"]
        return "cpu", None, "ran on the CPU because there is no NPU" + (f" ({reasons[0]})" if reasons else "")
    if stack.version("torch_npu") is None:
        return "cpu", None, (f"ran on the CPU because torch_npu is not installed in "
                             f"{stack.executable or 'the stack interpreter'}")
    return "npu", chips[0], None


def assess(suite: OpSuiteRun, device: str, evidence: dict[str, Any]) -> Result:
    """The check's verdict on one suite run (pure: the run and the evidence so far in, a Result out)."""
    command = suite.command
    on_npu = device == "npu"
    inject_note = f" (self-test: fault {evidence['inject']} injected)" if evidence.get("inject") else ""
    if command.returncode == RC_TIMEOUT and command.error:
        message = f"the kernels did not finish in {evidence.get('timeout_s', 0):g} s"
        if on_npu:
            return Result.fail(message, "check that the chip answers (`npu-smi info`, `npuops doctor --only "
                               "chip-health-detail`) and no other process holds it; a kernel that hangs is a fault "
                               "of the CANN kernels package (`npuops doctor --only cann-kernels`)", **evidence)
        return Result.warn(message + " on the CPU", "run it when the machine is less busy: `npuops doctor --only "
                           "op-precision`", **evidence)
    if command.returncode in (RC_NOT_FOUND, RC_NOT_EXECUTABLE) and command.error:
        return Result.skip(f"cannot run the stack interpreter: {command.error}",
                           "set NPUOPS_STACK_PYTHON to the serving venv's python, or create it with "
                           f"{PROVISION_PYTHON}", **evidence)
    fatal = suite.fatal
    if fatal is not None:
        evidence["error"] = fatal.error
        if fatal.stage == "import torch":
            return Result.skip(f"torch does not import in {evidence.get('python')}: {fatal.error}",
                               f"install the serving stack ({PROVISION_PYTHON}) or point npuops at its interpreter "
                               "(NPUOPS_STACK_PYTHON=/path/to/venv/bin/python)", **evidence)
        if fatal.stage in ("import torch_npu", "open npu"):
            return Result.skip(f"cannot use the NPU from the stack ({fatal.stage}): {fatal.error}",
                               "`npuops doctor --only torch-npu-import,chip-health` names the cause", **evidence)
        return Result(Status.ERROR, f"the precision suite refused its config: {fatal.error}", evidence,
                      "this is a bug in npuops; report it with `npuops doctor --only op-precision --json` output")
    output = suite.output
    if output is None:
        evidence.update(returncode=command.returncode, stderr=suite.stderr_tail())
        if suite.parse_error is not None:
            return Result(Status.ERROR, f"cannot read the precision suite's output: {suite.parse_error}", evidence,
                          "this is a bug in npuops (or the interpreter prints to stdout on its own); report it with "
                          "`npuops doctor --only op-precision --json` output")
        last = suite.stderr_tail(1) or f"exit code {command.returncode}"
        return Result.fail(f"the precision suite crashed on the {device.upper()}: {last}",
                           NPU_KERNEL_FIX if on_npu else CPU_KERNEL_FIX, **evidence)

    evidence.update(torch=output.torch, torch_npu=output.torch_npu, device_name=output.device_name,
                    size=output.size, threads=output.threads)
    verdicts = judge(output.results, load_tolerances())
    evidence["table"] = verdict_rows(verdicts)
    if output.errors:
        evidence["errors"] = [{"op": e.op, "dtype": e.dtype, "error": e.error} for e in output.errors]
    where = f"{device.upper()} ({output.device_name})" if on_npu else "the CPU"
    failed = [v for v in verdicts if v.verdict == FAIL]
    raised = f"; {len(output.errors)} op(s) raised" if output.errors else ""
    if failed:
        worst = max(failed, key=lambda v: v.worst_ratio)
        r = worst.result
        return Result.fail(f"{r.op} in {r.dtype} is off on {where}: {', '.join(worst.exceeded)} "
                           f"({len(failed)} of {len(verdicts)} op/dtype results out of bounds{raised}){inject_note}",
                           NPU_KERNEL_FIX if on_npu else CPU_KERNEL_FIX, **evidence)
    if output.errors:
        first = output.errors[0]
        message = (f"{len(output.errors)} op(s) raised on {where}, e.g. {first.op} in {first.dtype}: "
                   f"{first.error}{inject_note}")
        if on_npu:
            return Result.fail(message, NPU_KERNEL_FIX, **evidence)
        return Result.warn(message, "the CPU torch of the stack lacks these kernels: the other ops were judged; a "
                           "torch of the stack's row (`npuops doctor --only stack-row`) has them", **evidence)
    if not verdicts:
        return Result(Status.ERROR, "the precision suite returned no results", evidence,
                      "this is a bug in npuops; report it with `npuops doctor --only op-precision --json` output")
    unjudged = [v for v in verdicts if v.verdict == UNJUDGED]
    if unjudged:
        names = ", ".join(f"{v.result.op}/{v.result.dtype}" for v in unjudged)
        return Result.warn(f"no bound for {names}: those were measured, not judged{inject_note}",
                           "add their bounds to npuops/data/precision_tolerances.toml", **evidence)
    why_cpu = f"; {evidence['why_cpu']}" if evidence.get("why_cpu") else ""
    return Result.passed(_pass_message(verdicts, where) + why_cpu + inject_note, **evidence)


def _pass_message(verdicts: Sequence[OpVerdict], where: str) -> str:
    closest = max(verdicts, key=lambda v: v.worst_ratio)
    ops = sorted({v.result.op for v in verdicts})
    dtypes = sorted({v.result.dtype for v in verdicts})
    return (f"{len(ops)} ops x {len(dtypes)} dtypes ({', '.join(dtypes)}) within bounds on {where}; closest: "
            f"{closest.result.op} in {closest.result.dtype} at {closest.worst_ratio:.0%} of its bound")
