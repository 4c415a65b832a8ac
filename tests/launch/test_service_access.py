"""What the service user can reach under the unit's sandbox (npuops/instance/access.py), launch's refusal before
installing anything, and the start gate's checks made as that user (checks/launch.py)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from npuops.doctor.context import CheckContext, DoctorOptions
from npuops.doctor.model import Status
from npuops.doctor.registry import discover_checks
from npuops.doctor.runner import run_checks
from npuops.errors import BadInputError
from npuops.hardware.probe import Probe
from npuops.instance.access import (
    ServiceIdentity,
    executable_problems,
    hops,
    model_problems,
    sandbox_hidden,
    service_problems,
)
from npuops.launch.install import check_service_access
from npuops.settings import Settings
from tests.support.instance_records import make_record

NOBODY = ServiceIdentity("nobody", 65534, frozenset({65534}))


def _tree(base: Path) -> tuple[Path, Path]:
    """A venv whose python is reached through a symlink, and a model directory, both readable by anyone."""
    bin_dir = base / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to("/usr/bin/python3")
    vllm = bin_dir / "vllm"
    vllm.write_text(f"#!{bin_dir / 'python'}\nimport sys\n", encoding="utf-8")
    vllm.chmod(0o755)
    model = base / "models" / "tiny"
    (model / "sub").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "sub/tokenizer.json"):
        (model / name).write_text("{}", encoding="utf-8")
    for directory in (base, *base.rglob("*")):
        if directory.is_dir() and not directory.is_symlink():
            directory.chmod(0o755)
    return vllm, model


@pytest.fixture()
def served(tmp_path: Path) -> Path:
    """A base directory outside what the sandbox hides is needed for the positive cases: /srv in a private dir."""
    base = Path("/srv") / f"npuops-access-test-{os.getpid()}-{tmp_path.name}"
    base.mkdir(parents=True)
    yield base
    for path in sorted(base.rglob("*"), reverse=True):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    base.rmdir()


def test_symlinks_are_followed_hop_by_hop(tmp_path: Path) -> None:
    link = tmp_path / "python"
    link.symlink_to("/root/.pyenv/versions/3.11.7/bin/python3.11")
    assert [str(h) for h in hops(link)][-1] == "/root/.pyenv/versions/3.11.7/bin/python3.11"
    hidden = sandbox_hidden(link)
    assert hidden is not None and str(hidden[0]).startswith("/tmp/")  # the link itself already lies in /tmp


def test_a_readable_tree_outside_the_hidden_places_passes(served: Path) -> None:
    vllm, model = _tree(served)
    assert service_problems(NOBODY, vllm=vllm, model=model) == []


def test_an_interpreter_reached_through_a_symlink_into_root_is_refused(served: Path) -> None:
    vllm, _ = _tree(served)
    python = vllm.parent / "python"
    python.unlink()
    python.symlink_to("/root/.pyenv/versions/3.11.7/bin/python3.11")
    problems = executable_problems("the vllm executable", vllm, NOBODY)
    assert [(p.what, p.where) for p in problems] == [
        ("the interpreter of the vllm executable", "/root/.pyenv/versions/3.11.7/bin/python3.11")]
    assert "ProtectHome" in problems[0].why


def test_weights_only_root_can_read_are_refused(served: Path) -> None:
    _, model = _tree(served)
    (model / "model.safetensors").chmod(0o600)
    problems = model_problems(model, NOBODY)
    assert [p.path for p in problems] == [str(model / "model.safetensors")]
    assert "0600" in problems[0].why and "chmod -R a+rX" in problems[0].fix


def test_a_directory_the_user_cannot_enter_is_named(served: Path) -> None:
    _, model = _tree(served)
    (model / "sub").chmod(0o700)
    problems = model_problems(model, NOBODY)
    assert [(p.path, p.where) for p in problems] == [(str(model / "sub"), str(model / "sub"))]
    (model / "sub").chmod(0o755)


def test_group_permissions_count_for_the_service_users_groups(served: Path) -> None:
    _, model = _tree(served)
    weights = model / "model.safetensors"
    os.chown(weights, 0, 65534)
    weights.chmod(stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP)
    assert model_problems(model, NOBODY) == []
    assert model_problems(model, ServiceIdentity("other", 65533, frozenset({65533})))


@pytest.mark.parametrize("place", ["/tmp", "/root", "/home"])
def test_a_model_where_the_sandbox_hides_it_is_refused(place: str, tmp_path: Path) -> None:
    model = Path(place) / "models" / "tiny"
    problems = model_problems(model, NOBODY)
    assert len(problems) == 1 and problems[0].where == place + "/models/tiny"
    assert ("PrivateTmp" if place == "/tmp" else "ProtectHome") in problems[0].why


def test_launch_refuses_before_installing_naming_the_path_and_the_fix(served: Path, tmp_path: Path) -> None:
    vllm, model = _tree(served)
    (model / "model.safetensors").chmod(0o600)
    record = make_record(tmp_path / "state", model_path=str(model), vllm_command=(str(vllm), "serve"),
                         service_user="nobody")
    with pytest.raises(BadInputError) as refused:
        check_service_access([record], "nobody", None)
    assert str(model / "model.safetensors") in refused.value.problem and "chmod" in refused.value.fix
    (model / "model.safetensors").chmod(0o644)
    check_service_access([record], "nobody", None)


def test_a_draft_model_the_service_user_cannot_read_is_refused(served: Path, tmp_path: Path) -> None:
    vllm, model = _tree(served)
    draft = served / "draft"
    shutil.copytree(model, draft)
    (draft / "model.safetensors").chmod(0o600)
    record = make_record(tmp_path / "state", model_path=str(model), vllm_command=(str(vllm), "serve"),
                         service_user="nobody", draft_model_path=str(draft))
    with pytest.raises(BadInputError) as refused:
        check_service_access([record], "nobody", None)
    assert str(draft / "model.safetensors") in refused.value.problem
    (draft / "model.safetensors").chmod(0o644)
    check_service_access([record], "nobody", None)


def _gate(record: object) -> dict[str, Status]:
    checks = [c for c in discover_checks() if c.id in ("engine-executable", "model-directory")]
    report = run_checks(checks, CheckContext(Probe(Settings()), DoctorOptions(instance=record)))  # type: ignore[arg-type]
    return {o.check_id: o.result.status for o in report.outcomes}


def test_the_start_gate_checks_as_the_service_user_not_as_root(served: Path, tmp_path: Path) -> None:
    vllm, model = _tree(served)
    (model / "model.safetensors").chmod(0o600)
    as_root = make_record(tmp_path / "a", model_path=str(model), vllm_command=(str(vllm), "serve"))
    as_service = make_record(tmp_path / "b", model_path=str(model), vllm_command=(str(vllm), "serve"),
                             service_user="nobody")
    # A foreground run (no service user) is checked as whoever runs it (root here): the file is readable.
    assert _gate(as_root)["model-directory"] is Status.PASS
    assert _gate(as_service)["model-directory"] is Status.FAIL
