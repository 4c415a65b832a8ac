"""Chips: health, temperature, device memory held by other processes, and the health/ECC detail of each chip.

Level 1 reads only the `npu-smi info` table the node model already parsed (one run shared by every check).
Level 2 asks npu-smi per chip (`-t health`, `-t ecc`); those queries are not available on every product and
driver, so a chip whose query is unsupported is left out with the reason instead of failing the check.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from npuops.doctor.common import skip_without_npus
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity, Status
from npuops.hardware.node import Chip
from npuops.hardware.npu_smi import NpuSmiProcess
from npuops.hardware.npu_smi_detail import parse_npu_smi_ecc, parse_npu_smi_health
from npuops.hardware.probe import CommandResult
from npuops.parsing import ParseError

# npu-smi's health words: OK; Warning (a minor alarm); Alarm (a major one); Critical. Anything else is a word
# npuops does not know, which is reported as printed rather than guessed at.
_HEALTH_STATUS = {"ok": Status.PASS, "warning": Status.WARN, "alarm": Status.FAIL, "critical": Status.FAIL}


def classify_health(raw: str) -> Status:
    """PASS for OK, WARN for Warning or a word npuops does not know, FAIL for Alarm/Critical."""
    return _HEALTH_STATUS.get(raw.strip().lower(), Status.WARN)


def chip_label(chip: Chip) -> str:
    """How an operator finds the chip again: the npu-smi ids, the device id a launch uses, the PCI bus."""
    s = chip.smi
    return f"NPU {s.npu_id} chip {s.chip_id} (device {chip.device_id}, bus {s.bus_id})"


def chip_ref(chip: Chip) -> dict[str, Any]:
    s = chip.smi
    return {"npu_id": s.npu_id, "chip_id": s.chip_id, "device": chip.device_id, "bus_id": s.bus_id, "name": s.name}


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _out_of_service_fix(chips: Sequence[Chip]) -> str:
    others = "launch on the other chips (`--devices`, i.e. ASCEND_RT_VISIBLE_DEVICES without them)"
    detail = "; ".join(f"`npu-smi info -t health -i {c.smi.npu_id} -c {c.smi.chip_id}`" for c in chips[:4])
    reset = "; ".join(f"`npu-smi set -t reset -i {c.smi.npu_id} -c {c.smi.chip_id}`" for c in chips[:4])
    return (f"take the chip(s) out of service: {others}. Read the alarm with {detail} "
            "(`npuops doctor --only chip-health-detail`); an idle chip can be reset with "
            f"{reset}; if the alarm returns, collect the device logs (msnpureport) and have the card replaced")


class ChipHealth(Check):
    """Every chip reports health OK in `npu-smi info` (Warning warns; Alarm/Critical fail, naming the chip)."""

    id = "chip-health"
    area = "chips"
    severity = Severity.CRITICAL
    level = 1
    requires = ("npu-smi",)
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = skip_without_npus(ctx)
        if skipped is not None:
            return skipped
        selected = {c.device_id for c in ctx.selected_chips()}
        # A chip the launch does not use cannot break it, but an alarm on it is still worth a warning.
        bad: list[tuple[Chip, Status]] = []
        for chip in ctx.node.chips:
            status = classify_health(chip.smi.health)
            if status is not Status.PASS:
                bad.append((chip, status if chip.device_id in selected else Status.WARN))
        evidence = {"chips": {f"{c.smi.npu_id}/{c.smi.chip_id}": c.smi.health for c in ctx.node.chips}}
        if not bad:
            return Result.passed(f"all {len(ctx.node.chips)} chip(s) report health OK", **evidence)
        described = "; ".join(f"{chip_label(c)} is {c.smi.health!r}"
                              + ("" if c.device_id in selected else " (not used by this launch)") for c, _ in bad)
        problems = [{**chip_ref(c), "health": c.smi.health, "in_launch": c.device_id in selected} for c, _ in bad]
        failing = [c for c, status in bad if status is Status.FAIL]
        if failing:
            return Result.fail(described, _out_of_service_fix(failing), problems=problems, **evidence)
        chips = [c for c, _ in bad]
        detail = "; ".join(f"`npu-smi info -t health -i {c.smi.npu_id} -c {c.smi.chip_id}`" for c in chips[:4])
        return Result.warn(described,
                           f"read what the chip reports with {detail} (`npuops doctor --only chip-health-detail`); "
                           "a Warning usually still serves, but watch it and plan a maintenance window; a health "
                           "word npuops does not know is shown as printed", problems=problems, **evidence)


class ChipTemperature(Check):
    """Every chip the launch uses is below the temperature thresholds (temperature_warn_c / temperature_fail_c)."""

    id = "chip-temperature"
    area = "chips"
    severity = Severity.HIGH
    level = 1
    requires = ("npu-smi",)
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = skip_without_npus(ctx)
        if skipped is not None:
            return skipped
        warn_c = float(ctx.threshold("temperature_warn_c"))
        fail_c = float(ctx.threshold("temperature_fail_c"))
        chips = ctx.selected_chips()
        measured = [c for c in chips if c.smi.temperature_c is not None]
        evidence: dict[str, Any] = {
            "warn_c": warn_c, "fail_c": fail_c,
            "temperatures_c": {f"{c.smi.npu_id}/{c.smi.chip_id}": c.smi.temperature_c for c in chips},
        }
        if not measured:
            return Result.skip("npu-smi shows no temperature for the chip(s)",
                               "read it with `npu-smi info -t temp -i N -c C` or from the BMC", **evidence)
        hot = [c for c in measured if c.smi.temperature_c is not None and c.smi.temperature_c >= fail_c]
        warm = [c for c in measured if c.smi.temperature_c is not None and warn_c <= c.smi.temperature_c < fail_c]
        hottest = max(c.smi.temperature_c for c in measured if c.smi.temperature_c is not None)
        evidence["hottest_c"] = hottest

        def listing(group: list[Chip]) -> str:
            return "; ".join(f"{chip_label(c)} at {c.smi.temperature_c:g} C" for c in group)

        fix = ("check the cooling: fans and fan policy, blocked airflow, the inlet temperature (BMC/iBMC sensors), "
               "and neighbouring hot cards; a chip this hot lowers its clocks and can shut down under load")
        if hot:
            return Result.fail(f"{listing(hot)} (at or above {fail_c:g} C)", fix,
                               hot=[chip_ref(c) for c in hot], **evidence)
        if warm:
            return Result.warn(f"{listing(warm)} (at or above {warn_c:g} C)", fix,
                               warm=[chip_ref(c) for c in warm], **evidence)
        return Result.passed(f"{len(measured)} chip(s) at most {hottest:g} C (warn at {warn_c:g} C)", **evidence)


@dataclass(frozen=True)
class _ChipMemory:
    chip: Chip
    total_mb: int
    used_mb: int
    need_mb: int
    processes: tuple[NpuSmiProcess, ...]

    @property
    def free_mb(self) -> int:
        return max(self.total_mb - self.used_mb, 0)

    @property
    def fits(self) -> bool:
        return self.free_mb >= self.need_mb

    def to_json(self) -> dict[str, Any]:
        return {**chip_ref(self.chip), "total_mb": self.total_mb, "used_mb": self.used_mb, "free_mb": self.free_mb,
                "need_mb": self.need_mb,
                "processes": [{"pid": p.pid, "name": p.name, "memory_mb": p.memory_mb} for p in self.processes]}


def _processes_on(chip: Chip, processes: Sequence[NpuSmiProcess]) -> tuple[NpuSmiProcess, ...]:
    # The process table names the chip inside its NPU (0/1 on a 300I Duo card or an A3 NPU), like the chip rows.
    return tuple(p for p in processes
                 if p.npu_id == chip.smi.npu_id and (p.chip_id is None or p.chip_id == chip.smi.chip_id))


def _describe_processes(processes: Sequence[NpuSmiProcess]) -> str:
    # 310P tables in containers leave the name empty; the pid and the memory still identify the process.
    return ", ".join(f"pid {p.pid}{' ' + p.name if p.name else ''} ({p.memory_mb} MB)" for p in processes)


class HbmFree(Check):
    """The chips a launch uses have free device memory >= total x gpu_memory_utilization (other processes named)."""

    id = "hbm-free"
    area = "chips"
    severity = Severity.CRITICAL
    level = 1
    requires = ("npu-smi",)
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = skip_without_npus(ctx)
        if skipped is not None:
            return skipped
        node = ctx.node
        utilization = ctx.options.gpu_memory_utilization
        chips = ctx.selected_chips()
        listed = {c.device_id for c in node.chips}
        absent = sorted(set(ctx.options.devices or ()) - listed)
        measured: list[_ChipMemory] = []
        unknown: list[Chip] = []
        for chip in chips:
            # 310P tables have no HBM column; the node model falls back to their device memory column.
            total, used = chip.device_memory_total_mb, chip.device_memory_used_mb
            if not total or used is None:
                unknown.append(chip)
                continue
            measured.append(_ChipMemory(chip, total, used, math.ceil(total * utilization),
                                        _processes_on(chip, node.processes)))
        evidence: dict[str, Any] = {"gpu_memory_utilization": utilization, "chips": [m.to_json() for m in measured]}
        if unknown:
            evidence["no_memory_figures"] = [chip_ref(c) for c in unknown]
        if node.npu_smi.elided:
            evidence["npu_smi_elided"] = True
        if absent:
            evidence["devices_not_listed"] = absent
            return Result.fail(f"device(s) {', '.join(map(str, absent))} requested but not listed by npu-smi "
                               f"(it lists {', '.join(map(str, sorted(listed)))})",
                               "pass device ids from `npu-smi info` (the Device/Phy-ID column where shown, else "
                               "the NPU id) to --devices", **evidence)
        if not measured:
            return Result.skip("npu-smi shows no device memory figures for the chip(s)",
                               "read them with `npu-smi info -t usages -i N -c C`", **evidence)
        short = [m for m in measured if not m.fits]
        if short:
            headroom = min(m.free_mb / m.total_mb for m in measured)
            lines = []
            for m in short:
                holder = (f"held by {_describe_processes(m.processes)}" if m.processes else
                          "npu-smi lists no process on it (one in another container, or memory a crashed process "
                          "left)")
                lines.append(f"{chip_label(m.chip)}: {m.free_mb} MB free of {m.total_mb} MB, a launch at "
                             f"gpu_memory_utilization {utilization:g} needs {m.need_mb} MB; {holder}")
            pids = sorted({p.pid for m in short for p in m.processes})
            steps = []
            if pids:
                listed_pids = " ".join(map(str, pids))
                steps.append(f"stop what holds the memory (check with `ps -fp {','.join(map(str, pids))}`, then "
                             f"`kill {listed_pids}`)")
            if any(not m.processes for m in short):
                c = next(m.chip for m in short if not m.processes)
                steps.append(f"find the holder from the host (`npu-smi info -t proc-mem -i {c.smi.npu_id}`), or "
                             f"reset the idle chip (`npu-smi set -t reset -i {c.smi.npu_id} -c {c.smi.chip_id}`)")
            steps.append("launch on other chips (`--devices`)")
            fitting = math.floor(headroom * 100) / 100
            if fitting >= float(ctx.threshold("hbm_suggest_utilization_min")):
                steps.append(f"or lower --gpu-memory-utilization to {fitting:.2f} or less")
            return Result.fail("; ".join(lines),
                               "; ".join(steps) + " (vLLM refuses to start: \"Free memory on device ... is less "
                               "than desired GPU memory utilization\")", **evidence)
        shared = [m for m in measured if m.processes]
        if shared:
            holders = "; ".join(f"{chip_label(m.chip)}: {_describe_processes(m.processes)}" for m in shared)
            kill = " ".join(str(p.pid) for m in shared for p in m.processes)
            return Result.warn(f"other processes hold device memory, but the launch still fits: {holders}",
                               f"if they are leftovers, stop them (`kill {kill}`); otherwise they compete with the "
                               "engine for memory and compute", **evidence)
        tightest = min(measured, key=lambda m: m.free_mb - m.need_mb)
        return Result.passed(f"{len(measured)} chip(s) free for a launch at gpu_memory_utilization {utilization:g} "
                             f"(tightest: {chip_label(tightest.chip)}, {tightest.free_mb} MB free, "
                             f"{tightest.need_mb} MB needed)", **evidence)


# --- level 2: per-chip queries -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ChipAnswer:
    """One chip's part of a per-chip query: its status and a sentence, or why it was left out."""

    chip: Chip
    status: Status  # PASS / WARN / FAIL, or SKIP when the query is not available for this chip
    text: str
    evidence: dict[str, Any]


