"""Speculative decoding and vllm-ascend's options, as vLLM itself reads them.

1. vLLM's own parser (`vllm serve MODEL --config vllm.yaml`, in the engine venv) takes every vllm.yaml npuops renders
   with speculative_config, additional_config, a quantized checkpoint and full-graph capture sizes, for A2 and A3
   plans, and understands them as the plan meant.
2. `--speculative ngram:3` on the CPU target plans n-gram speculation (test_bench_speculative.py launches it: vLLM's
   /metrics count the drafts proposed and accepted, and npuops reads the rate from them).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from npuops.launch.instance_files import LaunchSpec, render_instances
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target, parse_hardware_spec
from tests.support.paths import REPO
from tests.support.vllm_args import PARSE_PRELUDE

pytestmark = [pytest.mark.engine]

PARSE_SCRIPT = PARSE_PRELUDE + r"""
out = []
for model, config in json.loads(sys.argv[1]):
    _args, engine = engine_args(model, config)
    comp = engine.compilation_config
    out.append({"speculative_config": engine.speculative_config, "additional_config": engine.additional_config,
                "quantization": engine.quantization,
                "cudagraph_capture_sizes": list(getattr(comp, "cudagraph_capture_sizes", None) or [])})
print(json.dumps(out, default=str))
"""


def vllm_yaml(plan: Any, out: Path) -> Path:
    files = render_instances(plan, LaunchSpec(name="spec", api_key="k"))
    path = out / "vllm.yaml"
    path.write_text(files[0].file("vllm.yaml").text)
    return path


def npu_plan(name: str, hardware: str, tmp_path: Path, **options: Any) -> Any:
    (tmp_path / name).mkdir(exist_ok=True)
    model = dataclasses.replace(load_model(name, options.pop("quantization", None)), path=tmp_path / name)
    return make_plan(model, parse_hardware_spec(hardware), Workload(1024, 256, concurrency=16), PlanOptions(**options))


CASES = {
    # MTP chosen by the plan (the checkpoint ships it), on W8A8_DYNAMIC weights (bf16 does not fit one A3 node)
    "deepseek-mtp-a3": ("deepseek-v3", "Ascend910x16", {"quantization": "W8A8_DYNAMIC"}),
    "qwen3-32b-ngram-a2": ("qwen3-32b", "910B3x8", {"speculative": "ngram:4", "quantization": "W8A8"}),
    "qwen3-8b-additional-a2": ("qwen3-8b", "910B4x1", {
        "additional": {"enable_shared_expert_dp": False, "xlite_graph_config": {"enabled": False}}}),
}


@pytest.fixture(scope="module")
def parsed_cases(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict]]:
    tmp_path = tmp_path_factory.mktemp("spec-args")
    plans, cases = {}, []
    for key, (name, hardware, options) in CASES.items():
        plan = npu_plan(name, hardware, tmp_path, **dict(options))
        out = tmp_path / key
        out.mkdir()
        plans[key] = plan
        cases.append((str(tmp_path / name), str(vllm_yaml(plan, out))))
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([str(engine_python), "-c", PARSE_SCRIPT, json.dumps(cases)], capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, f"vLLM refused a rendered config:\n{done.stderr[-4000:]}"
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    return {key: (plans[key], parsed[i]) for i, key in enumerate(CASES)}


@pytest.mark.parametrize("key", list(CASES))
def test_vllm_reads_the_rendered_speculative_and_ascend_options(parsed_cases: dict[str, tuple[Any, dict]],
                                                                key: str) -> None:
    plan, parsed = parsed_cases[key]
    assert parsed["speculative_config"] == plan.server.speculative_config
    assert parsed["additional_config"] == (plan.server.additional_config or {})
    assert parsed["quantization"] == plan.server.quantization
    sizes = (plan.server.compilation_config or {}).get("cudagraph_capture_sizes")
    if sizes:
        assert sorted(parsed["cudagraph_capture_sizes"]) == sorted(sizes)
    spec = plan.speculative
    if key == "deepseek-mtp-a3":
        assert spec is not None and spec.method == "mtp" and spec.chosen_by_plan
        assert all(size % (spec.num_tokens + 1) == 0 for size in sizes)
        assert parsed["additional_config"]["enable_cpu_binding"] is True
    if key == "qwen3-32b-ngram-a2":
        assert parsed["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4}
        assert parsed["quantization"] == "ascend"


def test_ngram_3_on_the_cpu_target_plans_the_speculative_config(tiny_model: Path) -> None:
    """The plan test_bench_speculative.py launches and serves with (there the engine's counters are asserted)."""
    model = load_model(str(tiny_model))
    target = cpu_target(8 << 30, 2, 1)
    plan = make_plan(model, target, Workload(64, 64, concurrency=1), PlanOptions(speculative="ngram:3"))
    assert plan.server.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
