"""What the engine's service user writes (the supervisor's status file, the engine's log) and what another host
answers reach root's terminal escaped: `status`, `list`, a group's status and `logs` print no control character
(no escape sequence retitles or clears the terminal, no newline forges a line), while `--json` keeps every value
as it was read."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuops.fleet.group_ops import HostAnswer, group_status, render_group_status_text
from npuops.fleet.inventory import InventoryHost
from npuops.instance.manager import UnitState
from npuops.instance.record import MANAGER_FOREGROUND, STATUS_FILE, read_status
from npuops.instance.state import Diagnosis, SupervisorState
from npuops.instance.status import InstanceStatus, render_status_text, summarize
from npuops.wire import WireFormatError
from tests.support.http_server import Serve
from tests.support.instance_node import Node, make_node, npuops_here
from tests.support.instance_records import make_record

# The terminal attack of the review: retitle the terminal, clear the screen, start a line of its own.
ATTACK = "\x1b]0;PWN\x07\x1b[2J\r\nFAKE"
PIECES = ["\n", "\r", "\r\n", "\x00", "\t", "\x1b", "\x1b[2J", "\x1b]0;x\x07", "\x07", "\x7f", "\x9b", "\u2028",
          "\u202e", "\ufeff", "\\", "\\n", " ", "fix: ", "é", "鍵", "a"]
# Never empty: an empty `line` or `detail` leaves its line out, and the test compares the lines with benign ones.
HOSTILE = st.one_of(st.text(max_size=40), st.lists(st.sampled_from(PIECES), max_size=10).map("".join),
                    st.binary(max_size=30).map(os.fsdecode)).map(lambda text: "v" + text)
FIELDS = ("reason", "previous_reason", "cause", "fix", "line", "source", "previous_cause", "detail", "check")
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _status_file(values: dict[str, str]) -> dict[str, Any]:
    """A supervisor.json whose every free text is one of `values` (as the service user may write it)."""
    return {
        "name": "m", "supervisor_pid": 1, "stage": "degraded",
        "stages": [{"stage": "degraded", "at": 1.0, "detail": values["detail"]}],
        "exit": {"code": 1, "reason": values["reason"], "blocking": [values["check"], "chip-health"],
                 "diagnosis": {"id": "hang", "cause": values["cause"], "fix": values["fix"], "line": values["line"],
                               "source": values["source"]}},
        "previous_exit": {"code": 1, "reason": values["previous_reason"],
                          "diagnosis": {"id": "signal-sigkill", "cause": values["previous_cause"]}},
    }


def _rendered(values: dict[str, str], tmp_path: Path) -> tuple[InstanceStatus, list[str]]:
    """The status of an instance whose status file holds `values`, as instance_status builds it: restarting after
    its exit, and serving degraded (each state quotes the file), and each one's text."""
    supervisor = SupervisorState.from_json(json.loads(json.dumps(_status_file(values))))
    assert supervisor.exit is not None
    record = make_record(tmp_path, "m")
    restarting = UnitState("activating", "auto-restart", None, "", 1, "exit-code", "enabled", "loaded")
    running = replace(restarting, active_state="active", sub_state="running")
    status = InstanceStatus(name="m", state=summarize(record, restarting, supervisor, False), healthy=False,
                            manager="systemd", unit="npuops-m.service", url="http://127.0.0.1:8000", model="tiny",
                            unit_state=restarting, stage="degraded", diagnosis=supervisor.exit.diagnosis,
                            exit=replace(supervisor.exit, diagnosis=None), previous_exit=supervisor.previous_exit)
    serving = replace(status, state=summarize(record, running, supervisor, True), healthy=True)
    return status, [render_status_text(status), render_status_text(serving)]


