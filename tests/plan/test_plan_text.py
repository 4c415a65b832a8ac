"""`npuops plan`'s text as an operator reads it in a terminal: every catalog model on three targets, at
COLUMNS=100 (and wider asked for: still 100). No line over 100 columns, no Python repr (None, True, dicts with
quotes), no value cut short, each setting's value said once and the same wherever it appears, the memory line's
parts adding up to what it calls usable, memory in GiB/MiB only."""

from __future__ import annotations

import json
import re

import pytest

from npuops.errors import BadInputError
from npuops.plan.catalog import catalog_names, load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.result import Plan
from npuops.plan.target import cpu_target, parse_hardware_spec
from npuops.plan.text import render_plan_text, typed_value

TARGETS = {
    "cpu-24GiB": lambda: cpu_target(24 * 2**30, 8, 1),
    "910B3x8": lambda: parse_hardware_spec("910B3x8"),
    "Ascend910x16": lambda: parse_hardware_spec("Ascend910x16"),
}
WORKLOAD = Workload(512, 128, concurrency=16)
# What a Python repr looks like in text: None/True/False as words, a dict or list with quoted keys (not a value's
# own spelling: PYTORCH_NPU_ALLOC_CONF=expandable_segments:True is typed so).
REPR = re.compile(r"(?<![:\w])(?:None|True|False)\b|\{'|\['")
# A size in decimal units ("26.0 GB") beside binary ones ("24.2 GiB") reads as two different values (a rate, GB/s,
# is a bandwidth's own unit).
DECIMAL_SIZE = re.compile(r"\d\s?[KMGT]B\b(?!/s)")


def _plans() -> list[tuple[str, str, Plan | BadInputError]]:
    out: list[tuple[str, str, Plan | BadInputError]] = []
    for name in catalog_names():
        for label, target in TARGETS.items():
            try:
                out.append((name, label, make_plan(load_model(name), target(), WORKLOAD, PlanOptions())))
            except BadInputError as refused:
                out.append((name, label, refused))
    return out


PLANS = _plans()


@pytest.mark.parametrize(("model", "target", "plan"), PLANS, ids=[f"{m}-{t}" for m, t, _ in PLANS])
def test_the_plan_reads_at_100_columns(model: str, target: str, plan: Plan | BadInputError,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if isinstance(plan, BadInputError):  # refused: one line with its fix
        assert "\n" not in plan.one_line() and plan.fix, plan.one_line()
        return
    monkeypatch.setenv("COLUMNS", "160")
    text = render_plan_text(plan)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert not REPR.search(text), REPR.search(text)
    assert not DECIMAL_SIZE.search(text), DECIMAL_SIZE.search(text)
    flat = " ".join(text.split())  # the text unwrapped: a value is whole in it, never cut
    for e in plan.to_json()["explanations"]:
        shown = typed_value(e["value"])
        assert f"{e['key']} {shown}" in flat, (e["key"], shown)
    # Each environment variable has one value in the whole text, the one the plan sets.
    env = plan.to_json()["env"]
    for name, value in env.items():
        # Its row says "env.NAME value" (checked above); prose says NAME=value.
        mentioned = set(re.findall(rf"\b{re.escape(name)}=(\S+?)[),;:]?(?=\s|$)", flat))
        assert mentioned <= {str(value)}, (name, value, mentioned)


@pytest.mark.parametrize(("model", "target", "plan"), PLANS, ids=[f"{m}-{t}" for m, t, _ in PLANS])
def test_the_memory_line_adds_up(model: str, target: str, plan: Plan | BadInputError) -> None:
    if isinstance(plan, BadInputError):
        return
    m = plan.to_json()["memory"]
    parts = (m["weights_bytes_per_device"] + m["activation_bytes"] + m["graph_bytes"] + m["runtime_bytes"]
             + m["kv_budget_bytes"])
    assert parts <= m["usable_bytes"] * 1.001 <= m["device_bytes"] * 1.001, m
    assert m["usable_bytes"] - parts <= 0.02 * m["device_bytes"], m  # no part left out of the line


def test_values_are_shown_as_an_operator_types_them() -> None:
    assert typed_value(True) == "true" and typed_value(False) == "false" and typed_value(None) == "(not set)"
    assert typed_value(0.9) == "0.9" and typed_value(128) == "128" and typed_value("AIV") == "AIV"
    config = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [2, 4]}
    assert json.loads(typed_value(config)) == config  # what --compilation-config takes
    assert typed_value(config) == '{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [2, 4]}'


def test_the_deepseek_w4a8_plan_states_one_hccl_buffer() -> None:
    """It explained HCCL_BUFFSIZE=1024 for expert parallel and set 1728 two rows later."""
    plan = make_plan(load_model("deepseek-v3", "W4A8_DYNAMIC"), parse_hardware_spec("910B3x8"), Workload(512, 128))
    flat = " ".join(render_plan_text(plan).split())
    size = plan.to_json()["env"]["HCCL_BUFFSIZE"]
    assert set(re.findall(r"HCCL_BUFFSIZE[= ](\d+)", flat)) == {str(size)}
    assert f"env.HCCL_BUFFSIZE {size}" in flat


def test_the_cpu_plan_fits_what_fits_and_its_refusal_fix_works() -> None:
    """On a 24 GiB host qwen3-8b's weights fit: the default KV budget must fit beside them; a model whose
    weights do not fit is refused with a fix that names what would."""
    host = cpu_target(24 * 2**30, 8, 1)
    plan = make_plan(load_model("qwen3-8b"), host, Workload(512, 128))
    m = plan.memory
    assert m.kv_cache_tokens >= 640 and m.weights_bytes + m.kv_budget_bytes < 24 * 2**30
    with pytest.raises(BadInputError) as too_big:
        make_plan(load_model("qwen3-8b"), host, Workload(512, 128),
                  PlanOptions(kv_cache_memory_bytes=8 * 2**30))
    fix = too_big.value.fix
    largest = int(re.search(r"--kv-cache-memory-bytes (\d+)", fix).group(1))  # type: ignore[union-attr]
    followed = make_plan(load_model("qwen3-8b"), host, Workload(512, 128),
                         PlanOptions(kv_cache_memory_bytes=largest))
    assert followed.memory.kv_cache_tokens >= 640
    with pytest.raises(BadInputError) as no_room:
        make_plan(load_model("qwen2.5-72b-instruct"), host, Workload(512, 128))
    assert "GiB" in no_room.value.one_line() and "--kv-cache-memory-bytes" not in no_room.value.fix


@pytest.mark.parametrize(("model", "hardware", "shape"), [("qwen3-8b", "910B3x8", "1:1"),
                                                         ("deepseek-v3", "910B3x8", "1:1")])
def test_a_disaggregated_plan_reads_at_100_columns(model: str, hardware: str, shape: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from npuops.plan.disaggregation import plan_disaggregated
    from npuops.plan.text import render_pd_text

    monkeypatch.setenv("COLUMNS", "160")
    try:
        pd, _colocated, why = plan_disaggregated(load_model(model), parse_hardware_spec(hardware), WORKLOAD,
                                                 PlanOptions(), shape)
    except BadInputError as refused:
        assert "\n" not in refused.one_line()
        return
    assert pd is not None
    text = render_pd_text(pd, why)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert not REPR.search(text), REPR.search(text)
    flat = " ".join(text.split())
    for role, config in pd.to_json()["kv_transfer_config"].items():
        assert f"{role}: {typed_value(config)}" in flat  # the JSON --kv-transfer-config takes, whole
