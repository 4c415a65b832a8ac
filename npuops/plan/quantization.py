"""The quantization schemes vllm-ascend runs, and what a checkpoint says about its own.

One table (npuops/data/quantization.toml) says, per scheme, its bytes per weight, which layers vllm-ascend has a
kernel for, and the chip families and releases that run it; `check_runs` refuses a scheme a target cannot run and
names those that would. The readers of a checkpoint's description are pure: `read_modelslim_description` for
ModelSlim's quant_model_description.json (served with `--quantization ascend`) and `read_quantization_config` for
config.json's quantization_config (an LLM-Compressor / compressed-tensors checkpoint needs no flag: vLLM finds
the method in config.json and vllm-ascend's compressed-tensors config maps it to the same schemes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.errors import BadInputError
from npuops.plan.environment import parse_release

# Where a model's quantization was read from; MODELSLIM and FLAG are served with `--quantization ascend`.
MODELSLIM = "modelslim"
COMPRESSED_TENSORS = "compressed-tensors"
CONFIG = "config"
FLAG = "flag"

# Chip families npuops cannot plan for but a refusal may name (vllm-ascend's name for them).
_FAMILY_LABELS = {"950": "Ascend 950", "310P": "310P", "A2": "A2 (910B)", "A3": "A3"}


@dataclass(frozen=True)
class QuantScheme:
    name: str
    weight_bytes: float  # per quantized linear/expert weight element, in device memory
    layers: str  # "linear", "moe" or "both"
    families: Mapping[str, str]  # chip family -> first release
    why: str
    linear_removed_in: str | None = None
    matmul_speedup: float = 1.0  # its linear matmuls' rate over bf16 (int8 activations: the int8 cube path)
    # Bytes per routed-expert weight a decode step costs, where the kernel converts the weights before the cube
    # multiplies them (weight-only int4 experts); None: what they take in memory.
    expert_decode_bytes: float | None = None

    def runs_on(self, family: str, release: str) -> bool:
        since = self.families.get(family)
        return since is not None and parse_release(release) >= parse_release(since)

    def serves_dense(self, release: str) -> bool:
        if self.layers == "moe":
            return False
        return self.linear_removed_in is None or parse_release(release) < parse_release(self.linear_removed_in)


@dataclass(frozen=True)
class KvCacheScheme:
    name: str
    bytes: float
    families: Mapping[str, str]
    why: str


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    return load_data_toml("quantization.toml")


@lru_cache(maxsize=1)
def schemes() -> dict[str, QuantScheme]:
    out = {}
    for name, raw in _table()["schemes"].items():
        out[name] = QuantScheme(name, float(raw["weight_bytes"]), str(raw["layers"]),
                                {str(k): str(v) for k, v in raw["families"].items()}, str(raw["why"]),
                                raw.get("linear_removed_in"), float(raw.get("matmul_speedup", 1.0)),
                                float(raw["expert_decode_bytes"]) if "expert_decode_bytes" in raw else None)
    return out


@lru_cache(maxsize=1)
def kv_cache_schemes() -> dict[str, KvCacheScheme]:
    return {name: KvCacheScheme(name, float(raw["bytes"]), {str(k): str(v) for k, v in raw["families"].items()},
                                str(raw["why"]))
            for name, raw in _table()["kv_cache"].items()}


def scheme_names() -> list[str]:
    return list(schemes())


def normalise_quantization(value: str) -> str:
    """The registered name for what an operator or a checkpoint wrote (case, dashes and aliases forgiven)."""
    key = value.strip().upper().replace("-", "_")
    key = str(_table()["aliases"].get(key, key))
    if key in schemes():
        return key
    raise BadInputError(f"unknown quantization {value!r}",
                        f"use one of {', '.join(scheme_names())} (vllm-ascend / ModelSlim names)")


def weight_bytes_per_element(name: str) -> float:
    return schemes()[name].weight_bytes


def matmul_speedup(name: str | None) -> float:
    """How much faster than bf16 the scheme's quantized linear layers compute (1.0 unquantized)."""
    return schemes()[name].matmul_speedup if name else 1.0


def expert_decode_factor(name: str | None) -> float:
    """What a decode step's routed experts cost over their bytes in memory (1.0 but for weight-only experts that
    the kernel dequantizes to the activation dtype first)."""
    scheme = schemes()[name] if name else None
    if scheme is None or scheme.expert_decode_bytes is None:
        return 1.0
    return scheme.expert_decode_bytes / scheme.weight_bytes


def quantizes_experts_only(name: str) -> bool:
    """Whether vllm-ascend runs the scheme in the routed experts only (the rest of the model stays unquantized)."""
    return schemes()[name].layers == "moe"


def usable_schemes(family: str, release: str, is_moe: bool) -> list[str]:
    """The schemes this family and release run for a model of this kind."""
    return [s.name for s in schemes().values()
            if s.runs_on(family, release) and (is_moe or s.serves_dense(release))]


def check_runs(name: str, family: str, release: str, is_moe: bool) -> None:
    """Refuse, in one line with what would work, a scheme this chip family and release cannot serve."""
    scheme = schemes()[name]
    label = _FAMILY_LABELS.get(family, family)
    works = usable_schemes(family, release, is_moe)
    instead = f"use {' or '.join(works[:4])}" if works else "serve the model unquantized"
    since = scheme.families.get(family)
    if since is None:
        where = ", ".join(f"{_FAMILY_LABELS.get(f, f)} from vllm-ascend {r}" for f, r in scheme.families.items())
        raise BadInputError(f"{name} does not run on {label} (vllm-ascend runs it on {where})",
                            f"{instead} on {label}")
    if parse_release(release) < parse_release(since):
        raise BadInputError(f"{name} on {label} needs vllm-ascend {since} or later (the plan is for {release})",
                            f"use --vllm-ascend-version {since} or later, or {instead.removeprefix('use ')}")
    if not is_moe and not scheme.serves_dense(release):
        reason = ("vllm-ascend has a kernel for the routed experts only" if scheme.layers == "moe" else
                  f"vllm-ascend {scheme.linear_removed_in} removed its dense kernel")
        raise BadInputError(f"{name} quantizes MoE experts and this model is dense ({reason})",
                            f"{instead} for a dense model")


