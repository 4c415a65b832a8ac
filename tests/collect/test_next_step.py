"""Where npuops cannot name the fix, it names the next step: `npuops collect` (every doctor page, the diagnoses
that only say how the engine died, a failure no signature explains)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npuops.doctor.explain import explain_page
from npuops.doctor.registry import discover_checks
from npuops.failures import classify_import_failure
from npuops.instance.record import write_record
from npuops.instance.status import instance_status, render_status_text
from npuops.service.diagnosis import signal_diagnosis
from tests.support.instance_records import make_record


@pytest.mark.parametrize("check_id", sorted(c.id for c in discover_checks()))
def test_every_doctor_page_ends_with_the_support_bundle(check_id: str) -> None:
    page = explain_page(check_id)
    assert page.rstrip().splitlines()[-1].endswith("group).")
    assert "`npuops collect`" in page.split("**If none of this fixes it.**")[1]


@pytest.mark.parametrize(("returncode", "names_collect"), [(-11, True), (-6, True), (-9, False), (-7, False)])
def test_a_crash_that_only_says_how_the_engine_died_names_collect(returncode: int, names_collect: bool) -> None:
    diagnosis = signal_diagnosis(returncode)
    assert diagnosis is not None
    assert ("`npuops collect NAME`" in diagnosis.fix) is names_collect


def test_an_unrecognised_import_failure_names_collect() -> None:
    failure = classify_import_failure("Traceback (most recent call last):\nRuntimeError: a cause npuops has never "
                                      "seen", "/etc/npuops/demo/env")
    assert failure.kind == "unknown" and "`npuops collect`" in failure.remediation


def test_a_failure_no_signature_explains_names_collect_in_status(tmp_path: Path) -> None:
    record = make_record(tmp_path, "odd", manager="foreground")
    write_record(record)
    Path(record.status_file).parent.mkdir(parents=True, exist_ok=True)
    Path(record.status_file).write_text(json.dumps({
        "supervisor_pid": 1, "stage": "exited",
        "exit": {"code": 1, "reason": "engine-exited", "engine_returncode": 1, "at": 1.0, "diagnosis": None}}))
    status = instance_status(record, None, metrics_interval_s=0.0)
    assert status.diagnosis is None and status.exit is not None and status.exit.failed
    text = render_status_text(status)
    assert "  last exit engine-exited (status 1), no known cause" in text
    assert "`npuops collect odd` for a support case" in text
