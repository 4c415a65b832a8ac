"""One typed description of a vLLM server's options: `ServerOptions`.

Each field is one `vllm serve` option and declares its vLLM name, its limits, where it goes (the instance's vllm.yaml
or the command line) and, when an operator may fix it, the npuops flag that does (`npuops plan --tp 2`). The plan
produces one ServerOptions for a replica; vllm.yaml and any argument list are generated from it; the per-node
variants of a multi-node instance are copies with changes (`dataclasses.replace`). A value left None is not
written, so vLLM applies its own default; the same class holds what an operator fixed (everything else None) as
the planner's input. Adding a vLLM option is one field here plus its explanation (npuops/plan/explain.py).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from npuops.plan.fields import Limits, UserFlag, check_fields, declared

VLLM_NAME_KEY = "vllm.name"
PLACEMENT_KEY = "vllm.placement"
OMIT_WHEN_KEY = "vllm.omit_when"

DTYPES = ("auto", "bfloat16", "float16", "float32")
DTYPE_ALIASES = MappingProxyType({"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                                  "float": "float32"})


class Placement(enum.Enum):
    """Where an option goes when the instance's files are rendered."""

    CONFIG_FILE = "vllm.yaml"  # `vllm serve MODEL --config vllm.yaml`: every key is a `vllm serve` option
    POSITIONAL = "command line"  # the model: `vllm serve`'s positional argument, before --config


def vllm_option(name: str, *, limits: Limits | None = None, flag: UserFlag | None = None,
                placement: Placement = Placement.CONFIG_FILE, omit_when: Any = None) -> Any:
    """A field that is the `vllm serve` option `--NAME`. `omit_when`: the value vLLM assumes when the option is
    absent, so it is written only when it differs (None: written whenever set)."""
    return declared(limits=limits, flag=flag, **{VLLM_NAME_KEY: name, PLACEMENT_KEY: placement,
                                                 OMIT_WHEN_KEY: omit_when})


def _positive(maximum: float | None = None) -> Limits:
    return Limits(minimum=1, maximum=maximum)


