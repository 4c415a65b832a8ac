"""The node_exporter textfile the doctor writes, read back by Prometheus' own text parser: label values that come
from a vendor tool (a chip's name, its PCIe bus id) with quotes, backslashes, newlines or braces in them are
escaped by the exposition format's rules, never break a line or add a series."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from npuops.doctor.report import prometheus_registry
from npuops.doctor.runner import DoctorReport
from tests.support.captures import capture
from tests.support.nodes import bare_node

HOSTILE = st.one_of(st.text(max_size=40),
                    st.lists(st.sampled_from(['"', "\\", "\n", "}", "{", ",", "=", "# HELP x", "é", " "]),
                             max_size=10).map("".join))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=HOSTILE, bus=HOSTILE)
def test_hostile_chip_labels_come_back_as_they_went_in(tmp_path: Path, name: str, bus: str) -> None:
    node = bare_node(tmp_path, npu_smi=capture("npu-smi-info_910b1_8dev_busy_elided_1.txt"))
    chips = [dataclasses.replace(c, smi=dataclasses.replace(c.smi, name=name, bus_id=bus)) for c in node.chips]
    node = dataclasses.replace(node, chips=tuple(chips))
    text = generate_latest(prometheus_registry(DoctorReport(outcomes=(), duration_s=0.0), node)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    health = families["npu_chip_info_health_status"].samples
    assert len(health) == len(chips)
    for sample, chip in zip(health, chips, strict=True):
        assert sample.labels == {"id": str(chip.device_id), "model_name": name, "pcie_bus_info": bus}
