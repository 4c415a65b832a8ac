"""Node and PythonStack objects for check tests, built from a host tree without running a real command."""

from __future__ import annotations

from pathlib import Path

from npuops.hardware.node import Node, discover_node
from npuops.hardware.probe import Probe
from npuops.hardware.python_stack import STACK_DISTRIBUTIONS, PythonStack
from npuops.settings import Settings
from tests.support.fake_commands import FakeRunner

VENV_PYTHON = "/opt/npuops/venv/bin/python"

# Row 0.13.0 as a node carries it: torch from the CPU index and vllm built with VLLM_TARGET_DEVICE=empty.
ROW_0_13 = {"torch": "2.8.0+cpu", "torch_npu": "2.8.0.post2", "vllm": "0.13.0+empty", "vllm_ascend": "0.13.0",
            "triton_ascend": "3.2.0"}


def make_stack(versions: dict[str, str] | None = None, python: str = "3.11.7", executable: str = VENV_PYTHON,
               error: str | None = None) -> PythonStack:
    """A serving venv's stack: the given distributions at their versions, every other one absent."""
    full: dict[str, str | None] = {c: None for c in STACK_DISTRIBUTIONS}
    full.update(versions or {})
    dists = {c: c.replace("_", "-") for c, v in full.items() if v is not None}
    return PythonStack(python, executable, full, dists, error)


def bare_node(root: Path, machine: str = "x86_64", npu_smi: str | None = None) -> Node:
    """The node an empty (or prepared) root tree gives, without running any real command."""
    answers: dict[tuple[str, ...], tuple[int, str, str]] = {("npu-smi", "info"): (0, npu_smi, "")} if npu_smi else {}
    probe = Probe(Settings(root=root), runner=FakeRunner(answers, passthrough_python=False), machine=lambda: machine)
    return discover_node(probe)
