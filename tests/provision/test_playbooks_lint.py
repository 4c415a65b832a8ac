"""The playbooks pass ansible-lint (production profile, offline: only ansible.builtin, no Galaxy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO

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


# Where a play or a block keeps its tasks (Ansible's playbook keywords).
_TASK_LISTS = ("pre_tasks", "tasks", "post_tasks", "handlers", "block", "rescue", "always")


def tasks_of(document: Any) -> Iterator[dict[str, Any]]:
    """Every task of a playbook or a tasks file, inside plays, blocks, rescue and always sections."""
    for item in document if isinstance(document, list) else []:
        if not isinstance(item, dict):
            continue
        nested = [key for key in _TASK_LISTS if isinstance(item.get(key), list)]
        if "hosts" in item or nested:
            for key in nested:
                yield from tasks_of(item[key])
        else:
            yield item


def non_builtin_modules(document: Any, own: frozenset[str] = frozenset()) -> list[str]:
    """The tasks (by name) whose module is not ansible.builtin.*: a dotted key of another collection, or no
    fully-qualified module at all (a short name would resolve to whatever collection provides it), unless it is one
    of `own`: the role's own modules and action plugins, shipped in the role (library/, action_plugins/)."""
    bad = []
    for task in tasks_of(document):
        if any(key in own for key in task):
            continue
        modules = [k for k in task if "." in k]
        if not modules or not all(k.startswith("ansible.builtin.") for k in modules):
            bad.append(str(task.get("name", task)))
    return bad


def role_plugins(path: Path) -> frozenset[str]:
    """The modules and action plugins a role ships itself, for a file inside roles/<role>/."""
    parts = path.relative_to(REPO / "playbooks").parts
    if parts[0] != "roles":
        return frozenset()
    role = REPO / "playbooks" / "roles" / parts[1]
    return frozenset(p.stem for d in ("library", "action_plugins") for p in (role / d).glob("*.py"))


def test_the_module_walk_finds_tasks_inside_plays_and_blocks() -> None:
    playbook = [{"hosts": "all", "pre_tasks": [{"name": "ok", "ansible.builtin.ping": {}}],
                 "tasks": [{"name": "outer", "block": [{"name": "nested", "community.general.foo": {}}],
                            "rescue": [{"name": "short", "command": "true"}]}]}]
    assert [t["name"] for t in tasks_of(playbook)] == ["ok", "nested", "short"]
    assert non_builtin_modules(playbook) == ["nested", "short"]
    # A role's own plugin counts as its own, nothing else does.
    assert non_builtin_modules(playbook, frozenset({"command"})) == ["nested"]
    assert role_plugins(REPO / "playbooks/roles/npu_network/tasks/main.yml") == {"npuops_npu_ports",
                                                                                 "npuops_hccn_calls"}


def test_only_builtin_modules_are_used() -> None:
    """Every task's module is ansible.builtin.* or the role's own (no collection has to be installed on the
    controller)."""
    import yaml

    checked = 0
    for path in sorted((REPO / "playbooks").rglob("*.yml")):
        document = yaml.safe_load(path.read_text())
        assert non_builtin_modules(document, role_plugins(path)) == [], path
        checked += sum(1 for _ in tasks_of(document))
    # The top-level playbooks' own tasks are walked too, not only the roles' task files.
    launch_group = yaml.safe_load((REPO / "playbooks" / "launch-group.yml").read_text())
    assert sum(1 for _ in tasks_of(launch_group)) > 5 and checked > 50
