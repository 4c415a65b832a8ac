"""ServerOptions, the one description of a vLLM server's options: what it writes, where, and within which limits;
PlanOptions built on it; and the CLI flags made from the same declarations."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import pytest

from npuops.errors import BadInputError
from npuops.plan.fields import Limits, flagged_fields, limits_of
from npuops.plan.inputs import PlanOptions, PlanRequest, Workload, flag_values
from npuops.plan.server_options import PLACEMENT_KEY, VLLM_NAME_KEY, Placement, ServerOptions, vllm_option

# --- what is written, and where ------------------------------------------------------------------------------------


def test_config_file_keys_are_vllm_names_in_field_order_and_unset_values_are_left_to_vllm() -> None:
    options = ServerOptions(model="/srv/models/m", host="127.0.0.1", port=8000, served_model_name="m",
                            tensor_parallel_size=2, pipeline_parallel_size=1, dtype="bfloat16", enforce_eager=False,
                            enable_expert_parallel=True, compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"})
    assert options.config_file() == {
        "host": "127.0.0.1", "port": 8000, "served-model-name": "m", "tensor-parallel-size": 2, "dtype": "bfloat16",
        "enable-expert-parallel": True, "compilation-config": {"cudagraph_mode": "FULL_DECODE_ONLY"}}
    # pipeline-parallel-size 1 is vLLM's own default (written only when it differs); False is not written; the
    # model is the positional argument, never a key of vllm.yaml.
    assert "pipeline-parallel-size" not in options.config_file() and "model" not in options.config_file()
    assert ServerOptions(pipeline_parallel_size=2).config_file() == {"pipeline-parallel-size": 2}


def test_flags_are_the_same_options_on_a_command_line() -> None:
    graphs = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2]}
    options = ServerOptions(model="/m", served_model_name="m", max_num_seqs=8, headless=True, compilation_config=graphs)
    assert options.flags() == ["--served-model-name", "m", "--max-num-seqs", "8",
                               "--compilation-config",
                               '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[1,2]}', "--headless"]
    assert "/m" not in options.flags()


def test_every_field_is_a_vllm_option_with_one_name_and_a_placement() -> None:
    fields = dataclasses.fields(ServerOptions)
    names = [f.metadata[VLLM_NAME_KEY] for f in fields]
    assert len(set(names)) == len(names)
    assert {f.name for f in fields if f.metadata[PLACEMENT_KEY] is Placement.POSITIONAL} == {"model"}
    # The option's name is the field's, dashed (vLLM's own EngineArgs convention), so nothing maps one to the other.
    assert all(f.metadata[VLLM_NAME_KEY] == f.name.replace("_", "-") for f in fields)


def test_an_option_added_as_one_field_is_written_everywhere() -> None:
    """What adding a vLLM option takes: one field. The yaml keys and the flags follow from it."""
    extended = dataclasses.make_dataclass(
        "Extended", [("enable_prefix_caching", "bool | None", vllm_option("enable-prefix-caching"))],
        bases=(ServerOptions,), frozen=True)
    options = extended(served_model_name="m", enable_prefix_caching=True)
    assert options.config_file() == {"served-model-name": "m", "enable-prefix-caching": True}
    assert options.flags() == ["--served-model-name", "m", "--enable-prefix-caching"]


# --- limits --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "bad"), [("gpu_memory_utilization", 0.99), ("gpu_memory_utilization", 0.05),
                                            ("tensor_parallel_size", 0), ("port", 70000), ("max_model_len", 8),
                                            ("dtype", "int4"), ("data_parallel_start_rank", -1)])
def test_a_value_outside_its_limits_is_refused_naming_the_option(field: str, bad: Any) -> None:
    with pytest.raises(BadInputError) as info:
        ServerOptions(**{field: bad})
    flags = [f"--{flag.name}" for f, flag in flagged_fields(ServerOptions) if f.name == field]
    assert info.value.problem.startswith(flags[0] if flags else field)


def test_dtype_aliases_become_vllm_names() -> None:
    assert ServerOptions(dtype="bf16").dtype == "bfloat16"
    assert ServerOptions(dtype="half").dtype == "float16"


def test_limits_describe_themselves() -> None:
    assert Limits(minimum=0.1, maximum=0.98).describe() == "a value from 0.1 to 0.98"
    assert Limits(minimum=0, minimum_open=True).describe() == "above 0"
    assert Limits(choices=("a", "b")).describe() == "one of a, b"
    with pytest.raises(BadInputError):
        Limits(minimum=1).admit("3", "--x")  # a string is not a number


# --- PlanOptions -----------------------------------------------------------------------------------------------------

def test_plan_options_fix_server_options_by_field_or_short_name() -> None:
    options = PlanOptions(tp=2, pp=None, max_model_len=4096, dtype="auto", enforce_eager=False, multinode=" Ray ")
    assert options.server.fixed() == {"tensor_parallel_size": 2, "max_model_len": 4096}
    assert options.fixed("tp") == 2 and options.fixed("dtype") is None and options.multinode == "ray"
    with pytest.raises(TypeError):
        PlanOptions(tensor_parallelism=2)


def test_plan_options_and_the_cli_share_one_limit() -> None:
    """The limit that refuses a value in Python is the one the CLI flag offers."""
    with pytest.raises(BadInputError):
        PlanOptions(gpu_memory_utilization=1.0)
    field = next(f for f in dataclasses.fields(ServerOptions) if f.name == "gpu_memory_utilization")
    limits = limits_of(field)
    assert limits is not None
    from npuops.cli.plan_cmd import plan

    option = next(p for p in plan.params if p.name == "gpu_memory_utilization")
    assert isinstance(option.type, click.FloatRange)
    assert (option.type.min, option.type.max) == (limits.minimum, limits.maximum)


def _click_limits(param: click.Parameter) -> tuple[Any, Any] | tuple[str, ...] | None:
    kind = param.type
    if isinstance(kind, click.Choice):
        return tuple(str(c) for c in kind.choices)
    if isinstance(kind, (click.IntRange, click.FloatRange)):
        return (kind.min, kind.max)
    return None


@pytest.mark.parametrize("cls", [PlanRequest, Workload, ServerOptions])
def test_every_declared_flag_is_a_plan_and_launch_option_with_its_limits(cls: type[Any]) -> None:
    from npuops.cli.launch_cmd import launch
    from npuops.cli.plan_cmd import plan

    for command in (plan, launch):
        params = {p.name: p for p in command.params}
        for field, flag in flagged_fields(cls):
            param = params[flag.name.replace("-", "_")]
            limits = limits_of(field)
            if limits is None:
                continue
            expected = limits.choices or (limits.minimum, limits.maximum)
            assert _click_limits(param) == tuple(expected), (command.name, flag.name)


def test_flag_values_map_click_names_back_to_fields() -> None:
    flags = {"tp": 2, "max_model_len": 1024, "enforce_eager": True, "dtype": None, "input_len": 64,
             "concurrency": 4, "hardware": "910B3x8", "nodes": 1}
    assert flag_values(ServerOptions, flags) == {"tensor_parallel_size": 2, "max_model_len": 1024,
                                                 "enforce_eager": True}
    request = PlanRequest.from_flags("qwen3-8b", flags)
    assert request.workload == Workload(input_len=64, concurrency=4)
    assert request.options.fixed("tensor_parallel_size") == 2 and request.hardware == "910B3x8"
