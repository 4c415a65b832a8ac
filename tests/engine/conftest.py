"""Fixtures for tests against a real vLLM engine (the CPU build) serving the tiny demo model.

They skip without NPUOPS_ENGINE_PYTHON (fail with NPUOPS_REQUIRE_ENGINE=1); the helpers they call, and that tests
with engines of their own use, are in tests/support/engine.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine import (
    HEALTH_TIMEOUT_S,
    EngineError,
    EngineProcess,
    engine_python_or_skip,
    make_model,
    start_engine,
)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine venv's python (NPUOPS_ENGINE_PYTHON)."""
    return engine_python_or_skip()


@pytest.fixture(scope="session")
def tiny_model(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model (seed 0, no noise), made once per session."""
    return make_model(engine_python, tmp_path_factory.mktemp("tiny-model") / "tiny-llama")


@pytest.fixture(scope="session")
def small_model(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo model (`--size small`: ~105 M parameters, ~420 MB, seed 0), made once per session (~15-30 s):
    for benches, where the tiny model would measure framework overhead only."""
    return make_model(engine_python, tmp_path_factory.mktemp("small-model") / "small-llama", size="small")


@pytest.fixture(scope="session")
def engine_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch inductor cache shared by the session's engines (halves the first logprobs request of each)."""
    return tmp_path_factory.mktemp("engine-compile-cache")


@pytest.fixture(scope="session")
def running_engine(
    engine_python: Path,
    tiny_model: Path,
    engine_compile_cache: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EngineProcess]:
    """One `vllm serve` of the tiny model for the whole session (each start costs 25-45 s), healthy and warmed
    up (one logprobs request) on yield."""
    engine = start_engine(
        engine_python,
        tiny_model,
        work_dir=tmp_path_factory.mktemp("engine"),
        compile_cache_dir=engine_compile_cache,
    )
    try:
        engine.wait_healthy(HEALTH_TIMEOUT_S)
        engine.warm_up()
    except EngineError:
        engine.stop()
        raise
    try:
        yield engine
    finally:
        engine.stop()
