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

    @property
    def memory_bytes(self) -> int:
        """Usable device memory as npu-smi reports it (MiB-based) when known, else the nominal GB."""
        if self.memory_mb_npu_smi is not None:
            return self.memory_mb_npu_smi * 1024 * 1024
        return self.memory_gb * 10**9

    @property
    def dtypes(self) -> tuple[str, ...]:
        return ("bfloat16", "float16") if self.bf16 else ("float16",)


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
        )
    return catalog


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "", name).lower()


def chip_by_name(name: str) -> ChipSpec | None:
    """Find a chip by its catalog name or by any name npu-smi shows for it (case-insensitive)."""
    wanted = _normalise(name)
    for spec in chip_catalog().values():
        if _normalise(spec.name) == wanted or any(_normalise(n) == wanted for n in spec.npu_smi_names):
            return spec
    return None


def chip_by_pci_device_id(device_id: str) -> list[ChipSpec]:
    """Every catalog chip with this PCI device id (several 910B variants share 0xd802)."""
    wanted = device_id.lower()
    if not wanted.startswith("0x"):
        wanted = "0x" + wanted
    return [spec for spec in chip_catalog().values() if spec.pci_device_id.lower() == wanted]


# Vendor PCI id of Huawei (Ascend NPUs sit behind it).
HUAWEI_PCI_VENDOR_ID = "0x19e5"
