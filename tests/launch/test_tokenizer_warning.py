"""A model directory whose download stopped after the weights (no tokenizer files): the engine would fail on it
minutes into its start, so plan and launch (text and --json) say so before anything starts. The directory is the
demo's tiny model as `python -m npuops.demo_model` writes it, its tokenizer files deleted: config.json and the
weights (write_tiny_model, without torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.model_dirs import write_tiny_model
from tests.support.paths import REPO

WARNING = "has weights but no tokenizer files (tokenizer.json, tokenizer.model, ...); fix: copy them"


@pytest.fixture
def no_tokenizer(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny-llama")


def _npuops(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Wide enough that no line is wrapped inside the warning.
    env = {**os.environ, "NPUOPS_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "400"}
    proc = subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_plan_and_launch_say_the_tokenizer_is_missing_in_text_and_json(no_tokenizer: Path, tmp_path: Path) -> None:
    plan = json.loads(_npuops(tmp_path, "plan", str(no_tokenizer), "--hardware", "cpu", "--json").stdout)
    assert any(WARNING in warning for warning in plan["warnings"])
    args = ("launch", str(no_tokenizer), "--hardware", "cpu", "--name", "tiny", "--dry-run", "--output",
            str(tmp_path / "rendered"))
    text = _npuops(tmp_path, *args).stdout
    assert f"note: {no_tokenizer} {WARNING}" in " ".join(text.split()), text
    notes = json.loads(_npuops(tmp_path, *args, "--json").stdout)["notes"]
    assert any(note.startswith(f"{no_tokenizer} {WARNING}") for note in notes), notes
    # A tokenizer file next to the weights: nothing to say.
    (no_tokenizer / "tokenizer.json").write_text("{}")
    notes = json.loads(_npuops(tmp_path, *args, "--json").stdout)["notes"]
    assert not any("tokenizer" in note for note in notes), notes
