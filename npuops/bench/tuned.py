"""A tuned configuration as a file: the plan request `npuops tune` found best, which `npuops launch --tuned FILE`
launches (every tune trial is launched from such a file too, so what was measured is what the file launches).

The file holds the whole request (model, hardware, workload, the vLLM options fixed) plus, from the tune, the
measured figures and the trial count; launch reads only the request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError
from npuops.plan.inputs import PlanRequest

TUNED_FORMAT = "npuops-tuned/1"


def write_tuned(path: Path, request: PlanRequest, extra: dict[str, Any] | None = None) -> None:
    data = {"format": TUNED_FORMAT, "request": request.to_json(), **(extra or {})}
    write_text_atomic(path, json.dumps(data, indent=1) + "\n", mode=0o644)


def read_tuned(path: Path) -> PlanRequest:
    """The request of a tuned file; one clear error for anything that is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInputError(f"cannot read --tuned {path}: {exc.strerror}",
                            "give the file `npuops tune` wrote") from None
    except ValueError as exc:
        raise BadInputError(f"--tuned {path} is not JSON ({exc})", "give the file `npuops tune` wrote") from None
    if not isinstance(data, dict) or data.get("format") != TUNED_FORMAT:
        raise BadInputError(f"--tuned {path} is not a tuned configuration (format {TUNED_FORMAT})",
                            "give the file `npuops tune` wrote")
    try:
        return PlanRequest.from_json(data["request"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInputError(f"--tuned {path} has a malformed request ({exc})", "run `npuops tune` again") from None