def _unavailable(chip: Chip, result: CommandResult, what: str) -> _ChipAnswer:
    """A query that did not give an answer: why, in the words the tool used."""
    said = _first_line(result.output)
    if "not support" in result.output.lower():
        why = f"`{what}` is not supported on this chip/driver ({said})"
    elif result.error is not None or not said:
        why = result.describe()
    else:
        why = f"{result.describe()}: {said}"
    return _ChipAnswer(chip, Status.SKIP, why, {**chip_ref(chip), "skipped": why})


def _per_chip(ctx: CheckContext, what: str, argv: Callable[[Chip], tuple[str, ...]],
              judge: Callable[[Chip, str], _ChipAnswer]) -> list[_ChipAnswer] | Result:
    """Run one query per selected chip through the shared probe and judge each answer; a Result when npu-smi
    itself is missing (nothing to ask)."""
    answers: list[_ChipAnswer] = []
    for chip in ctx.selected_chips():
        result = ctx.probe.run(*argv(chip))
        if result.missing:
            return Result.skip(f"{ctx.settings.npu_smi} is not installed", "install the driver (it ships npu-smi)")
        if not result.ok:
            answers.append(_unavailable(chip, result, what))
            continue
        answers.append(judge(chip, result.output))
    return answers


def _combine(answers: list[_ChipAnswer], what: str, fix_fail: str, fix_warn: str, ok_word: str) -> Result:
    """Worst chip decides; chips whose query was unavailable are named, and only all-unavailable is a skip."""
    skipped = [a for a in answers if a.status is Status.SKIP]
    judged = [a for a in answers if a.status is not Status.SKIP]
    evidence = {"chips": [a.evidence for a in answers]}
    if not judged:
        reasons = sorted({a.text for a in skipped})
        return Result.skip(f"`{what}` gave no answer for any chip: {'; '.join(reasons)}",
                           "nothing to fix on the node; the level-1 checks (chip-health) still cover the chips. "
                           "A newer driver's npu-smi may support the query", **evidence)
    left_out = ("; left out: " + "; ".join(f"{chip_label(a.chip)} ({a.text})" for a in skipped)) if skipped else ""
    failing = [a for a in judged if a.status is Status.FAIL]
    warning = [a for a in judged if a.status is Status.WARN]
    if failing:
        return Result.fail("; ".join(f"{chip_label(a.chip)}: {a.text}" for a in failing + warning) + left_out,
                           fix_fail, **evidence)
    if warning:
        return Result.warn("; ".join(f"{chip_label(a.chip)}: {a.text}" for a in warning) + left_out,
                           fix_warn, **evidence)
    return Result.passed(f"{len(judged)} chip(s) {ok_word}{left_out}", **evidence)


