"""A tuned configuration as a file: the plan request `npuops tune` found best, which `npuops launch --tuned FILE`
launches (every tune trial is launched from such a file too, so what was measured is what the file launches).

The file holds the whole request (model, hardware, workload, the vLLM options fixed) plus, from the tune, the
measured figures and the trial count; launch reads only the request.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from npuops.atomic import write_text_atomic
from npuops.errors import BadInputError
from npuops.plan.inputs import PlanRequest, Workload

TUNED_FORMAT = "npuops-tuned/1"
_REQUEST_FIELDS = ("hardware", "nodes", "devices", "quantization", "multinode", "vllm_ascend_version", "replicas",
                   "router_policy")


def request_to_json(request: PlanRequest) -> dict[str, Any]:
    w = request.workload
    return {
        "model": request.model, **{name: getattr(request, name) for name in _REQUEST_FIELDS},
        "workload": dataclasses.asdict(w),
        "fixed": dict(request.fixed),
    }


def request_from_json(data: dict[str, Any]) -> PlanRequest:
    given: dict[str, Any] = {name: data[name] for name in _REQUEST_FIELDS if data.get(name) is not None}
    return PlanRequest(model=str(data["model"]), workload=Workload(**dict(data["workload"])),
                       fixed=dict(data.get("fixed") or {}), **given)


def write_tuned(path: Path, request: PlanRequest, extra: dict[str, Any] | None = None) -> None:
    data = {"format": TUNED_FORMAT, "request": request_to_json(request), **(extra or {})}
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
        return request_from_json(data["request"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInputError(f"--tuned {path} has a malformed request ({exc})", "run `npuops tune` again") from None


def request_as_flags(request: PlanRequest) -> dict[str, Any]:
    """The request as the plan flags' values (click's names), so flags given on a command line can override it."""
    data = request_to_json(request)
    return {**{name: data[name] for name in _REQUEST_FIELDS}, **data["workload"], **data["fixed"]}
