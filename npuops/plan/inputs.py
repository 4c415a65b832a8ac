"""What a plan is asked for: the workload it serves and what the operator fixed (`npuops plan` flags)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from npuops.errors import BadInputError
from npuops.plan.fields import Limits, UserFlag, check_fields, declared
from npuops.plan.server_options import ServerOptions

OBJECTIVES = ("throughput", "latency")
STRATEGIES = ("auto", "ray", "dp")


@dataclass(frozen=True)
class Workload:
    """The traffic a plan is sized and predicted for."""

    input_len: int = declared(limits=Limits(minimum=1), flag=UserFlag("input-len", "Prompt tokens per request."),
                              default=512)
    output_len: int = declared(limits=Limits(minimum=1),
                               flag=UserFlag("output-len", "Generated tokens per request."), default=128)
    concurrency: int = declared(limits=Limits(minimum=1),
                                flag=UserFlag("concurrency", "Requests in flight at once."), default=1)
    request_rate: float | None = declared(limits=Limits(minimum=0, minimum_open=True),
                                          flag=UserFlag("request-rate", "Requests per second."))
    objective: str = declared(limits=Limits(choices=OBJECTIVES),
                              flag=UserFlag("objective", "What to favour where the two pull apart."),
                              default="throughput")

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def request_tokens(self) -> int:
        return self.input_len + self.output_len


def check_strategy(value: str | None) -> str:
    """A multi-node strategy as `--multinode` takes it: auto, ray or dp (any case, spaces around)."""
    text = (value or "auto").strip().lower()
    if text not in STRATEGIES:
        raise BadInputError(f"--multinode {value!r} is not a strategy", f"use one of {', '.join(STRATEGIES)}")
    return text


# Short names operators use for the two parallel sizes (the `--tp`/`--pp` flags).
_SHORT_NAMES = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size"}
_SERVER_FIELDS = {f.name for f in dataclasses.fields(ServerOptions)}


class PlanOptions:
    """What the operator fixed: vLLM options (ServerOptions fields; `tp`/`pp` for short), the vllm-ascend release
    the node runs and, with several nodes, the multi-node engine. Everything left out the planner decides."""

    __slots__ = ("multinode", "server", "vllm_ascend_version")

    def __init__(self, *, vllm_ascend_version: str | None = None, multinode: str | None = "auto",
                 **fixed: Any) -> None:
        values: dict[str, Any] = {}
        for key, value in fixed.items():
            name = _SHORT_NAMES.get(key, key)
            if name not in _SERVER_FIELDS:
                raise TypeError(f"PlanOptions has no option {key!r}")
            if value is None or value is False:
                continue
            if name == "dtype" and str(value).strip().lower() == "auto":
                continue  # "auto": the planner decides
            values[name] = value
        self.server = ServerOptions(**values)
        self.vllm_ascend_version = vllm_ascend_version
        self.multinode = check_strategy(multinode)

    def fixed(self, name: str) -> Any:
        """The value the operator fixed for a ServerOptions field, or None."""
        return getattr(self.server, _SHORT_NAMES.get(name, name))

    def __repr__(self) -> str:
        return (f"PlanOptions({self.server.fixed()}, vllm_ascend_version={self.vllm_ascend_version!r}, "
                f"multinode={self.multinode!r})")
