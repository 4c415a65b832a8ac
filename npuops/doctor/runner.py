"""Running checks: concurrently (independent probes overlap), a crash becomes `error`, the rest still run."""

from __future__ import annotations

import concurrent.futures
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, CheckOutcome, Result, Severity, Status
from npuops.errors import NpuopsError


@dataclass(frozen=True)
class DoctorReport:
    outcomes: tuple[CheckOutcome, ...]
    duration_s: float

    @property
    def ok(self) -> bool:
        return not any(o.result.status in (Status.FAIL, Status.ERROR) for o in self.outcomes)

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for o in self.outcomes:
            counts[o.result.status.value] += 1
        return counts

    def sorted_outcomes(self) -> list[CheckOutcome]:
        """Grouped by area, failures first inside and across areas."""
        worst_by_area: dict[str, int] = {}
        for o in self.outcomes:
            worst_by_area[o.area] = min(worst_by_area.get(o.area, 9), o.result.status.rank)
        order = {o.check_id: i for i, o in enumerate(self.outcomes)}
        return sorted(self.outcomes, key=lambda o: (worst_by_area[o.area], o.area, o.result.status.rank,
                                                    order[o.check_id]))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "summary": {**self.counts(), "total": len(self.outcomes), "duration_s": round(self.duration_s, 3)},
            "checks": [o.to_json() for o in self.sorted_outcomes()],
        }


def _run_one(check_cls: type[Check], ctx: CheckContext) -> CheckOutcome:
    start = time.monotonic()
    try:
        result = check_cls().run(ctx)
        if not isinstance(result, Result):
            raise TypeError(f"run() returned {type(result).__name__}, not Result")
    except NpuopsError:
        # Bad input (an unreadable env file, say) is the operator's to fix, not a check error.
        raise
    except Exception as exc:  # noqa: BLE001 - a crashing check must not take the others down
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else "?"
        result = Result(
            Status.ERROR,
            f"the check crashed: {type(exc).__name__}: {exc}",
            {"exception": type(exc).__name__, "where": where},
            "this is a bug in the check; report it with `npuops doctor --only "
            f"{check_cls.id} --json` output",
        )
    return CheckOutcome(check_cls.id, check_cls.title(), check_cls.area, check_cls.level,
                        Severity(check_cls.severity), result, time.monotonic() - start)


def run_checks(
    checks: list[type[Check]],
    ctx: CheckContext,
    *,
    max_workers: int = 8,
    on_done: Callable[[CheckOutcome], None] | None = None,
) -> DoctorReport:
    start = time.monotonic()
    outcomes: dict[str, CheckOutcome] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = {pool.submit(_run_one, c, ctx): c for c in checks}
        for future in concurrent.futures.as_completed(futures):
            outcome = future.result()
            outcomes[outcome.check_id] = outcome
            if on_done is not None:
                on_done(outcome)
    ordered = tuple(outcomes[c.id] for c in checks)
    return DoctorReport(ordered, time.monotonic() - start)
