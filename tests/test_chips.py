from __future__ import annotations

import pytest

from npuops.hardware.chips import chip_by_name, chip_by_pci_device_id, chip_catalog


def test_catalog_facts_match_the_reference_table() -> None:
    cat = chip_catalog()
    assert cat["910B3"].fp16_tflops == pytest.approx(294.9)
    assert cat["910B4"].memory_gb == 32 and cat["910B4"].bandwidth_gbps == 800
    assert cat["310P3"].bf16 is False and cat["310P3"].dtypes == ("float16",)
    assert cat["Ascend910"].family == "A3" and cat["Ascend910"].chips_per_npu == 2
    assert cat["910A"].vllm_ascend is False
    assert cat["310B"].vllm_ascend is False and cat["310B"].family == "310B"
    for spec in cat.values():
        assert spec.family in {"A1", "A2", "A3", "310P", "310B"}
        assert spec.memory_bytes > 0
        # A chip vllm-ascend cannot serve carries its one-line reason; one it can serve has none.
        refusal = spec.serving_refusal
        assert (refusal is None) == spec.vllm_ascend
        assert refusal is None or (refusal.startswith("vllm-ascend does not support") and "\n" not in refusal)


@pytest.mark.parametrize(
    ("npu_smi_name", "family"),
    [("910B1", "A2"), ("910B2C", "A2"), ("910B3", "A2"), ("910B4", "A2"), ("Ascend910", "A3"),
     ("310P3", "310P"), ("910ProB", "A1"), ("910b3", "A2"), ("310B1", "310B"), ("310Pvir01", "310P")],
)
def test_every_name_seen_in_the_captures_is_known(npu_smi_name: str, family: str) -> None:
    spec = chip_by_name(npu_smi_name)
    assert spec is not None and spec.family == family


def test_unknown_and_redacted_names() -> None:
    assert chip_by_name("xxx") is None
    assert chip_by_name("H100") is None


def test_pci_ids() -> None:
    assert {s.family for s in chip_by_pci_device_id("d802")} == {"A2"}
    assert [s.name for s in chip_by_pci_device_id("0xD803")] == ["Ascend910"]
    assert chip_by_pci_device_id("0x1234") == []