@dataclass(frozen=True)
class ServerOptions:
    """The options of one `vllm serve` process, in the order they are written."""

    model: str | None = vllm_option("model", placement=Placement.POSITIONAL)
    host: str | None = vllm_option("host")
    port: int | None = vllm_option("port", limits=_positive(65535))
    served_model_name: str | None = vllm_option("served-model-name")
    tensor_parallel_size: int | None = vllm_option(
        "tensor-parallel-size", limits=_positive(128), flag=UserFlag("tp", "Force the tensor-parallel size."))
    pipeline_parallel_size: int | None = vllm_option(
        "pipeline-parallel-size", limits=_positive(128), omit_when=1,
        flag=UserFlag("pp", "Force the pipeline-parallel size."))
    dtype: str | None = vllm_option(
        "dtype", limits=Limits(choices=DTYPES, aliases=DTYPE_ALIASES),
        flag=UserFlag("dtype", "The serving dtype [default: per chip family and checkpoint]."))
    block_size: int | None = vllm_option(
        "block-size", limits=_positive(1024), flag=UserFlag("block-size", "KV cache block size in tokens."))
    max_model_len: int | None = vllm_option(
        "max-model-len", limits=Limits(minimum=16), flag=UserFlag("max-model-len", "Longest request in tokens."))
    max_num_batched_tokens: int | None = vllm_option(
        "max-num-batched-tokens", limits=_positive(),
        flag=UserFlag("max-num-batched-tokens", "Tokens one scheduler step may carry (the prefill chunk)."))
    max_num_seqs: int | None = vllm_option(
        "max-num-seqs", limits=_positive(), flag=UserFlag("max-num-seqs", "Sequences decoded together at most."))
    # vLLM takes (0, 1]; below 0.1 nothing of use fits, and above 0.98 the NPU runtime and HCCL have no room.
    gpu_memory_utilization: float | None = vllm_option(
        "gpu-memory-utilization", limits=Limits(minimum=0.1, maximum=0.98),
        flag=UserFlag("gpu-memory-utilization", "Fraction of each NPU's memory the engine may use."))
    kv_cache_memory_bytes: int | None = vllm_option(
        "kv-cache-memory-bytes", limits=_positive(),
        flag=UserFlag("kv-cache-memory-bytes", "CPU target: the KV cache size in bytes."))
    quantization: str | None = vllm_option("quantization")
    enable_expert_parallel: bool | None = vllm_option("enable-expert-parallel")
    compilation_config: dict[str, Any] | None = vllm_option("compilation-config")
    # vLLM's SpeculativeConfig (method, num_speculative_tokens, model): npuops.plan.speculative.
    speculative_config: dict[str, Any] | None = vllm_option("speculative-config")
    # vllm-ascend's own options (AscendConfig), checked against the release's keys: npuops.plan.additional_config.
    additional_config: dict[str, Any] | None = vllm_option("additional-config")
    # Prefill/decode disaggregation: vLLM's KVTransferConfig of this engine (npuops.plan.disaggregation).
    kv_transfer_config: dict[str, Any] | None = vllm_option("kv-transfer-config")
    enforce_eager: bool | None = vllm_option("enforce-eager", flag=UserFlag("enforce-eager", "No graph mode."))
    # On SIGTERM (a stop, a restart, a rollout) the engine refuses new requests and lets those in flight finish for
    # up to this many seconds; vLLM's own default, 0, aborts them.
    shutdown_timeout: int | None = vllm_option(
        "shutdown-timeout", limits=Limits(minimum=0, maximum=3600), omit_when=0,
        flag=UserFlag("drain-timeout", "Seconds a stopping engine lets the requests in flight finish (vLLM's "
                      "--shutdown-timeout; 0 aborts them) [default: from the workload's longest answer]."))
    # Tokens sent to a streaming client per chunk (vLLM's --stream-interval, from vLLM 0.13): each chunk costs the API
    # server and the client a detokenize, a JSON document and a write. npuops.plan.streaming chooses it.
    stream_interval: int | None = vllm_option(
        "stream-interval", limits=_positive(256), omit_when=1,
        flag=UserFlag("stream-interval", "Tokens sent to a streaming client per chunk (1: every token) [default: a "
                      "chunk about every 50 ms at the predicted TPOT]."))
    # vLLM's profiler (the torch profiler, its traces in the instance's state directory): set by `launch
    # --profiling` for `npuops profile`; /start_profile and /stop_profile exist only with it.
    profiler_config: dict[str, Any] | None = vllm_option("profiler-config")
    distributed_executor_backend: str | None = vllm_option("distributed-executor-backend")
    trust_remote_code: bool | None = vllm_option("trust-remote-code")
    # Native data parallel over several nodes: set per node (ClusterPlan.node_changes), absent elsewhere.
    data_parallel_size: int | None = vllm_option("data-parallel-size", limits=_positive())
    data_parallel_size_local: int | None = vllm_option("data-parallel-size-local", limits=_positive())
    data_parallel_address: str | None = vllm_option("data-parallel-address")
    data_parallel_rpc_port: int | None = vllm_option("data-parallel-rpc-port", limits=_positive(65535))
    headless: bool | None = vllm_option("headless")
    data_parallel_start_rank: int | None = vllm_option("data-parallel-start-rank", limits=Limits(minimum=0))

    def __post_init__(self) -> None:
        check_fields(self)

    def _written(self, placement: Placement | None) -> list[tuple[str, Any]]:
        """(vLLM name, value) of every option that is written, in field order."""
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if placement is not None and f.metadata[PLACEMENT_KEY] is not placement:
                continue
            if value is None or value is False or value == f.metadata[OMIT_WHEN_KEY]:
                continue
            out.append((str(f.metadata[VLLM_NAME_KEY]), value))
        return out

    def config_file(self) -> dict[str, Any]:
        """The vllm.yaml keys: `vllm serve` option names with their values (the template quotes them)."""
        return dict(self._written(Placement.CONFIG_FILE))

    def flags(self) -> list[str]:
        """Every written option as `vllm serve` flags (the positional model left out), in a stable order."""
        args: list[str] = []
        for name, value in self._written(Placement.CONFIG_FILE):
            args.append(f"--{name}")
            if value is True:
                continue
            args.append(json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value))
        return args

    def fixed(self) -> dict[str, Any]:
        """The fields that are set, by field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def vllm_name(field_name: str) -> str:
    """`--tensor-parallel-size` for "tensor_parallel_size"."""
    for f in dataclasses.fields(ServerOptions):
        if f.name == field_name:
            return f"--{f.metadata[VLLM_NAME_KEY]}"
    raise KeyError(field_name)
