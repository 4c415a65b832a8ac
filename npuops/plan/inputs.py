"""What a plan is asked for: the workload it serves, what the operator fixed, and the request that holds both with
the model and the hardware (`npuops plan`/`launch` flags)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npuops.errors import BadInputError
from npuops.plan.fields import Limits, UserFlag, check_fields, declared, flagged_fields
from npuops.plan.model import ModelSpec
from npuops.plan.server_options import ServerOptions

OBJECTIVES = ("throughput", "latency")
# Identical nodes one plan may spread over (hardware spec and --nodes).
MAX_NODES = 64
STRATEGIES = ("auto", "ray", "dp", "replicas")
# vllm-router's load-balancing policies (`vllm-router --policy`), the ones that route plain (not PD) traffic.
ROUTER_POLICIES = ("round_robin", "cache_aware", "power_of_two", "consistent_hash", "random")
# The most replicas one router fronts on one node (an Atlas 800 A3 holds 16 single-die instances).
MAX_REPLICAS = 64


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
    fixed_lengths: bool = declared(flag=UserFlag(
        "fixed-lengths", "Every request exactly --input-len in and --output-len out, as a benchmark sends them "
        "(a closed loop then runs in waves) [default: lengths that vary around those]."), default=False)

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

    __slots__ = ("additional", "draft", "multinode", "replicas", "router_policy", "server", "spec_acceptance",
                 "speculative", "vllm_ascend_version")

    def __init__(self, *, vllm_ascend_version: str | None = None, multinode: str | None = "auto",
                 replicas: int | None = None, router_policy: str | None = None, speculative: str | None = None,
                 draft: ModelSpec | None = None, spec_acceptance: float | None = None,
                 additional: Mapping[str, Any] | None = None, **fixed: Any) -> None:
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
        # --dp N: exactly N independent engines behind one router (None: as many as the target holds).
        self.replicas = replicas
        self.router_policy = router_policy
        # --speculative METHOD[:K] (None: the plan decides), its draft model (loaded), --spec-acceptance.
        self.speculative = speculative
        self.draft = draft
        self.spec_acceptance = spec_acceptance
        # --additional-config: vllm-ascend keys the operator sets (merged over the plan's, checked per release).
        self.additional = dict(additional or {})

    def fixed(self, name: str) -> Any:
        """The value the operator fixed for a ServerOptions field, or None."""
        return getattr(self.server, _SHORT_NAMES.get(name, name))

    def __repr__(self) -> str:
        return (f"PlanOptions({self.server.fixed()}, vllm_ascend_version={self.vllm_ascend_version!r}, "
                f"multinode={self.multinode!r}, replicas={self.replicas!r}, router_policy={self.router_policy!r})")


@dataclass(frozen=True)
class PlanRequest:
    """A plan as an operator asks for it: the model, the hardware, the workload and what they fixed."""

    model: str  # a model directory or a catalog name
    hardware: str = declared(flag=UserFlag(
        "hardware", "auto (this node), a spec like 910B3x8 / 310P3x2 / Ascend910x16, or cpu."), default="auto")
    nodes: int = declared(limits=Limits(minimum=1, maximum=MAX_NODES), flag=UserFlag("nodes", "Identical nodes."),
                          default=1)
    devices: str | None = declared(flag=UserFlag("devices", "Plan for a subset of devices, e.g. 0-3."))
    quantization: str | None = declared(flag=UserFlag(
        "quantization", "Weights quantization as vllm-ascend names it (W8A8, W8A8_DYNAMIC, W4A8_DYNAMIC, W8A16, "
        "W8A8SC on 310P, ...; npuops/data/quantization.toml)."))
    multinode: str = declared(limits=Limits(choices=STRATEGIES), default="auto", flag=UserFlag(
        "multinode", "With --nodes > 1: ray (TP in a node x PP across nodes) or dp (vLLM's native data parallel, "
        "expert parallel for MoE); auto picks and explains. With launch -i/--group also replicas: each host's "
        "own replicas behind one router on the first host."))
    vllm_ascend_version: str | None = declared(flag=UserFlag(
        "vllm-ascend-version", "The vllm-ascend release the node runs (gates env keys and features)."))
    replicas: int | None = declared(limits=Limits(minimum=1, maximum=MAX_REPLICAS), flag=UserFlag(
        "dp", "Run exactly N independent engines on this node behind one router endpoint (also on the CPU target)."))
    router_policy: str | None = declared(limits=Limits(choices=ROUTER_POLICIES), flag=UserFlag(
        "router-policy", "How the router in front of several replicas spreads requests [default: chosen and "
        "explained by the plan]; with one replica, a router in front of it (for rollout --surge)."))
    speculative: str | None = declared(flag=UserFlag(
        "speculative", "Speculative decoding METHOD[:K] (mtp, eagle3, ngram, suffix, draft_model, ...; none: off) "
        "[default: the model's MTP layers where it ships them]."))
    draft_model: str | None = declared(flag=UserFlag(
        "draft-model", "The draft model (a directory or catalog name) of --speculative eagle/eagle3/draft_model."))
    spec_acceptance: float | None = declared(limits=Limits(minimum=0.01, maximum=1.0), flag=UserFlag(
        "spec-acceptance", "Draft tokens accepted / proposed to predict with [default: per method, or measured "
        "by npuops bench]."))
    additional_config: str | None = declared(flag=UserFlag(
        "additional-config", "vllm-ascend's --additional-config as JSON, checked against the release's keys."))
    pd: str | None = declared(flag=UserFlag(
        "pd", "Prefill/decode disaggregation: P:D prefill and decode engines behind one router in PD mode (e.g. "
        "1:1) on this node's chips, or on P + D hosts with --nodes / -i --group; auto: the plan judges one node's "
        "split against a co-located plan and says why."))
    kv_port: int | None = declared(limits=Limits(minimum=1024, maximum=65535), flag=UserFlag(
        "kv-port", "With --pd: the first KV connector port [default: above Mooncake's transport range]."))
    no_calibration: bool = declared(flag=UserFlag(
        "no-calibration", "Predict with the model's shared constants, ignoring this node's stored benches."),
        default=False)
    workload: Workload = field(default_factory=Workload)
    # The vLLM options the operator fixed, by ServerOptions field name (`tp`/`pp` accepted for short).
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def options(self) -> PlanOptions:
        """What the operator fixed, the draft model of --draft-model loaded (a directory or a catalog name)."""
        from npuops.plan.catalog import load_model  # the catalog reads its files; only a draft needs it here

        draft = load_model(self.draft_model) if self.draft_model else None
        return PlanOptions(vllm_ascend_version=self.vllm_ascend_version, multinode=self.multinode,
                           replicas=self.replicas, router_policy=self.router_policy, speculative=self.speculative,
                           draft=draft, spec_acceptance=self.spec_acceptance, additional=self.additional_settings,
                           **self.fixed)

    @property
    def additional_settings(self) -> dict[str, Any]:
        """--additional-config as a mapping (a JSON object)."""
        if not self.additional_config:
            return {}
        try:
            value = json.loads(self.additional_config)
        except json.JSONDecodeError as exc:
            raise BadInputError(f"--additional-config is not JSON ({exc.msg} at column {exc.colno})",
                                "quote it as one JSON object, e.g. '{\"enable_cpu_binding\": true}'") from None
        if not isinstance(value, dict):
            raise BadInputError("--additional-config must be a JSON object", "write it like '{\"key\": value}'")
        return value

    def to_json(self) -> dict[str, Any]:
        """The whole request (a tuned file's, an instance revision's): every declared field, the workload, what
        was fixed."""
        return {"model": self.model, **{f.name: getattr(self, f.name) for f, _ in flagged_fields(PlanRequest)},
                "workload": dataclasses.asdict(self.workload), "fixed": dict(self.fixed)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlanRequest:
        """A request as to_json wrote it (a key an older npuops left out takes its default; raises KeyError,
        TypeError or ValueError on anything else)."""
        given = {f.name: data[f.name] for f, _ in flagged_fields(PlanRequest) if data.get(f.name) is not None}
        workload = data.get("workload") or {}
        fixed = data.get("fixed") or {}
        if not isinstance(workload, dict) or not isinstance(fixed, dict):
            raise TypeError("workload and fixed must be objects")
        return cls(model=str(data["model"]), workload=Workload(**workload), fixed=dict(fixed), **given)

    def with_flags(self, flags: Mapping[str, Any]) -> PlanRequest:
        """This request with the flags given on a command line (click's names, `model` for MODEL) over it."""
        own = {f.name: getattr(self, f.name) for f, _ in flagged_fields(PlanRequest)}
        return PlanRequest(model=str(flags.get("model") or self.model),
                           workload=dataclasses.replace(self.workload, **flag_values(Workload, flags)),
                           fixed={**self.fixed, **flag_values(ServerOptions, flags)},
                           **{**own, **flag_values(PlanRequest, flags)})

    @classmethod
    def from_flags(cls, model: str, flags: Mapping[str, Any]) -> PlanRequest:
        """The request from the CLI's flag values, named as click names them (the declared flags with `_`)."""
        return cls(model=model, workload=Workload(**flag_values(Workload, flags)),
                   fixed=flag_values(ServerOptions, flags), **flag_values(PlanRequest, flags))


def flag_values(cls: type[Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """The values of `cls`'s declared flags that were given, by field name (`--tp` gives tensor_parallel_size)."""
    out: dict[str, Any] = {}
    for f, flag in flagged_fields(cls):
        value = flags.get(flag.name.replace("-", "_"))
        if value is not None and value is not False:
            out[f.name] = value
    return out