@FAST
@given(st.fixed_dictionaries({key: HOSTILE for key in FIELDS}))
def test_no_text_of_the_status_file_reaches_the_terminal_unescaped(tmp_path_factory: pytest.TempPathFactory,
                                                                    values: dict[str, str]) -> None:
    tmp_path = tmp_path_factory.mktemp("hostile")
    status, texts = _rendered(values, tmp_path)
    _, benign = _rendered(dict.fromkeys(FIELDS, "x"), tmp_path)
    for text, plain in zip(texts, benign, strict=True):
        lines = text.split("\n")
        assert all(c.isprintable() for line in lines for c in line), ascii(text)
        # Each value stays inside its own line: as many lines as with benign values, each starting as npuops wrote it.
        assert [line[:12] for line in lines] == [line[:12] for line in plain.split("\n")]
    # --json keeps every value as it was read (JSON escapes them itself).
    back = InstanceStatus.from_json(json.loads(json.dumps(status.to_json())))
    assert back.diagnosis == status.diagnosis and back.exit == status.exit and back.state == status.state
    assert back.previous_exit is not None and back.previous_exit.reason == values["previous_reason"]


def test_the_review_s_attack_shows_escaped_where_it_was_written(tmp_path: Path) -> None:
    _, (text, _) = _rendered(dict.fromkeys(FIELDS, ATTACK), tmp_path)
    shown = "\\x1b]0;PWN\\x07\\x1b[2J\\r\\nFAKE"
    assert f"  fix       {shown}" in text.splitlines() and not any(line.startswith("FAKE") for line in text.split("\n"))
    assert "\x1b" not in text and "\r" not in text


@pytest.mark.parametrize("diagnosis_id", ["", "x\x1b[2J", "a b", "-x", "fix\nFAKE", "x" * 129])
def test_a_diagnosis_id_npuops_never_makes_is_refused(diagnosis_id: str) -> None:
    with pytest.raises(WireFormatError) as caught:
        Diagnosis.from_json({"id": diagnosis_id, "cause": "c"})
    assert "is not a diagnosis id" in caught.value.problem or "id is missing" in caught.value.problem
    assert "\n" not in caught.value.one_line() and "\x1b" not in caught.value.one_line()


def test_the_diagnosis_ids_npuops_makes_are_read() -> None:
    for diagnosis_id in ("hang", "gate:chip-health", "systemd-user", "signal-sigkill", "record-unreadable"):
        assert Diagnosis.from_json({"id": diagnosis_id}).id == diagnosis_id


def test_a_status_file_with_a_forged_diagnosis_id_is_not_read(tmp_path: Path) -> None:
    record = make_record(tmp_path, "m")
    Path(record.instance_dir).mkdir()
    data = _status_file(dict.fromkeys(FIELDS, "x"))
    data["exit"]["diagnosis"]["id"] = ATTACK
    Path(record.status_file).write_text(json.dumps(data), encoding="utf-8")
    assert read_status(record) is None
    data["exit"]["diagnosis"]["id"] = "hang"
    Path(record.status_file).write_text(json.dumps(data), encoding="utf-8")
    assert read_status(record) is not None


# --- the commands ------------------------------------------------------------------------------------------------

@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return make_node(tmp_path, monkeypatch)


def _no_terminal_control(out: str) -> bool:
    return "\x1b" not in out and "\r" not in out and not any(line.startswith("FAKE") for line in out.split("\n"))


