"""The playbooks pass ansible-lint (production profile, offline: only ansible.builtin, no Galaxy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_ansible_lint_offline_passes_on_playbooks() -> None:
    lint = Path(sys.executable).parent / "ansible-lint"
    if not lint.exists():
        pytest.fail(f"{lint} is missing: install the test extra (pip install -e .[test])")
    env = {**os.environ, "NO_COLOR": "1", "ANSIBLE_LOCAL_TEMP": "/tmp/npuops-ansible-lint"}
    proc = subprocess.run([str(lint), "--offline", "playbooks/"], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr
    shutil.rmtree(REPO / ".ansible", ignore_errors=True)


def test_only_builtin_modules_are_used() -> None:
    """Every task's module is ansible.builtin.* (no collection has to be installed on the controller)."""
    import yaml

    for path in (REPO / "playbooks").rglob("*.yml"):
        documents = yaml.safe_load(path.read_text())
        tasks = documents if isinstance(documents, list) else []
        for task in tasks:
            if not isinstance(task, dict) or "name" not in task or "hosts" in task:
                continue
            modules = [k for k in task if "." in k]
            assert modules and all(k.startswith("ansible.builtin.") for k in modules), f"{path}: {task['name']}"
