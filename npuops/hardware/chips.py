"""The chip catalog: name -> facts, read from npuops/data/chips.toml (the single source of truth)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from npuops.datafiles import load_data_toml


@dataclass(frozen=True)
class ChipSpec:
    name: str
    family: str
    npu_smi_names: tuple[str, ...]
    memory_gb: int
    memory_mb_npu_smi: int | None
    bandwidth_gbps: float | None
    fp16_tflops: float
    tflops_estimated: bool
    bf16: bool
    soc_ids: tuple[int, int] | None
    pci_device_id: str
    vllm_ascend: bool
    chips_per_npu: int
    # Why vllm-ascend cannot serve this chip (one line, from chips.toml); None where it can.
    unsupported_why: str | None = None

    @property
    def memory_bytes(self) -> int:
        """Usable device memory as npu-smi reports it (MiB-based) when known, else the nominal GB."""
        if self.memory_mb_npu_smi is not None:
            return self.memory_mb_npu_smi * 1024 * 1024
        return self.memory_gb * 10**9

    @property
    def dtypes(self) -> tuple[str, ...]:
        return ("bfloat16", "float16") if self.bf16 else ("float16",)

    @property
    def serving_refusal(self) -> str | None:
        """The one-line reason vllm-ascend cannot serve this chip, or None if it can."""
        if self.vllm_ascend:
            return None
        return self.unsupported_why or f"vllm-ascend does not support {self.name} ({self.family})"


@lru_cache(maxsize=1)
def chip_catalog() -> dict[str, ChipSpec]:
    raw = load_data_toml("chips.toml")["chips"]
    catalog: dict[str, ChipSpec] = {}
    for name, facts in raw.items():
        soc = facts.get("soc_ids")
        catalog[name] = ChipSpec(
            name=name,
            family=facts["family"],
            npu_smi_names=tuple(facts["npu_smi_names"]),
            memory_gb=int(facts["memory_gb"]),
            memory_mb_npu_smi=facts.get("memory_mb_npu_smi"),
            bandwidth_gbps=facts.get("bandwidth_gbps"),
            fp16_tflops=float(facts["fp16_tflops"]),
            tflops_estimated=bool(facts["tflops_estimated"]),
            bf16=bool(facts["bf16"]),
            soc_ids=(int(soc[0]), int(soc[1])) if soc else None,
            pci_device_id=facts["pci_device_id"],
            vllm_ascend=bool(facts["vllm_ascend"]),
            chips_per_npu=int(facts["chips_per_npu"]),
            unsupported_why=facts.get("unsupported_why"),
        )
    return catalog


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "", name).lower()


def chip_by_name(name: str) -> ChipSpec | None:
    """Find a chip by its catalog name or by any name npu-smi shows for it (case-insensitive).

    A vNPU name ("310Pvir04") is the chip it is sliced from: its chip part is a chip name or, for 310P, the family.
    """
    spec = _spec_named(name)
    vnpu = parse_vnpu_name(name)
    if spec is None and vnpu is not None:
        spec = _spec_named(vnpu.chip) or next(
            (s for s in chip_catalog().values() if _normalise(s.family) == _normalise(vnpu.chip)), None
        )
    return spec


def _spec_named(name: str) -> ChipSpec | None:
    wanted = _normalise(name)
    for spec in chip_catalog().values():
        if _normalise(spec.name) == wanted or any(_normalise(n) == wanted for n in spec.npu_smi_names):
            return spec
    return None


@dataclass(frozen=True)
class VnpuName:
    """A hard-sliced virtual NPU as npu-smi names it: the chip part and the vNPU template ("310P", "vir04")."""

    chip: str
    template: str
    # AI cores of the template, where a source gives them; None otherwise.
    aicores: int | None


# npu-smi names a vNPU by its chip and template: "310Pvir01" (tests/fixtures/ascend/npu-smi-info_310pvir01_1.txt),
# "310Pvir02" and "310Pvir04" (same HAMi lab, Project-HAMi/website tutorials/labs/hami-ascend-vnpu-slicing.md), and on
# 910B "910B4vir05_1c_8g" (an earlier version of that lab).
_VNPU_RE = re.compile(r"(?P<chip>[0-9A-Za-z]+?)(?P<template>vir[0-9]{2}(?:_[0-9A-Za-z]+)*)")
# AI cores per 310P template, from the `npu-smi info -t template-info` capture of a 310P3 in the same lab (its
# AICORE column; HAMi's 310P3 config gives vir01/vir02/vir04 aiCore 1/2/4 too). Other chips' templates are not here.
_TEMPLATE_AICORES = {
    "310P": {
        "vir01": 1,
        "vir02": 2,
        "vir02_1c": 2,
        "vir04": 4,
        "vir04_3c": 4,
        "vir04_3c_ndvpp": 4,
        "vir04_4c_dvpp": 4,
    },
}


def parse_vnpu_name(name: str) -> VnpuName | None:
    """The chip part and template of a vNPU name such as "310Pvir04", or None if `name` is no vNPU name."""
    match = _VNPU_RE.fullmatch(name.strip())
    if match is None:
        return None
    chip, template = match.group("chip"), match.group("template")
    return VnpuName(chip, template, _TEMPLATE_AICORES.get(chip, {}).get(template))


def chip_by_pci_device_id(device_id: str) -> list[ChipSpec]:
    """Every catalog chip with this PCI device id (several 910B variants share 0xd802)."""
    wanted = device_id.lower()
    if not wanted.startswith("0x"):
        wanted = "0x" + wanted
    return [spec for spec in chip_catalog().values() if spec.pci_device_id.lower() == wanted]


# Vendor PCI id of Huawei (Ascend NPUs sit behind it).
HUAWEI_PCI_VENDOR_ID = "0x19e5"
