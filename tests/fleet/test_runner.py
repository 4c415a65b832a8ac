"""run_playbook: inputs refused with npuops errors before Ansible starts, and real runs on loopback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from npuops.errors import BadInputError, EnvironmentMissingError
from npuops.fleet.events import PlaybookEvent
from npuops.fleet.runner import (
    LOCALHOST_VARS,
    default_ansible_playbook,
    default_artifacts_dir,
    hosts_inventory,
    render_extravars,
    resolve_playbook,
    run_playbook,
)
from tests.support.paths import FLEET_INVENTORIES, FLEET_PLAYBOOKS, VENV_BIN

WRITE_FILE = str(FLEET_PLAYBOOKS / "write-file.yml")


# --- refused before anything runs -----------------------------------------------------------------


def test_missing_inventory_file(artifacts: Path, tmp_path: Path) -> None:
    with pytest.raises(BadInputError) as caught:
        run_playbook("node-facts.yml", inventory=tmp_path / "nope.ini", artifacts_dir=artifacts)
    assert "nope.ini does not exist" in caught.value.problem and "-i" in caught.value.fix
    assert not artifacts.exists()


def test_missing_ansible_playbook(artifacts: Path, tmp_path: Path) -> None:
    with pytest.raises(EnvironmentMissingError) as caught:
        run_playbook("node-facts.yml", inventory=["localhost"], artifacts_dir=artifacts,
                     ansible_playbook=tmp_path / "bin" / "ansible-playbook")
    assert "ansible-playbook not found" in caught.value.problem
    assert "pip install" in caught.value.fix and "ansible-core" in caught.value.fix
    assert "\n" not in caught.value.one_line()


def test_default_ansible_playbook_is_beside_the_interpreter() -> None:
    assert default_ansible_playbook() == VENV_BIN / "ansible-playbook"
    assert default_ansible_playbook().is_file()


def test_unknown_playbook(artifacts: Path) -> None:
    with pytest.raises(BadInputError) as caught:
        run_playbook("no-such-playbook", inventory=["localhost"], artifacts_dir=artifacts)
    assert "no-such-playbook" in caught.value.problem and "node-facts.yml" in caught.value.fix
    with pytest.raises(BadInputError, match="does not exist"):
        resolve_playbook("./missing/play.yml")


def test_shipped_playbook_by_name() -> None:
    assert resolve_playbook("node-facts") == resolve_playbook("node-facts.yml")
    assert resolve_playbook("node-facts").name == "node-facts.yml"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"inventory": ["node1; rm -rf /"]}, "not a host name"),
        ({"inventory": []}, "no hosts given"),
        ({"limit": "  "}, "--limit is empty"),
        ({"tags": ["driver,cann"]}, "not a tag name"),
        ({"tags": [""]}, "not a tag name"),
        ({"forks": 0}, "--forks"),
        ({"extravars": {"bad-name": 1}}, "not a valid Ansible variable name"),
    ],
)
def test_bad_options(artifacts: Path, options: dict[str, object], match: str) -> None:
    kwargs: dict[str, object] = {"inventory": ["localhost"], "artifacts_dir": artifacts, **options}
    with pytest.raises(BadInputError, match=match):
        run_playbook("node-facts.yml", **kwargs)  # type: ignore[arg-type]


def test_hosts_inventory() -> None:
    inventory = hosts_inventory(["localhost", "node-1.example", "10.0.0.2", "node-1.example"])
    assert inventory == {"all": {"hosts": {"localhost": dict(LOCALHOST_VARS), "node-1.example": {},
                                           "10.0.0.2": {}}}}
    with pytest.raises(TypeError):
        hosts_inventory("inventory.ini")


def test_default_artifacts_dir() -> None:
    assert default_artifacts_dir({}, is_root=True) == Path("/var/lib/npuops/ansible")
    assert default_artifacts_dir({"HOME": "/home/u"}, is_root=False) == Path("/home/u/.local/state/npuops/ansible")
    assert default_artifacts_dir({"HOME": "/h", "XDG_STATE_HOME": "/s"}, is_root=False) == Path("/s/npuops/ansible")
    with pytest.raises(EnvironmentMissingError):
        default_artifacts_dir({}, is_root=False)


def test_importing_fleet_does_not_import_ansible_runner() -> None:
    code = ("import sys, npuops.fleet.runner, npuops.fleet.facts; "
            "sys.exit(1 if any(m.startswith(('ansible_runner', 'ansible')) for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- real runs on loopback ------------------------------------------------------------------------


@pytest.mark.slow
def test_check_mode_passes_through_and_is_not_reused(artifacts: Path, tmp_path: Path) -> None:
    target = tmp_path / "written.txt"
    seen: list[PlaybookEvent] = []
    checked = run_playbook(WRITE_FILE, inventory=["localhost"], artifacts_dir=artifacts, check=True, diff=True,
                           extravars={"npuops_test_file": str(target)}, on_event=seen.append)
    assert not target.exists()  # --check changed nothing...
    assert checked.ok and checked.hosts["localhost"].stats.changed == 1  # ...and said what it would change
    (write,) = [e for e in seen if e.kind == "changed"]
    assert write.diff and write.diff[0]["after"] == "written\n"
    assert [e.kind for e in seen] == ["task_start", "changed", "stats"]
    assert (checked.artifacts / "job_events").is_dir() and checked.artifacts.parent == artifacts

    # The next run must not inherit --check (ansible-runner's env/cmdline reuse pitfall).
    real = run_playbook(WRITE_FILE, inventory=["localhost"], artifacts_dir=artifacts,
                        extravars={"npuops_test_file": str(target)})
    assert real.ok and target.read_text() == "written\n"
    assert real.artifacts != checked.artifacts


@pytest.mark.slow
def test_limit_matching_nothing(artifacts: Path) -> None:
    with pytest.raises(BadInputError) as caught:
        run_playbook(WRITE_FILE, inventory=["localhost"], artifacts_dir=artifacts, limit="no-such-host")
    assert "no hosts to target" in caught.value.problem
    assert str(artifacts) in caught.value.fix


@pytest.mark.slow
def test_broken_inventory(artifacts: Path) -> None:
    broken = FLEET_INVENTORIES / "broken.ini"
    with pytest.raises(BadInputError) as caught:
        run_playbook("node-facts.yml", inventory=broken, artifacts_dir=artifacts)
    # Read (and its host names checked) before ansible-playbook starts: ansible-inventory's reason is in the line.
    assert caught.value.problem.startswith(f"Ansible cannot read inventory {broken}: ")
    assert "ansible-inventory" in caught.value.fix


@pytest.mark.slow
def test_tags_that_select_nothing(artifacts: Path, tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="has the tags no-such-tag"):
        run_playbook(WRITE_FILE, inventory=["localhost"], artifacts_dir=artifacts, tags=["no-such-tag"],
                     extravars={"npuops_test_file": str(tmp_path / "x")})
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_failing_event_handler_stops_the_run(artifacts: Path, tmp_path: Path) -> None:
    def explode(event: PlaybookEvent) -> None:
        raise RuntimeError("display broke")

    target = tmp_path / "late.txt"
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="display broke"):
        run_playbook(str(FLEET_PLAYBOOKS / "slow.yml"), inventory=["localhost"], artifacts_dir=artifacts,
                     extravars={"npuops_test_file": str(target)}, on_event=explode)
    # Cancelled during the 10 s task instead of running on without anyone watching: the last task
    # never ran. (ansible-runner notices within its 1 s poll, then waits up to 5 s for the pty to close.)
    assert not target.exists()
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_job_timeout(artifacts: Path, tmp_path: Path) -> None:
    target = tmp_path / "late.txt"
    run = run_playbook(str(FLEET_PLAYBOOKS / "slow.yml"), inventory=["localhost"], artifacts_dir=artifacts,
                       extravars={"npuops_test_file": str(target)}, timeout_s=2)
    assert run.status == "timeout" and not run.ok
    assert not target.exists()
    # The host that was cut off is still reported, from the events seen so far.
    assert run.hosts["localhost"].stats.ok == 1


HOSTILE_VALUES = ["{{ 7 * 6 }}", "{{ lookup('pipe', 'touch npuops-owned') }}", "{% if true %}x{% endif %}",
                  "{# comment #}", "${HOME} $(id) `id`", "it's \"quoted\" \\ back", "line\nbreak", "é 鍵 𐀀", "",
                  "!unsafe", "- [list]: {map}", "yes", "0x1F"]


@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
                       st.recursive(st.text() | st.integers() | st.booleans() | st.none(),
                                    lambda inner: st.lists(inner, max_size=3)
                                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8),
                       max_size=4))
@settings(max_examples=150, deadline=None)
def test_extra_vars_load_back_as_sent_and_never_as_templates(values: dict[str, object]) -> None:
    from ansible.parsing.yaml.loader import AnsibleLoader

    text = render_extravars(values)
    loaded = yaml.load(text, Loader=AnsibleLoader) or {}  # Ansible's own loader, as it reads -e @file
    assert loaded == values

    def marked(node: yaml.Node) -> None:  # every string value holding a Jinja marker is !unsafe
        if isinstance(node, yaml.MappingNode):
            for _, value in node.value:
                marked(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                marked(item)
        elif any(m in node.value for m in ("{{", "{%", "{#")):
            assert node.tag == "!unsafe", text

    root = yaml.compose(text)
    if root is not None:
        marked(root)


@pytest.mark.slow
def test_a_value_holding_a_template_reaches_the_host_as_sent(artifacts: Path, tmp_path: Path) -> None:
    """A real run: Ansible writes each value into a file; a template in a value (a lookup that would run a
    command on the controller) arrives as text, evaluated by nothing."""
    values = [{"name": f"v{i}", "text": text} for i, text in enumerate(HOSTILE_VALUES)]
    run = run_playbook(str(FLEET_PLAYBOOKS / "write-values.yml"), inventory=["localhost"], artifacts_dir=artifacts,
                       extravars={"npuops_test_dir": str(tmp_path), "npuops_test_values": values})
    assert run.ok, run
    for value in values:
        assert (tmp_path / value["name"]).read_text() == value["text"], value
    assert not (Path.cwd() / "npuops-owned").exists() and not (tmp_path / "npuops-owned").exists()
