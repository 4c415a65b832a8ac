"""Environment variables of a plan, version-gated on the vllm-ascend release (rules in data/env_rules.toml)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.errors import BadInputError

# HCCL buffer (MB) for expert-parallel all-to-all: 1024+ for MoE with EP (vllm-ascend's DeepSeek tutorials set
# HCCL_BUFFSIZE=1024; vllm-ascend #2674: below it the MoE dispatch reports "HCCL_BUFFSIZE is too SMALL").
MOE_EP_HCCL_BUFFSIZE_MB = 1024
# HCCL's own default buffer per communication domain (CANN env reference, HCCL_BUFFSIZE).
HCCL_DEFAULT_BUFFSIZE_MB = 200

_WHEN = ("always", "collective", "moe_ep")


@dataclass(frozen=True)
class EnvRule:
    name: str
    value: str
    since: str
    removed_in: str | None
    when: str
    why: str
    seed: str | None


@dataclass(frozen=True)
class EnvSetting:
    name: str
    value: str
    why: str
    seed: str | None


RC, FINAL = 0, 1  # Release.stage


@dataclass(frozen=True, order=True)
class Release:
    """A vllm-ascend version, ordered like PEP 440 for the forms releases use (X.Y.Z, X.Y.ZrcN, .postN)."""

    numbers: tuple[int, int, int]
    stage: int  # RC (pre-release) or FINAL
    serial: int
    text: str = ""

    def __str__(self) -> str:
        return self.text


def parse_release(text: str) -> Release:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:(rc)(\d+)|\.post(\d+))?", text.strip())
    if match is None:
        raise BadInputError(
            f"vllm-ascend version {text!r} is not a release number",
            f"write it like 0.9.1, 0.22.1rc1 or 0.23.0; known releases: {', '.join(known_releases())}",
        )
    major, minor, patch = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
    if match.group(4):
        return Release((major, minor, patch), RC, int(match.group(5)), text.strip())
    return Release((major, minor, patch), FINAL, int(match.group(6) or 0), text.strip())


@lru_cache(maxsize=1)
def _rules_data() -> dict[str, Any]:
    return load_data_toml("env_rules.toml")


def known_releases() -> list[str]:
    return [str(r) for r in _rules_data()["known_releases"]]


def default_release() -> str:
    return str(_rules_data()["default_release"])


@lru_cache(maxsize=1)
def env_rules() -> tuple[EnvRule, ...]:
    rules = []
    for raw in _rules_data()["env"]:
        when = str(raw.get("when", "always"))
        if when not in _WHEN:
            raise ValueError(f"env_rules.toml: {raw['name']} has unknown when={when!r}")
        rules.append(
            EnvRule(
                name=str(raw["name"]),
                value=str(raw["value"]),
                since=str(raw["since"]),
                removed_in=str(raw["removed_in"]) if "removed_in" in raw else None,
                when=when,
                why=str(raw["why"]),
                seed=str(raw["seed"]) if "seed" in raw else None,
            )
        )
    return tuple(rules)


def _in_range(release: Release, since: str, removed_in: str | None) -> bool:
    if release < parse_release(since):
        return False
    return removed_in is None or release < parse_release(removed_in)


def feature_available(feature: str, release: str) -> bool:
    raw = _rules_data()["features"][feature]
    return _in_range(parse_release(release), str(raw["since"]), raw.get("removed_in"))


def environment_for(
    release: str, *, collective: bool, moe_ep: bool, devices: tuple[int, ...] | None
) -> list[EnvSetting]:
    """The variables a release gets for a plan with these traits; the device mask comes last."""
    version = parse_release(release)
    active = {"always": True, "collective": collective, "moe_ep": moe_ep}
    settings: list[EnvSetting] = []
    for rule in env_rules():
        if not active[rule.when] or not _in_range(version, rule.since, rule.removed_in):
            continue
        value = rule.value.format(hccl_buffsize=MOE_EP_HCCL_BUFFSIZE_MB, devices="")
        settings.append(EnvSetting(rule.name, value, rule.why, rule.seed))
    if devices is not None:
        settings.append(
            EnvSetting(
                "ASCEND_RT_VISIBLE_DEVICES",
                ",".join(str(d) for d in devices),
                "the device mask (CUDA_VISIBLE_DEVICES' analogue): this instance sees only its own NPUs",
                None,
            )
        )
    return settings


def hccl_buffsize_mb(settings: list[EnvSetting]) -> int:
    for setting in settings:
        if setting.name == "HCCL_BUFFSIZE":
            return int(setting.value)
    return HCCL_DEFAULT_BUFFSIZE_MB
