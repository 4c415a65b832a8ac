"""Every engine of a disaggregated Ascend plan, as vLLM's own parser reads it (`vllm serve MODEL --config vllm.yaml`,
in the engine venv): the prefill and decode engines' kv_transfer_config for MooncakeConnectorV1 on A2 and A3, with
the per-role speculative settings, read back as the plan meant them. The connector itself is vllm-ascend's and
only loads on an NPU node; vLLM checks the config's fields and roles when it parses it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from npuops.launch.instance_files import LaunchSpec, render_pd_instances
from npuops.plan.catalog import load_model
from npuops.plan.disaggregation import plan_disaggregated
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.target import parse_hardware_spec
from tests.support.paths import REPO
from tests.support.vllm_args import PARSE_PRELUDE

pytestmark = [pytest.mark.engine]

PARSE_SCRIPT = PARSE_PRELUDE + r"""
out = []
for model, config in json.loads(sys.argv[1]):
    args, engine = engine_args(model, config)
    kv = engine.kv_transfer_config
    out.append({"kv_connector": kv.kv_connector, "kv_role": kv.kv_role, "kv_port": kv.kv_port,
                "is_producer": kv.is_kv_producer, "is_consumer": kv.is_kv_consumer,
                "extra": kv.kv_connector_extra_config, "speculative_config": engine.speculative_config,
                "tensor_parallel_size": engine.tensor_parallel_size, "port": args.port, "host": args.host})
print(json.dumps(out, default=str))
"""

CASES = {
    "qwen3-32b-a2": ("qwen3-32b", "910B3x8", "1:1", {}),
    "qwen3-8b-a2-2p1d": ("qwen3-8b", "910B3x8", "2:1", {}),
    "deepseek-mtp-a3": ("deepseek-v3", "Ascend910x16", "1:1", {"quantization": "W4A8_DYNAMIC",
                                                              "speculative": "mtp:3"}),
}


@pytest.fixture(scope="module")
def parsed(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, list, list]]:
    tmp = tmp_path_factory.mktemp("pd-args")
    out: dict[str, tuple[Any, list, list]] = {}
    cases = []
    for key, (name, hardware, shape, options) in CASES.items():
        (tmp / name).mkdir(exist_ok=True)
        options = dict(options)
        model = dataclasses.replace(load_model(name, options.pop("quantization", None)), path=tmp / name)
        pd, _colocated, _why = plan_disaggregated(model, parse_hardware_spec(hardware), Workload(2048, 256, 32),
                                                  PlanOptions(**options), shape)
        assert pd is not None
        engines = [f for f in render_pd_instances(pd, LaunchSpec(name="pd", port=9000)) if f.record.pd_role]
        paths = []
        for files in engines:
            (tmp / key / files.name).mkdir(parents=True)
            path = tmp / key / files.name / "vllm.yaml"
            path.write_text(files.file("vllm.yaml").text)
            paths.append((str(tmp / name), str(path)))
        cases += paths
        out[key] = (pd, engines, [])
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([str(engine_python), "-c", PARSE_SCRIPT, json.dumps(cases)], capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, f"vLLM refused a rendered PD config:\n{done.stderr[-4000:]}"
    results = iter(json.loads(done.stdout.strip().splitlines()[-1]))
    for _key, (_pd, engines, answers) in out.items():
        answers.extend(next(results) for _ in engines)
    return out


@pytest.mark.parametrize("key", list(CASES))
def test_vllm_reads_every_pd_engine_as_planned(parsed: dict[str, tuple[Any, list, list]], key: str) -> None:
    pd, engines, answers = parsed[key]
    seen_ports: set[int] = set()
    for files, answer in zip(engines, answers, strict=True):
        config = files.record
        pool = pd.prefill if config.pd_role == "prefill" else pd.decode
        assert answer["kv_connector"] == "MooncakeConnectorV1"
        assert answer["kv_role"] == pool.kv_role
        assert answer["is_producer"] is (config.pd_role == "prefill")
        assert answer["is_consumer"] is (config.pd_role == "decode")
        assert answer["extra"] == {"prefill": {"dp_size": 1, "tp_size": pd.prefill.tp},
                                   "decode": {"dp_size": 1, "tp_size": pd.decode.tp}}
        assert answer["tensor_parallel_size"] == pool.tp and answer["host"] == "127.0.0.1"
        # Each engine's handshake ports: its own, above Mooncake's transport range, disjoint from the others'.
        ports = set(range(int(answer["kv_port"]), int(answer["kv_port"]) + config.kv_port_span))
        assert int(answer["kv_port"]) == config.kv_port >= 20000 + pd.colocated.target.devices_per_node * 1000
        assert not ports & seen_ports
        seen_ports |= ports
        assert answer["speculative_config"] == pool.plan.server.speculative_config
    if key == "deepseek-mtp-a3":
        roles = {files.record.pd_role: a["speculative_config"] for files, a in zip(engines, answers, strict=True)}
        assert roles["prefill"]["num_speculative_tokens"] == 1 and roles["decode"]["num_speculative_tokens"] == 3
    if key == "qwen3-8b-a2-2p1d":
        assert [f.record.pd_role for f in engines] == ["prefill", "prefill", "decode"]