def check_kv_cache_runs(name: str, family: str, release: str) -> None:
    kv = kv_cache_schemes()[name]
    since = kv.families.get(family)
    label = _FAMILY_LABELS.get(family, family)
    if since is None:
        raise BadInputError(f"the {name} (int8) KV cache does not run on {label}",
                            "re-export the checkpoint without kv_cache_type C8, or serve it on A2/A3")
    if parse_release(release) < parse_release(since):
        raise BadInputError(f"the {name} (int8) KV cache needs vllm-ascend {since} or later (plan: {release})",
                            f"use --vllm-ascend-version {since} or later")


# --- what a checkpoint says about itself (pure) --------------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointQuantization:
    scheme: str | None  # the registered scheme of most quantized weights, None if not quantized
    source: str | None  # MODELSLIM, COMPRESSED_TENSORS, CONFIG or None
    kv_cache: str | None = None  # "C8" when the KV cache is int8
    # A quantization_config method vllm-ascend does not run (e.g. fp8 on A2): said in the plan's notes.
    unsupported_method: str | None = None
    # Per-weight schemes of a mixed ModelSlim checkpoint (e.g. W4A8_DYNAMIC experts, W8A8_DYNAMIC attention).
    mix: tuple[tuple[str, int], ...] = ()


def read_modelslim_description(data: Any, where: str = "quant_model_description.json") -> CheckpointQuantization:
    """ModelSlim's description: `model_quant_type`, `kv_cache_type` and one scheme (or FLOAT) per tensor, as
    vllm_ascend/quantization/modelslim_config.py reads it."""
    if not isinstance(data, Mapping):
        raise BadInputError(f"{where} is not a JSON object", "restore it from the quantized checkpoint's files")
    counts: Counter[str] = Counter()
    for key, value in data.items():
        if key.endswith(".weight") and isinstance(value, str) and value.upper() != "FLOAT":
            counts[value.upper()] += 1
    declared = data.get("model_quant_type")
    candidates = [str(declared)] if isinstance(declared, str) else []
    candidates += [name for name, _ in counts.most_common()]
    scheme = None
    for candidate in candidates:
        try:
            scheme = normalise_quantization(candidate)
            break
        except BadInputError:
            continue
    if scheme is None and candidates:
        raise BadInputError(f"{where} declares {candidates[0]!r}, which vllm-ascend does not register",
                            f"re-quantize with ModelSlim to one of {', '.join(scheme_names())}")
    kv = data.get("kv_cache_type")
    kv_cache = str(kv).upper() if isinstance(kv, str) and kv else None
    if kv_cache is not None and kv_cache not in kv_cache_schemes():
        raise BadInputError(f"{where}: kv_cache_type {kv!r} is not one vllm-ascend knows",
                            f"use {', '.join(kv_cache_schemes())} or drop kv_cache_type")
    return CheckpointQuantization(scheme, MODELSLIM if scheme else None, kv_cache, mix=tuple(counts.most_common()))


def _bits(args: Any) -> int | None:
    return int(args["num_bits"]) if isinstance(args, Mapping) and isinstance(args.get("num_bits"), int) else None


def _compressed_tensors_scheme(qc: Mapping[str, Any]) -> str | None:
    """The scheme vllm-ascend's compressed-tensors config detects for the first config group."""
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return None
    group = next(iter(groups.values()))
    if not isinstance(group, Mapping):
        return None
    weights, inputs = group.get("weights"), group.get("input_activations")
    w_bits, a_bits = _bits(weights), _bits(inputs)
    if inputs is None or a_bits is None:
        return {8: "W8A16", 4: "W4A16"}.get(w_bits or 0)
    dynamic = bool(inputs.get("dynamic"))
    if w_bits == a_bits == 8:
        if str(inputs.get("type", "int")).lower() == "float":
            return "W8A8FP8_DYNAMIC"
        return "W8A8_DYNAMIC" if dynamic else "W8A8"
    if w_bits == 4 and a_bits == 8:
        return "W4A8_DYNAMIC"
    return None


def read_quantization_config(cfg: Mapping[str, Any]) -> CheckpointQuantization:
    """config.json's quantization_config: compressed-tensors (LLM-Compressor), a ModelSlim-style method name, or
    a method vllm-ascend does not run (fp8 on A2/A3, GPTQ and AWQ: vllm-ascend has no kernels for them)."""
    qc = cfg.get("quantization_config")
    if not isinstance(qc, Mapping):
        return CheckpointQuantization(None, None)
    method = str(qc.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        scheme = _compressed_tensors_scheme(qc)
        if scheme is None:
            return CheckpointQuantization(None, None, unsupported_method="compressed-tensors (this scheme)")
        return CheckpointQuantization(scheme, COMPRESSED_TENSORS)
    if method == "ascend":  # a ModelSlim export that carries its type in config.json
        declared = qc.get("model_quant_type")
        if isinstance(declared, str):
            return CheckpointQuantization(normalise_quantization(declared), MODELSLIM)
    try:
        return CheckpointQuantization(normalise_quantization(method), CONFIG)
    except BadInputError:
        return CheckpointQuantization(None, None, unsupported_method=method or "unknown")
