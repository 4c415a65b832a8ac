"""Hardware specs, device subsets, the node model and the CPU target."""

from __future__ import annotations

import pytest

from npuops.errors import BadInputError
from npuops.plan.target import cpu_target, parse_device_list, parse_hardware_spec, target_from_node


@pytest.mark.parametrize(
    ("spec", "chip", "count", "family"),
    [
        ("910B3x8", "910B3", 8, "A2"),
        ("910b4X4", "910B4", 4, "A2"),
        ("310P3x2", "310P3", 2, "310P"),
        ("Ascend910x16", "Ascend910", 16, "A3"),
        ("ascend910b3*8", "910B3", 8, "A2"),
    ],
)
def test_specs(spec: str, chip: str, count: int, family: str) -> None:
    target = parse_hardware_spec(spec)
    assert target.chip is not None and target.chip.name == chip
    assert (target.devices_per_node, target.family, target.device_ids) == (count, family, tuple(range(count)))
    assert target.bandwidth_bytes_per_s and target.flops_per_s


@pytest.mark.parametrize(("spec", "bad_count"), [("910B9x8", False), ("910B3", False), ("x8", False),
                                                 ("910B3x0", True), ("910B3x99", True), ("", False)])
def test_bad_specs_name_the_known_chips(spec: str, bad_count: bool) -> None:
    with pytest.raises(BadInputError) as info:
        parse_hardware_spec(spec)
    # The fix, not the problem (which echoes the spec): the chip catalog, or the device counts a node can have.
    if bad_count:
        assert info.value.fix == "use 1 to 16"
    else:
        assert "known chips: " in info.value.fix and "910B3" in info.value.fix.split("known chips: ")[1]


def test_device_lists() -> None:
    assert parse_device_list("0-3,6") == (0, 1, 2, 3, 6)
    assert parse_device_list(" 5 , 1-2 ") == (1, 2, 5)
    for bad in ("0-", "3-1", "1,1", "a"):
        with pytest.raises(BadInputError):
            parse_device_list(bad)
    with pytest.raises(BadInputError, match="does not exist"):
        parse_device_list("0-8", available=8)
    # A huge range is refused before it is expanded (it would fill the memory first), with or without a node.
    for huge in ("0-99999999999", "99999999999999999999", "3,0-1000000000000000"):
        with pytest.raises(BadInputError, match="beyond any node's 64 devices"):
            parse_device_list(huge)
    with pytest.raises(BadInputError, match="device 99999999999 does not exist on a 16-device node"):
        parse_device_list("0-99999999999", available=16)


def test_devices_subset_and_nodes() -> None:
    target = parse_hardware_spec("910B3x8", nodes=2, devices="0-3")
    assert target.devices_per_node == 4 and target.device_ids == (0, 1, 2, 3) and target.total_devices == 8


def test_target_from_node_uses_npu_smi_memory() -> None:
    target = target_from_node("910B3", 8, 60 * 2**30)
    assert target.memory_bytes_per_device == 60 * 2**30 and target.chip is not None
    with pytest.raises(BadInputError, match="not in the chip catalog"):
        target_from_node("H100", 8)
    with pytest.raises(BadInputError):
        target_from_node("910B3", 0)


def test_cpu_target() -> None:
    target = cpu_target(64 * 2**30, 16, 2)
    assert target.kind == "cpu" and target.memory_bytes_per_device == 32 * 2**30 and target.family == "cpu"
    with pytest.raises(BadInputError):
        cpu_target(0, 1, 1)
    with pytest.raises(BadInputError, match="cpu_target"):
        parse_hardware_spec("cpu")
