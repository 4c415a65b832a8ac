"""vllm-ascend's `--additional-config`: the keys a plan writes, and the operator's, checked against the release.

The table of keys per release is npuops/data/additional_config.toml. A plan writes a key only where it helps
(`plan_additional_config`): vllm-ascend's own CPU binding on the ARM servers of A2/A3 (it replaces torch_npu's
CPU_AFFINITY_CONF, which the environment rules stop writing from the same release), and the shared expert on its own
stream for an expert-parallel MoE model with shared experts. The operator's keys (`--additional-config JSON`) are
merged over the plan's; a key the release does not have (removed, like `torchair_graph_config`, or not yet there)
is refused in one line with what to use instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.errors import BadInputError
from npuops.plan.environment import parse_release
from npuops.plan.model import ModelArch

_TYPES: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "str": (str,), "dict": (dict,),
                                       "list": (list,)}


@dataclass(frozen=True)
class ConfigKey:
    name: str
    since: str
    removed_in: str | None
    type: str
    why: str
    instead: str | None

    def in_release(self, release: str) -> bool:
        version = parse_release(release)
        if version < parse_release(self.since):
            return False
        return self.removed_in is None or version < parse_release(self.removed_in)


@lru_cache(maxsize=1)
def config_keys() -> dict[str, ConfigKey]:
    return {name: ConfigKey(name, str(raw["since"]), raw.get("removed_in"), str(raw["type"]), str(raw["why"]),
                            raw.get("instead"))
            for name, raw in load_data_toml("additional_config.toml")["keys"].items()}


def check_keys(settings: Mapping[str, Any], release: str) -> None:
    """Refuse a key this release does not read, or a value of the wrong type."""
    keys = config_keys()
    for name, value in settings.items():
        key = keys.get(name)
        if key is None:
            close = difflib.get_close_matches(name, list(keys), n=2)
            hint = f"did you mean {' or '.join(close)}?" if close else "see vllm-ascend's additional_config guide"
            raise BadInputError(f"--additional-config: vllm-ascend has no key {name!r}", hint)
        if key.removed_in and parse_release(release) >= parse_release(key.removed_in):
            raise BadInputError(f"--additional-config: {name} was removed in vllm-ascend {key.removed_in} "
                                f"(the plan is for {release})", key.instead or f"drop {name}")
        if not key.in_release(release):
            raise BadInputError(f"--additional-config: {name} arrived in vllm-ascend {key.since} (the plan is for "
                                f"{release})", f"use --vllm-ascend-version {key.since} or later, or drop {name}")
        if not isinstance(value, _TYPES[key.type]) or (key.type == "int" and isinstance(value, bool)):
            raise BadInputError(f"--additional-config: {name} takes a {key.type}, got {value!r}",
                                f"write {name} as a JSON {key.type}")


@dataclass(frozen=True)
class AdditionalSetting:
    key: str
    value: Any
    why: str


# What a 310P's graph capture needs switched off, by release (vllm-ascend's 310P guide of 0.20.2rc1 and its
# Qwen3-Dense tutorial of 0.23.0, whose 300I DUO commands pass exactly these): npugraph_ex "is not supported on this
# platform" from 0.23.0; before it the guide turned off the norm-quant fusion.
NPUGRAPH_EX_310P_SINCE = "0.23.0"


def _graph_310p(release: str) -> AdditionalSetting:
    if parse_release(release) >= parse_release(NPUGRAPH_EX_310P_SINCE):
        return AdditionalSetting("ascend_compilation_config", {"enable_npugraph_ex": False},
                                 "Atlas 300I DUO captures ACL graphs without npugraph_ex, which the 310P does not "
                                 "support (vllm-ascend's 300I DUO commands pass this)")
    return AdditionalSetting("ascend_compilation_config", {"fuse_norm_quant": False},
                             "Atlas 300I DUO captures ACL graphs without the norm-quant fusion (vllm-ascend's 310P "
                             "guide passes this with FULL_DECODE_ONLY)")


def plan_additional_config(*, family: str, release: str, arch: ModelArch, moe_ep: bool,
                           operator: Mapping[str, Any], graph: bool = False) -> tuple[AdditionalSetting, ...]:
    """The keys this plan writes, each with why; the operator's keys last (they win)."""
    keys = config_keys()
    chosen: dict[str, AdditionalSetting] = {}
    if family == "310P" and graph and keys["ascend_compilation_config"].in_release(release):
        chosen["ascend_compilation_config"] = _graph_310p(release)
    if family in ("A2", "A3") and keys["enable_cpu_binding"].in_release(release):
        chosen["enable_cpu_binding"] = AdditionalSetting(
            "enable_cpu_binding", True,
            "Atlas 800 A2/A3 servers are ARM (Kunpeng) hosts: vllm-ascend binds each NPU process's threads to "
            "the cores of its NPU's NUMA node (vllm-ascend #6966: 9.9 ms TPOT with binding, 11.8 ms without); "
            "written even where it is the default (from 0.18.0rc1) so the plan says it, and instead of torch_npu's "
            "CPU_AFFINITY_CONF, which would bind the same threads a second time")
    if (moe_ep and (arch.num_shared_experts or arch.shared_expert_intermediate_size)
            and keys["multistream_overlap_shared_expert"].in_release(release)):
        chosen["multistream_overlap_shared_expert"] = AdditionalSetting(
            "multistream_overlap_shared_expert", True,
            "the shared expert runs on a second stream while the routed experts wait for their all-to-all, "
            "hiding its time (off by default; vllm-ascend's DeepSeek and GLM tutorials turn it on)")
    check_keys(operator, release)
    for name, value in operator.items():
        chosen[name] = AdditionalSetting(name, value, f"as asked ({keys[name].why})")
    return tuple(chosen.values())


def as_config(settings: tuple[AdditionalSetting, ...]) -> dict[str, Any] | None:
    return {s.key: s.value for s in settings} or None
