"""An instance whose foreground run ended (here: refused by its start gate, no engine needed) as an operator meets
it afterwards: `list` shows it with the fix, `stop` says there is nothing to stop, `logs` shows why it never
started, `remove` forgets it (and `stop`/`remove` of a name that is gone is one line and exit 3)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.http_server import free_port
from tests.support.model_dirs import write_tiny_model
from tests.support.workspace import PLAN_FLAGS, Workspace


def test_a_refused_foreground_run_is_listed_logged_and_removed(tmp_path: Path) -> None:
    ws = Workspace({**os.environ, "NPUOPS_STATE_DIR": str(tmp_path / "state")}, tmp_path / "state")
    model = write_tiny_model(tmp_path / "tiny")
    refused = ws.run("launch", str(model), *PLAN_FLAGS, "--name", "demo", "--port", str(free_port()), "--foreground",
                     "--vllm", str(tmp_path / "no-vllm"))
    assert refused.returncode == 1 and "refused [engine-executable]" in refused.stderr, refused.stderr

    listed = ws.run("list")
    assert "\ndemo  failed  " in listed.stdout, listed.stdout
    assert ("demo: its foreground run has ended; fix: launch it again, or `npuops remove demo` to forget it"
            in listed.stdout)
    (row,) = json.loads(ws.run("list", "--json").stdout)["instances"]
    assert row["state"] == "failed" and "npuops remove demo" in row["note"]

    stopped = ws.run("stop", "demo")
    assert stopped.returncode == 0 and stopped.stdout == "demo: not running (nothing to stop)\n"
    assert json.loads(ws.run("stop", "demo", "--json").stdout)["was_running"] == []

    # The run's log begins with the gate's report, as a unit's journal would.
    logged = ws.run("logs", "demo")
    assert logged.returncode == 0, logged.stderr
    assert "refused [engine-executable] the vLLM executable" in logged.stdout and "blocking" in logged.stdout
    assert json.loads(ws.run("logs", "demo", "--json").stdout)["lines"] == logged.stdout.splitlines()

    removed = ws.run("remove", "demo", "--json")
    assert removed.returncode == 0, removed.stderr
    answer = json.loads(removed.stdout)
    assert answer == {"ok": True, "name": "demo", "units": [], "instances": ["demo"],
                      "kept": [str(ws.state / "demo")]}
    assert sorted(p.name for p in (ws.state / "demo").iterdir()) == ["engine.log"]  # the log stays to read
    assert ws.run("list").stdout.startswith("no instances in ")
    for verb in ("stop", "remove", "logs"):
        gone = ws.run(verb, "demo")
        assert gone.returncode == 3 and gone.stderr.count("\n") == 1 and "no instance named 'demo'" in gone.stderr


def test_list_notes_only_what_lingers() -> None:
    from npuops.instance.status import InstanceStatus, lingering_fix

    def status(state: str, manager: str) -> InstanceStatus:
        return InstanceStatus("m", state, state == "healthy", manager, url="http://127.0.0.1:8000", model="tiny")

    assert lingering_fix(status("failed", "systemd")) == (
        "fix: `npuops status m` says why; `npuops remove m` uninstalls it")
    assert "foreground run has ended" in str(lingering_fix(status("stopped", "foreground")))
    for state, manager in (("healthy", "systemd"), ("stopped", "systemd"), ("starting (gate)", "foreground"),
                           ("healthy", "foreground")):
        assert lingering_fix(status(state, manager)) is None, (state, manager)
