"""NPUOPS_* variables that are not settings: said on stderr by every command (the closest setting named), and a
near miss of a setting's name refused before a command that changes the node (its setting would stay at the
default and the change land there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from npuops.settings import UnknownVariable, load_settings, unknown_variables
from tests.support.paths import REPO


def _npuops(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NPUOPS_") or k.startswith("NPUOPS_TEST_")}
    return subprocess.run([sys.executable, "-m", "npuops", *args], capture_output=True, text=True, cwd=REPO,
                          env={**clean, **env}, timeout=120, check=False)


def test_unknown_variables_name_the_closest_setting_and_tell_a_near_miss() -> None:
    found = unknown_variables({"NPUOPS_STATE": "/x", "NPUOPS_STATE_DIR": "/etc/npuops", "NPUOPS_TIMEOUT": "3",
                               "NPUOPS_UNIT": "/u", "NPUOPS_XYZZY": "1", "NPUOPS_TEST_WORKERS": "2",
                               "NPUOPS_ENGINE_PYTHON": "/p", "NPUOPS_CONFIG": "c", "PATH": "/bin"})
    assert found == [UnknownVariable("NPUOPS_STATE", "NPUOPS_STATE_DIR", near_miss=True),
                     UnknownVariable("NPUOPS_TIMEOUT", "NPUOPS_COMMAND_TIMEOUT_S", near_miss=True),
                     UnknownVariable("NPUOPS_UNIT", "NPUOPS_UNIT_DIR", near_miss=True),
                     UnknownVariable("NPUOPS_XYZZY", found[-1].closest, near_miss=False)]
    assert "did you mean NPUOPS_STATE_DIR?" in found[0].warning()
    assert "the closest setting is" in found[-1].warning()


def test_loading_settings_ignores_what_is_not_a_setting(tmp_path: Path) -> None:
    """Environments carry stray variables: the core ignores them and the CLI says so (or refuses, below)."""
    settings = load_settings({"NPUOPS_STATE": str(tmp_path), "NPUOPS_ASCEND_RUUT": "/x"},
                             system_config=tmp_path / "none.toml")
    assert settings.state_dir == Path("/etc/npuops") and settings.ascend_root == Path("/usr/local/Ascend")


def test_every_command_warns_about_a_misspelt_variable_on_stderr(tmp_path: Path) -> None:
    # `models` reads no settings at all; `list --json` keeps stdout one document; `monitor targets` only reads,
    # though `monitor render` changes the node.
    for args in (["models", "--json"], ["list", "--json"], ["monitor", "targets", "--json"]):
        proc = _npuops(*args, env={"NPUOPS_STATE": str(tmp_path)})
        assert proc.returncode == 0, proc.stderr
        json.loads(proc.stdout)
        assert proc.stderr.splitlines() == ["npuops: warning: environment variable NPUOPS_STATE is not an npuops "
                                            "setting and is ignored; did you mean NPUOPS_STATE_DIR?"]


def test_a_command_that_changes_the_node_refuses_a_near_miss_in_one_line(tmp_path: Path) -> None:
    proc = _npuops("stop", "demo", env={"NPUOPS_STATE": str(tmp_path)})
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [
        "npuops: error: environment variable NPUOPS_STATE is not an npuops setting (did you mean NPUOPS_STATE_DIR?),"
        " and `npuops stop` changes this node; fix: rename it to NPUOPS_STATE_DIR, or unset it "
        "(`unset NPUOPS_STATE`)"]
    assert _npuops("stop", "--help", env={"NPUOPS_STATE": str(tmp_path)}).returncode == 0
    render = _npuops("monitor", "render", "--output", str(tmp_path / "monitoring"), env={"NPUOPS_UNIT": "/u"})
    assert render.returncode == 3 and "`npuops monitor render` changes this node" in render.stderr
    assert render.stderr.count("\n") == 1 and not (tmp_path / "monitoring").exists()
    # A stray variable that resembles no setting is only a warning, even there.
    stray = _npuops("stop", "demo", env={"NPUOPS_XYZZY": "1", "NPUOPS_STATE_DIR": str(tmp_path)})
    assert stray.stderr.splitlines()[0].startswith("npuops: warning: environment variable NPUOPS_XYZZY")
    assert "no instance named 'demo'" in stray.stderr