class ChipHealthDetail(Check):
    """`npu-smi info -t health` reports no error codes on the chips a launch uses."""

    id = "chip-health-detail"
    area = "chips"
    severity = Severity.HIGH
    level = 2
    requires = ("npu-smi",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = skip_without_npus(ctx)
        if skipped is not None:
            return skipped
        what = "npu-smi info -t health"

        def argv(chip: Chip) -> tuple[str, ...]:
            return (ctx.settings.npu_smi, "info", "-t", "health", "-i", str(chip.smi.npu_id),
                    "-c", str(chip.smi.chip_id))

        answers = _per_chip(ctx, what, argv, _judge_health)
        if isinstance(answers, Result):
            return answers
        chips = [a.chip for a in answers if a.status in (Status.FAIL, Status.WARN)]
        return _combine(answers, what, _out_of_service_fix(chips),
                        "look the codes up in the Ascend health/fault code reference for your product; a chip that "
                        "keeps reporting codes should be drained (`--devices` without it) and its device logs "
                        "collected (msnpureport)", "report health OK with no error codes")


def _judge_health(chip: Chip, text: str) -> _ChipAnswer:
    try:
        health = parse_npu_smi_health(text)
    except ParseError as exc:
        why = (f"`npu-smi info -t health` is not supported on this chip/driver ({_first_line(text)})"
               if "not support" in text.lower() else f"output not understood: {exc}")
        return _ChipAnswer(chip, Status.SKIP, why, {**chip_ref(chip), "skipped": why})
    status = classify_health(health.health)
    if health.error_codes and status is Status.PASS:
        # Codes with an OK status: the chip recovered from something, or npu-smi disagrees with itself.
        status = Status.WARN
    codes = ", ".join(health.error_codes)
    text_out = f"health {health.health!r}" + (f", error code(s) {codes}" if codes else "")
    if health.error_information:
        text_out += f" ({health.error_information})"
    evidence = {**chip_ref(chip), "health": health.health, "error_codes": list(health.error_codes),
                "error_information": health.error_information}
    return _ChipAnswer(chip, status, text_out, evidence)


class ChipEcc(Check):
    """No uncorrectable (double-bit) ECC errors on the chips a launch uses; single-bit errors warn."""

    id = "chip-ecc"
    area = "chips"
    severity = Severity.HIGH
    level = 2
    requires = ("npu-smi",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = skip_without_npus(ctx)
        if skipped is not None:
            return skipped
        what = "npu-smi info -t ecc"
        single_warn = int(ctx.threshold("ecc_single_bit_warn"))

        def argv(chip: Chip) -> tuple[str, ...]:
            return (ctx.settings.npu_smi, "info", "-t", "ecc", "-i", str(chip.smi.npu_id),
                    "-c", str(chip.smi.chip_id))

        def judge(chip: Chip, text: str) -> _ChipAnswer:
            try:
                ecc = parse_npu_smi_ecc(text)
            except ParseError as exc:
                why = (f"`{what}` is not supported on this chip/driver ({_first_line(text)})"
                       if "not support" in text.lower() else f"output not understood: {exc}")
                return _ChipAnswer(chip, Status.SKIP, why, {**chip_ref(chip), "skipped": why})
            single, double = ecc.single_bit_errors, ecc.double_bit_errors
            counts = {k: v for k, v in ecc.raw.pairs if "error count" in k.lower().replace("-", " ")}
            evidence = {**chip_ref(chip), "single_bit": single, "double_bit": double, "counts": counts}
            if single is None and double is None:
                why = "npu-smi prints no ECC counts for this chip (NA)"
                return _ChipAnswer(chip, Status.SKIP, why, {**evidence, "skipped": why})
            sentence = f"{double or 0} double-bit, {single or 0} single-bit ECC error(s)"
            if double:
                return _ChipAnswer(chip, Status.FAIL, sentence, evidence)
            if single is not None and single >= single_warn:
                return _ChipAnswer(chip, Status.WARN, sentence, evidence)
            return _ChipAnswer(chip, Status.PASS, sentence, evidence)

        answers = _per_chip(ctx, what, argv, judge)
        if isinstance(answers, Result):
            return answers
        return _combine(
            answers, what,
            "an uncorrectable memory error corrupts whatever used that memory: drain the chip (`--devices` without "
            "it), reset it (`npu-smi set -t reset -i N -c C`) or reboot so the driver isolates the bad pages, and "
            "have the card replaced if double-bit errors return",
            f"single-bit errors are corrected; watch the count (`{what} -i N -c C`): a count that keeps growing "
            "means the memory is degrading and the card should be scheduled for replacement",
            "report no ECC errors")
