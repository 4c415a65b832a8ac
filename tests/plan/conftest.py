"""Fixtures of the planner tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.model_dirs import write_tiny_model


@pytest.fixture()
def tiny_model_dir(tmp_path: Path) -> Path:
    """config.json plus one real model.safetensors."""
    return write_tiny_model(tmp_path / "tiny-llama")
