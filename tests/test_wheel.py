"""The built wheel carries templates/, playbooks/ and checks/, and commands find them outside the repo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
                   check=True, cwd=work, timeout=600)
    (wheel,) = dist.glob("npuops-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("npuops/templates/", "npuops/playbooks/", "npuops/checks/", "npuops/data/chips.toml",
                    "npuops/checks/docs/driver-installed.md", "npuops/data/failure_signatures.toml",
                    "npuops/service/supervisor.py"):
        assert any(n.startswith(shipped) for n in names), f"{shipped} missing from {wheel.name}"
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True,
                   cwd=work, timeout=900)
    return venv


def _run(venv: Path, *args: str, state_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["NPUOPS_ASCEND_ROOT"] = "/nonexistent/Ascend"
    if state_dir is not None:
        env["NPUOPS_STATE_DIR"] = str(state_dir)
    # Run from a directory outside the repo, so nothing can be found by accident in the checkout.
    return subprocess.run([str(venv / "bin" / "npuops"), *args], capture_output=True, text=True, env=env,
                          cwd=venv, timeout=300, check=False)


def test_installed_package_is_the_wheel_not_the_checkout(wheel_venv: Path) -> None:
    script = "import npuops, npuops.checks; print(npuops.__file__); print(list(npuops.checks.__path__)[0])"
    out = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", script],
                         capture_output=True, text=True, cwd=wheel_venv, check=True).stdout.split()
    assert all("site-packages" in p and str(REPO) not in p for p in out)


def test_node_runs_from_the_wheel(wheel_venv: Path) -> None:
    proc = _run(wheel_venv, "node", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["npu"]["found"] is False


def test_checks_are_found_from_the_wheel(wheel_venv: Path) -> None:
    listed = _run(wheel_venv, "doctor", "--list", "--json")
    assert listed.returncode == 0, listed.stderr
    ids = {c["id"] for c in json.loads(listed.stdout)}
    from npuops.doctor.registry import discover_checks

    assert ids == {c.id for c in discover_checks()}  # every check in checks/ shipped
    page = _run(wheel_venv, "doctor", "--explain", "driver-installed")
    assert page.returncode == 0 and page.stdout.startswith("# driver-installed")


def test_every_python_package_is_listed_for_the_wheel() -> None:
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {"npuops." + p.parent.relative_to(REPO / "npuops").as_posix().replace("/", ".")
               for p in (REPO / "npuops").rglob("__init__.py") if p.parent != REPO / "npuops"}
    assert on_disk | {"npuops"} <= listed, on_disk - listed


def test_templates_are_found_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((REPO / "tests/fixtures/models/qwen3-8b/config.json").read_text())
    proc = _run(wheel_venv, "launch", str(model), "--hardware", "910B3x4", "--dry-run", "--output",
                str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr
    rendered = json.loads(proc.stdout)["instances"]
    assert rendered and all(len(paths) == 4 for paths in rendered.values())


def test_playbooks_are_found_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    proc = _run(wheel_venv, "node", "--host", "localhost", "--artifacts", str(tmp_path / "artifacts"), "--json")
    assert proc.returncode == 0, proc.stderr
    fleet = json.loads(proc.stdout)
    assert fleet["hosts"]["localhost"]["status"] == "ok"
    assert fleet["hosts"]["localhost"]["node"]["npu"]["found"] is False


def test_the_start_gate_runs_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    """A rendered instance's gate (the unit's ExecStartPre) and the failure signatures, from the installed wheel."""
    model = tmp_path / "qwen3-8b"
    model.mkdir()
    (model / "config.json").write_text((REPO / "tests/fixtures/models/qwen3-8b/config.json").read_text())
    state = tmp_path / "state"
    # Rendered for the state dir the gate reads it from: a record names its own directory (npuops reads no record
    # that names another).
    proc = _run(wheel_venv, "launch", str(model), "--hardware", "910B3x4", "--tp", "4", "--name", "w",
                "--vllm", "/bin/true", "--dry-run", "--output", str(state / "w"), state_dir=state)
    assert proc.returncode == 0, proc.stderr
    gate = _run(wheel_venv, "run", "--state-dir", str(state), "--preflight", "--json", "w")
    checks = {c["id"]: c["status"] for c in json.loads(gate.stdout)["checks"]}
    assert checks["engine-executable"] == "pass" and checks["model-directory"] == "pass"
    signatures = subprocess.run([str(wheel_venv / "bin" / "python"), "-c",
                                 "from npuops.service.diagnosis import load_signatures; print(len(load_signatures()))"],
                                capture_output=True, text=True, cwd=wheel_venv, check=True)
    assert int(signatures.stdout) >= 15
