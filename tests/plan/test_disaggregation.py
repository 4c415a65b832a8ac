"""`npuops plan --pd P:D`: the pools, the connector and its ports, the per-role speculative settings, the pair's
prediction against the co-located plan, and every refusal as one line with its fix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from npuops.errors import BadInputError
from npuops.launch.instance_files import LaunchSpec, render_pd_instances
from npuops.plan.catalog import load_model
from npuops.plan.disaggregation import (
    EXAMPLE_CONNECTOR,
    MOONCAKE_CONNECTOR,
    PdShape,
    kv_port_ranges,
    parse_pd,
    plan_disaggregated,
    predict_pd,
    transport_range,
)
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.target import cpu_target, parse_hardware_spec
from tests.support.model_dirs import write_tiny_model
from tests.support.npuops_cli import npuops

LOAD = Workload(2048, 512, concurrency=32)


def _pd(model: str, hardware: str, shape: str = "1:1", load: Workload = LOAD, **options: object):
    pd, colocated, why = plan_disaggregated(load_model(model, options.pop("quantization", None)),  # type: ignore[arg-type]
                                            parse_hardware_spec(hardware), load, PlanOptions(**options), shape)
    return pd, colocated, why


def test_parse_pd_shapes_and_refusals() -> None:
    assert parse_pd("1:1") == PdShape(1, 1) and parse_pd(" 2 : 1 ") == PdShape(2, 1)
    assert parse_pd("auto") is None
    for bad in ("1", "1:0", "a:b", "17:1", ""):
        with pytest.raises(BadInputError) as caught:
            parse_pd(bad)
        assert "--pd" in caught.value.problem and caught.value.fix


def test_an_a2_pair_splits_the_chips_and_gives_each_engine_its_connector() -> None:
    pd, colocated, _why = _pd("qwen3-32b", "910B3x8")
    assert pd is not None and pd.connector == MOONCAKE_CONNECTOR
    prefill, decode = pd.pools
    assert prefill.plan.replicas[0].devices == (0, 1, 2, 3) and decode.plan.replicas[0].devices == (4, 5, 6, 7)
    assert prefill.tp == decode.tp == 4
    producer, consumer = prefill.plan.server.kv_transfer_config, decode.plan.server.kv_transfer_config
    assert producer is not None and consumer is not None
    assert producer["kv_role"] == "kv_producer" and consumer["kv_role"] == "kv_consumer"
    assert producer["kv_connector_extra_config"] == {"prefill": {"dp_size": 1, "tp_size": 4},
                                                     "decode": {"dp_size": 1, "tp_size": 4}}
    # Above Mooncake's AscendDirectTransport range of 8 NPUs (20000-27999), one port per device, disjoint.
    assert transport_range(8) == range(20000, 28000)
    assert [(r.start, r.stop) for r in prefill.kv_ports + decode.kv_ports] == [(28000, 28004), (28004, 28008)]
    assert producer["kv_port"] == "28000" and consumer["kv_port"] == "28004"
    for pool in pd.pools:
        assert pool.plan.env["HCCL_INTRA_ROCE_ENABLE"] == "1"
    # The prefill pool is sized for whole prompts and one output token, accepting the decode pool's longest request.
    assert prefill.plan.workload.output_len == 1
    assert prefill.plan.server.max_model_len == decode.plan.server.max_model_len
    # The decode pool's TPOT has no prompts in its steps: lower than the co-located engine's at this load.
    assert pd.prediction.tpot_ms < colocated.prediction.tpot_ms
    assert pd.prediction.ttft_ms > pd.prediction.prefill_ms + pd.prediction.transfer_ms


def test_an_a3_pair_sets_its_environment_and_ports_above_sixteen_dies() -> None:
    pd, _colocated, _why = _pd("qwen3-235b-a22b", "Ascend910x16", quantization="W8A8_DYNAMIC")
    assert pd is not None
    assert pd.prefill.kv_ports[0].start == 36000  # 20000 + 16 x 1000: vllm-ascend's own A3 examples use 36000
    assert pd.decode.plan.env["ASCEND_A3_ENABLE"] == "1"


def test_mtp_runs_k1_on_prefill_and_the_plans_k_on_decode() -> None:
    pd, _colocated, _why = _pd("deepseek-v3", "Ascend910x16", quantization="W4A8_DYNAMIC", speculative="mtp:3")
    assert pd is not None
    assert pd.decode.plan.server.speculative_config == {"method": "mtp", "num_speculative_tokens": 3}
    assert pd.prefill.plan.server.speculative_config == {"method": "mtp", "num_speculative_tokens": 1}
    pd, _colocated, _why = _pd("qwen3-32b", "910B3x8", speculative="ngram:4")
    assert pd is not None and pd.prefill.plan.server.speculative_config is None


def test_kv_ports_inside_the_transport_range_or_hccls_are_refused() -> None:
    with pytest.raises(BadInputError) as caught:
        kv_port_ranges([4, 4], 8, 21000, npu=True)
    assert "AscendDirectTransport range 20000-27999" in caught.value.problem and "28000" in caught.value.fix
    with pytest.raises(BadInputError) as caught:
        kv_port_ranges([8, 8], 16, 59990, npu=True)
    assert "HCCL's host socket ports 60000-60031" in caught.value.problem
    assert [r.start for r in kv_port_ranges([2, 2, 4], 8, 40000, npu=True)] == [40000, 40002, 40004]


def test_a_cpu_pair_binds_each_engine_to_its_own_cores_and_shares_a_directory(tmp_path: Path) -> None:
    model = load_model(str(write_tiny_model(tmp_path / "tiny")))
    pd, _colocated, _why = plan_disaggregated(model, cpu_target(16 << 30, 4, 1), Workload(128, 16, concurrency=4),
                                              PlanOptions(), "1:1")
    assert pd is not None and pd.connector == EXAMPLE_CONNECTOR
    assert [r.cpus for pool in pd.pools for r in pool.plan.replicas] == ["0-1", "2-3"]
    files = render_pd_instances(pd, LaunchSpec(name="pair", port=9000))
    assert [f.name for f in files] == ["pair-p0", "pair-d0", "pair"]
    shared = "/var/lib/npuops-pair-kv"
    for engine, role in zip(files[:2], ("prefill", "decode"), strict=True):
        assert engine.record.pd_role == role and engine.record.behind == "pair"
        assert engine.record.kv_shared_path == shared
        assert f'shared_storage_path\\":\\"{shared}' in engine.file("vllm.yaml").text
        assert f"StateDirectory=npuops-{engine.name} npuops-pair-kv" in engine.file(engine.unit_name).text
    router = files[-1]
    argv = json.loads(router.file("router.json").text)["argv"]
    assert argv[:5] == ["--vllm-pd-disaggregation", "--prefill", "http://127.0.0.1:9001", "--decode",
                        "http://127.0.0.1:9002"]
    assert router.record.pd_role is None and router.record.replicas == ("pair-p0", "pair-d0")


def test_pd_auto_keeps_the_colocated_plan_on_the_cpu_and_says_why(tmp_path: Path) -> None:
    model = load_model(str(write_tiny_model(tmp_path / "tiny")))
    pd, colocated, why = plan_disaggregated(model, cpu_target(16 << 30, 4, 1), Workload(128, 16, concurrency=4),
                                            PlanOptions(), "auto")
    assert pd is None and colocated.replicas and "co-located" in why and "ExampleConnector" in why


def test_pd_auto_on_npus_chooses_a_shape_only_when_it_wins() -> None:
    pd, colocated, why = _pd("qwen3-32b", "910B3x8", "auto")
    if pd is None:
        assert "co-located" in why
    else:
        assert why.startswith(f"--pd auto chose {pd.shape}")
        assert pd.prediction.output_tokens_per_s > colocated.prediction.output_tokens_per_s
        assert pd.prediction.tpot_ms <= colocated.prediction.tpot_ms


def test_the_pair_is_bound_by_prefill_when_one_engine_prefills_for_many_decoders() -> None:
    pd, _colocated, _why = _pd("qwen3-8b", "910B3x8", "1:3", load=Workload(8192, 64, concurrency=64))
    assert pd is not None and pd.prediction.prefill_bound
    again = predict_pd(pd.prefill.plan.perf, dataclasses.replace(pd.decode.plan.perf, concurrency=64))
    assert again == pd.prediction


@pytest.mark.parametrize(("argv", "problem"), [
    (["plan", "qwen3-32b", "--hardware", "910B3x8", "--pd", "5:4"], "--pd 5:4: 9 engines"),
    (["plan", "qwen3-32b", "--hardware", "910B3x8", "--pd", "1:1", "--kv-port", "20500"], "AscendDirectTransport"),
    (["plan", "qwen3-32b", "--hardware", "910B3x8", "--kv-port", "30000"], "--kv-port is for a disaggregated plan"),
    (["plan", "qwen3-32b", "--hardware", "910B3x8", "--pd", "one"], "is not P:D"),
    (["plan", "qwen3-32b", "--hardware", "910B3x8", "--nodes", "3", "--pd", "1:1"], "one pool per node: 2 nodes"),
    (["plan", "qwen3-32b", "--hardware", "910B3x8", "--pd", "1:1", "--dp", "2"], "--dp and --pd"),
])
def test_refusals_are_one_line_with_the_fix(argv: list[str], problem: str) -> None:
    done = npuops(*argv)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "fix:" in line
    assert problem in line, line


def test_plan_pd_prints_both_pools_and_json() -> None:
    done = npuops(*["plan", "qwen3-32b", "--hardware", "910B3x8", "--pd", "1:1", "--concurrency", "32"])
    assert done.returncode == 0, done.stderr
    for text in ("prefill pool: 1 engine(s) of TP 4", "decode pool: 1 engine(s) of TP 4", "MooncakeConnectorV1",
                 "HCCL_INTRA_ROCE_ENABLE=1", "Co-located on the same chips"):
        assert text in done.stdout, done.stdout
    data = json.loads(npuops(*["plan", "qwen3-32b", "--hardware", "910B3x8", "--pd", "1:1", "--json"]).stdout)
    assert data["disaggregated"]["shape"] == "1:1" and data["colocated"]["config"]
    assert data["disaggregated"]["kv_transfer_config"]["decode"]["kv_role"] == "kv_consumer"


def test_the_example_connector_hands_over_whole_blocks_of_all_but_the_last_token() -> None:
    from npuops.plan.disaggregation import recomputed_tokens

    # Measured on the CPU engine (128-token blocks): a 209-token prompt loaded 128 tokens and computed 81; a prompt
    # of exactly 256 found nothing (the producer stored 2 blocks, the consumer asked for 1).
    assert recomputed_tokens(209, 128, EXAMPLE_CONNECTOR) == 81
    assert recomputed_tokens(256, 128, EXAMPLE_CONNECTOR) == 256
    assert recomputed_tokens(257, 128, EXAMPLE_CONNECTOR) == 1
    assert recomputed_tokens(256, 128, MOONCAKE_CONNECTOR) == 1


def test_launch_pd_dry_run_renders_both_pools_and_the_pd_router(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    done = npuops("launch", str(model), "--hardware", "cpu", "--pd", "1:1", "--name", "pair", "--port", "9100",
                  "--dry-run", "--output", str(out), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert list(report["instances"]) == ["pair-p0", "pair-d0", "pair"]
    assert report["disaggregated"]["connector"] == EXAMPLE_CONNECTOR
    assert '\\"kv_role\\":\\"kv_consumer\\"' in (out / "pair-d0" / "vllm.yaml").read_text()
    router = json.loads((out / "pair" / "router.json").read_text())["argv"]
    assert "--vllm-pd-disaggregation" in router and "--worker-urls" not in router


@pytest.mark.parametrize(("extra", "problem"), [
    (["--foreground"], "--pd launches prefill and decode engines as services behind a PD router"),
    (["--kv-port", "30000", "--pd", "none"], "--pd 'none' is not P:D"),
])
def test_launch_pd_refusals(tmp_path: Path, extra: list[str], problem: str) -> None:
    model = write_tiny_model(tmp_path / "tiny")
    args = ["launch", str(model), "--hardware", "cpu", *extra]
    if "--pd" not in extra:
        args += ["--pd", "1:1"]
    done = npuops(*args)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert problem in done.stderr and "fix:" in done.stderr, done.stderr


def test_launch_kv_port_without_pd_is_refused(tmp_path: Path) -> None:
    done = npuops("launch", str(write_tiny_model(tmp_path / "tiny")), "--hardware", "cpu", "--kv-port", "30000")
    assert done.returncode != 0 and "--kv-port is for a disaggregated launch" in done.stderr, done.stderr
