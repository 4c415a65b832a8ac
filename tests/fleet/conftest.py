"""Fixtures of the fleet tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where a playbook run keeps its ansible-runner artifacts."""
    return tmp_path / "artifacts"
