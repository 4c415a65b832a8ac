"""JSON from elsewhere (another host, an engine's answer, a model's config.json) nested without end is a document
that is not JSON, caught where any other is: never a RecursionError far from where it came in."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from npuops.bench.serve_bench import parse_serve_result
from npuops.instance.ray import RayNodesError, parse_ray_nodes
from npuops.instance.router_admin import worker_urls
from npuops.parsing import ParseError
from npuops.wire import MAX_JSON_DEPTH, loads_json
from tests.support.model_dirs import write_tiny_model
from tests.support.npuops_cli import npuops_argv

DEEP = "[" * 100_000 + "]" * 100_000


def _nested(depth: int) -> str:
    return '{"a": ' * (depth - 1) + "[1]" + "}" * (depth - 1)


def test_a_document_nested_past_the_parser_or_the_limit_is_not_json() -> None:
    for text in (DEEP, DEEP.encode(), _nested(MAX_JSON_DEPTH + 1), "[" * 900 + "]" * 900):
        with pytest.raises(json.JSONDecodeError, match="nested deeper"):
            loads_json(text)
    assert json.dumps(loads_json(_nested(MAX_JSON_DEPTH))).count("{") == MAX_JSON_DEPTH - 1
    assert loads_json('{"a": [1, {"b": 2}], "c": "x"}') == {"a": [1, {"b": 2}], "c": "x"}


def test_answers_from_ray_a_bench_or_a_router_nested_without_end_are_no_answer() -> None:
    assert worker_urls(DEEP.encode()) is None
    with pytest.raises(RayNodesError):
        parse_ray_nodes(DEEP)
    with pytest.raises(ParseError):
        parse_serve_result(DEEP)


def test_a_model_whose_config_nests_without_end_is_one_line(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    (model / "config.json").write_text(DEEP)
    done = subprocess.run(npuops_argv("plan", str(model), "--hardware", "cpu"), capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "NPUOPS_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode not in (0, 70), done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr[-2000:]
    assert "config.json" in done.stderr and "nested deeper" in done.stderr, done.stderr
