"""npu-smi outputs of hardware beyond the A2/A3/310P servers: a 310B SoC board, a 310P vNPU, and the -9005 failure.

Each table is a real capture in tests/fixtures/ascend (its source on line 1).
"""

from __future__ import annotations

import pytest

from npuops.datafiles import load_data_toml
from npuops.hardware.chips import chip_by_name, parse_vnpu_name
from npuops.hardware.npu_smi import NpuSmiFailed, detect_npu_smi_failure, parse_npu_smi_info
from tests.support.captures import capture


def test_310b_board_has_no_bus_id_and_is_refused_for_serving() -> None:
    info = parse_npu_smi_info(capture("npu-smi-info_310b1_1.txt"))
    assert len(info.chips) == 1
    chip = info.chips[0]
    assert (chip.name, chip.bus_id, chip.pci_address) == ("310B1", "NA", None)
    assert (chip.memory_used_mb, chip.memory_total_mb, chip.hbm_total_mb) == (3841, 11577, None)
    assert chip.vnpu is None
    spec = chip_by_name(chip.name)
    assert spec is not None and spec.family == "310B"
    assert spec.vllm_ascend is False
    reason = spec.serving_refusal
    assert reason is not None and "\n" not in reason
    assert reason.startswith("vllm-ascend does not support") and "310B" in reason


def test_310p_vnpu_is_the_310p_family_and_virtual() -> None:
    info = parse_npu_smi_info(capture("npu-smi-info_310pvir01_1.txt"))
    chip = info.chips[0]
    assert (chip.npu_id, chip.name, chip.pci_address) == (7, "310Pvir01", "0000:00:07.0")
    assert (chip.memory_used_mb, chip.memory_total_mb) == (249, 2690)
    assert chip.vnpu is not None
    assert (chip.vnpu.template, chip.vnpu.aicores) == ("vir01", 1)
    spec = chip_by_name(chip.name)
    assert spec is not None and spec.family == "310P" and spec.serving_refusal is None


# Names printed in the same HAMi lab (vir02/vir04 rows; tests/fixtures/ascend/INDEX.md) and, for 910B4, an earlier
# version of it; AI cores from the lab's `npu-smi info -t template-info` capture.
@pytest.mark.parametrize(
    ("name", "family", "template", "aicores"),
    [("310Pvir01", "310P", "vir01", 1), ("310Pvir02", "310P", "vir02", 2), ("310Pvir04", "310P", "vir04", 4),
     ("910B4vir05_1c_8g", "A2", "vir05_1c_8g", None)],
)
def test_vnpu_names(name: str, family: str, template: str, aicores: int | None) -> None:
    vnpu = parse_vnpu_name(name)
    assert vnpu is not None and (vnpu.template, vnpu.aicores) == (template, aicores)
    spec = chip_by_name(name)
    assert spec is not None and spec.family == family


@pytest.mark.parametrize("name", ["310P3", "910B3", "Ascend910", "310B1", "xxx", "vir01"])
def test_whole_chips_are_not_vnpus(name: str) -> None:
    assert parse_vnpu_name(name) is None


# "npu get board type failed. ret is -9005" is the line npu-smi prints (its source: "npu get board type failed. ret is
# %d"), quoted in the field notes cited in npuops/data/npu_smi_errors.toml; no full public capture was found.
def test_error_9005_board_type_has_its_own_diagnosis() -> None:
    line = "npu get board type failed. ret is -9005"
    failure = detect_npu_smi_failure(line + "\n")
    entry = load_data_toml("npu_smi_errors.toml")
    assert failure is not None and failure.code == "-9005"
    assert (failure.meaning, failure.remediation) == (entry["codes"]["-9005"]["meaning"],
                                                      entry["codes"]["-9005"]["remediation"])
    assert failure.meaning != entry["unknown"]["meaning"]
    assert "board type" in failure.meaning
    assert "/dev/davinci_manager" in failure.remediation and "/usr/local/dcmi" in failure.remediation
    with pytest.raises(NpuSmiFailed) as raised:
        parse_npu_smi_info(line + "\n")
    assert raised.value.failure == failure and raised.value.line_no == 1
