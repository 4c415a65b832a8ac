"""A node's instances without systemd, for the commands that act on them (list, status, stop, remove, logs): a
state dir, a unit directory, a service data root and a stand-in systemctl that keeps each unit's state in a JSON
file, with npuops run in this process the way an operator runs it (`npuops.cli.main.main`)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from npuops.cli.main import main
from npuops.instance.record import InstanceRecord, write_record
from tests.support.instance_records import make_record

# Named like docker-systemctl-replacement, so npuops asks it instead of looking for systemd as init. It answers
# `show` from states.json, `stop` makes a unit inactive there, everything else succeeds; each call is logged.
_SYSTEMCTL = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).parent
states = here / "states.json"
data = json.loads(states.read_text())
args = [a for a in sys.argv[1:] if not a.startswith("-")]
with open(here / "calls.log", "a") as log:
    log.write(" ".join(args) + "\\n")
if args and args[0] == "show":
    state = data.get(args[-1], "inactive")
    print(f"ActiveState={{state}}\\nSubState={{'running' if state == 'active' else 'dead'}}\\nUnitFileState=enabled")
elif args and args[0] == "stop":
    data[args[-1]] = "inactive"
    states.write_text(json.dumps(data))
"""


@dataclass
class Node:
    root: Path

    @property
    def state(self) -> Path:
        return self.root / "etc"

    @property
    def units(self) -> Path:
        return self.root / "units"

    @property
    def data_root(self) -> Path:
        return self.root / "var-lib"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def record(self, name: str, *, active: bool = True, **overrides: Any) -> InstanceRecord:
        """Write a record as a service launch would (its status file in the data root) and its unit file."""
        values: dict[str, Any] = {"status_file": str(self.data_root / f"npuops-{name}" / "supervisor.json")}
        values.update(overrides)
        record = make_record(self.state, name, **values)
        write_record(record)
        Path(record.status_file).parent.mkdir(parents=True, exist_ok=True)
        Path(record.status_file).write_text("{}", encoding="utf-8")
        for unit in record.units:
            (self.units / unit).write_text("[Service]\n", encoding="utf-8")
            self.set_state(unit, "active" if active else "inactive")
        return record

    def routed(self, name: str = "m", replicas: int = 2) -> list[InstanceRecord]:
        """A router NAME in front of NAME-r0, NAME-r1, ... (as `launch --dp N` writes them), all running."""
        parts = [self.record(f"{name}-r{i}", behind=name, port=9101 + i) for i in range(replicas)]
        router = self.record(name, role="router", unit=f"npuops-{name}-router.service", port=9100,
                             replicas=tuple(p.name for p in parts))
        return [router, *parts]

    def states(self) -> dict[str, str]:
        return dict(json.loads((self.bin / "states.json").read_text()))

    def set_state(self, unit: str, state: str) -> None:
        data = self.states()
        data[unit] = state
        (self.bin / "states.json").write_text(json.dumps(data), encoding="utf-8")

    def calls(self) -> list[str]:
        log = self.bin / "calls.log"
        return log.read_text().splitlines() if log.exists() else []


def make_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    """A node under tmp_path, with npuops' settings pointing at it for the rest of the test."""
    here = Node(tmp_path / "node")
    for directory in (here.state, here.units, here.data_root, here.bin):
        directory.mkdir(parents=True)
    systemctl = here.bin / "systemctl3.py"
    systemctl.write_text(_SYSTEMCTL.format(python=sys.executable), encoding="utf-8")
    systemctl.chmod(0o755)
    (here.bin / "states.json").write_text("{}", encoding="utf-8")
    for key, value in {"NPUOPS_STATE_DIR": here.state, "NPUOPS_UNIT_DIR": here.units, "NPUOPS_SYSTEMCTL": systemctl,
                       "NPUOPS_SERVICE_DATA_ROOT": here.data_root, "HOME": tmp_path}.items():
        monkeypatch.setenv(key, str(value))
    return here


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def npuops_here(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """`npuops ARGS` in this process: its exit code and what it printed."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    captured = capsys.readouterr()
    return Ran(int(ended.value.code or 0), captured.out, captured.err)