def test_status_prints_the_status_file_escaped_and_json_as_read(node: Node, closed_port: int,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    record = node.record("m", port=closed_port)
    Path(record.status_file).write_text(json.dumps(_status_file(dict.fromkeys(FIELDS, ATTACK))), encoding="utf-8")
    node.set_state(record.unit, "failed")
    for args in (("status", "m"), ("status",)):
        done = npuops_here(capsys, *args)
        assert done.code == 1 and _no_terminal_control(done.out), (args, done)
        assert "  fix       \\x1b]0;PWN\\x07\\x1b[2J\\r\\nFAKE" in done.out.splitlines()
    (answer,) = json.loads(npuops_here(capsys, "status", "m", "--json").out)["instances"]
    assert answer["diagnosis"]["fix"] == ATTACK and answer["exit"]["reason"] == ATTACK
    assert answer["previous_exit"]["reason"] == ATTACK


def test_list_and_status_print_a_degraded_engine_s_detail_escaped(node: Node, serve: Serve,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = serve({"/health": (200, b"")})
    record = node.record("m", port=int(url.rsplit(":", 1)[1]))
    Path(record.status_file).write_text(json.dumps(_status_file(dict.fromkeys(FIELDS, ATTACK))), encoding="utf-8")
    for args in (("list",), ("status", "m")):
        done = npuops_here(capsys, *args)
        assert done.code == 0 and "degraded: v" not in done.out and "degraded: " in done.out, (args, done)
        assert _no_terminal_control(done.out), (args, done)
    (row,) = json.loads(npuops_here(capsys, "list", "--json").out)["instances"]
    assert row["state"] == f"degraded: {ATTACK}"


def test_a_group_status_prints_another_host_s_answer_escaped() -> None:
    hostile = InstanceStatus("demo", ATTACK, False, "systemd", url="http://10.0.0.1:8000",
                             diagnosis=Diagnosis("hang", ATTACK, ATTACK, ATTACK, "npuops"))
    hosts = [InventoryHost("h1", "10.0.0.1", 22)]
    view = group_status(hosts, {"h1": HostAnswer("h1", "ok", {"instances": [hostile.to_json()]}, 1)})
    text = render_group_status_text("demo", "serve", view)
    assert all(c.isprintable() for line in text.split("\n") for c in line), ascii(text)
    assert len(text.splitlines()) == 4 and not any(line.startswith("FAKE") for line in text.splitlines())
    assert view.to_json()["hosts"]["h1"]["instance"]["diagnosis"]["fix"] == ATTACK


LOGGED = ["plain line", "tab\tseparated\tvalues", "C:\\path\\n stays", f"attack {ATTACK}", "é 鍵 \u202e"]
SHOWN = ["plain line", "tab\tseparated\tvalues", "C:\\path\\n stays", "attack \\x1b]0;PWN\\x07\\x1b[2J\\r",
         "FAKE", "é 鍵 \\u202e"]


def test_logs_print_the_journal_escaped_but_tabs_and_json_as_written(node: Node,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    node.record("m")
    # The stand-in prints the unit's "journal" (one line per entry, as journalctl -o cat does) and fails as asked.
    systemctl = node.bin / "systemctl3.py"
    systemctl.write_text(systemctl.read_text() + (
        'if args and args[0] == "log":\n'
        f'    sys.stdout.write({json.dumps(chr(10).join(LOGGED) + chr(10))})\n'
        f'    sys.exit(int(json.loads((here / "rc").read_text())) if (here / "rc").exists() else 0)\n'),
        encoding="utf-8")
    done = npuops_here(capsys, "logs", "m")
    assert done.code == 0 and done.out.split("\n") == [*SHOWN, ""], done
    kept = json.loads(npuops_here(capsys, "logs", "m", "--json").out)["lines"]
    assert "tab\tseparated\tvalues" in kept and any("\x1b]0;PWN\x07\x1b[2J" in line for line in kept), kept
    # journalctl's own failure is the command's exit status, as when npuops ran it in its place.
    (node.bin / "rc").write_text("4")
    assert npuops_here(capsys, "logs", "m").code == 4


def test_logs_of_a_foreground_run_print_engine_log_escaped(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    record = node.record("m", manager=MANAGER_FOREGROUND, status_file=str(node.state / "m" / STATUS_FILE))
    record.engine_log.write_text("\n".join(LOGGED) + "\n", encoding="utf-8")
    done = npuops_here(capsys, "logs", "m")
    assert done.code == 0 and done.out.split("\n") == [*SHOWN, ""], done

