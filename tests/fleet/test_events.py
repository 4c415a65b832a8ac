"""The pure half of a playbook run (fleet/events.py, fleet/host_results.py): ansible-runner event dicts in,
typed events and per-host results out.

Replays real recordings (fixtures/README.md says how they were made); no Ansible runs here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from npuops.fleet.events import HostStats, PlaybookEvent, ansible_errors, parse_event, result_message
from npuops.fleet.facts import FIX_NO_MODEL, FIX_NOT_FOUND, FIX_UNREACHABLE, NODE_STATS_KEY, fleet_facts_from_run
from npuops.fleet.host_results import EventCollector
from tests.support.playbook_runs import recorded, replay

ALL_RECORDINGS = [
    "node-facts-local-and-unreachable",
    "node-facts-missing-command",
    "mixed-two-local",
    "write-file-check-diff",
    "limit-no-match",
    "broken-inventory",
]


def typed(name: str) -> list[PlaybookEvent]:
    return [e for e in (parse_event(raw) for raw in recorded(name)) if e is not None]


def by_task(events: list[PlaybookEvent], task: str, host: str) -> PlaybookEvent:
    (found,) = [e for e in events if e.task == task and e.host == host and e.kind != "task_start"]
    return found


@pytest.mark.parametrize("name", ALL_RECORDINGS)
def test_every_recorded_event_parses(name: str) -> None:
    raws = recorded(name)
    assert raws, "empty recording"
    for raw in raws:
        event = parse_event(raw)
        if raw["event"] in ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable"):
            assert event is not None and event.host is not None and event.task
        elif raw["event"] == "playbook_on_task_start":
            assert event is not None and event.kind == "task_start" and event.host is None
        elif raw["event"] == "playbook_on_stats":
            assert event is not None and event.kind == "stats" and event.stats is not None
        else:
            assert event is None, raw["event"]


def test_unreachable_host_and_local_host() -> None:
    events = typed("node-facts-local-and-unreachable")
    assert [e.kind for e in events if e.host == "unreachable"] == ["unreachable"]
    dead = by_task(events, "Run npuops node --json", "unreachable")
    assert "Connection refused" in dead.message and "127.0.0.1 port 1" in dead.message
    assert not dead.message.startswith("Task failed")
    read = by_task(events, "Run npuops node --json", "localhost")
    assert read.kind == "ok" and not read.changed and read.action == "ansible.builtin.command"
    assert read.duration is not None and read.duration > 0
    handback = by_task(events, "Hand the node model back to the controller", "localhost")
    assert handback.set_stats is not None and handback.set_stats["per_host"] is True
    stats = events[-1]
    assert stats.kind == "stats" and stats.stats == {
        "localhost": HostStats(ok=2),
        "unreachable": HostStats(unreachable=1),
    }


def test_node_facts_travel_back_per_host() -> None:
    run = replay("node-facts-local-and-unreachable", rc=4, status="failed")
    assert run.hosts["localhost"].status == "ok"
    assert run.hosts["unreachable"].status == "unreachable"
    assert run.run_data == {}  # per_host set_stats stays out of the final stats event
    facts = fleet_facts_from_run(run)
    local = facts.hosts["localhost"]
    assert local.status == "ok" and local.node is not None
    assert local.node.has_npus is False
    assert local.node.host.hostname
    dead = facts.hosts["unreachable"]
    assert dead.status == "unreachable" and dead.node is None and dead.fix == FIX_UNREACHABLE
    assert not facts.ok and list(facts.nodes()) == ["localhost"]
    shape = facts.to_json()
    assert set(shape) == {"ok", "artifacts", "hosts"}
    assert set(shape["hosts"]["unreachable"]) == {"status", "message", "fix", "node"}


@pytest.mark.parametrize(("answer", "says"), [
    (None, "the host returned no npuops node model"),
    ({"ok": True, "instances": []}, "not an npuops node model: the document lacks npu, host"),
    ({"npu": {}, "host": {}, "chips": [{"npu_id": "0"}]}, "chips[0].npu_id is a string, not an integer"),
])
def test_an_answer_that_is_no_node_model_fails_the_host(answer: Any, says: str) -> None:
    run = replay("node-facts-local-and-unreachable", rc=4, status="failed")
    local = run.hosts["localhost"]
    data = {k: v for k, v in local.data.items() if k != NODE_STATS_KEY}
    if answer is not None:
        data[NODE_STATS_KEY] = answer
    run = dataclasses.replace(run, hosts={**run.hosts, "localhost": dataclasses.replace(local, data=data)})
    host = fleet_facts_from_run(run).hosts["localhost"]
    assert host.status == "failed" and host.node is None and host.fix == FIX_NO_MODEL
    assert says in host.message and "\n" not in host.message


def test_missing_npuops_on_the_host() -> None:
    run = replay("node-facts-missing-command", rc=2, status="failed")
    host = run.hosts["localhost"]
    assert host.status == "failed" and host.stats.failed == 1
    assert host.message.startswith("cannot execute `/nonexistent/bin/npuops node --json`")
    assert "No such file or directory" in host.message
    facts = fleet_facts_from_run(run)
    assert facts.hosts["localhost"].fix == FIX_NOT_FOUND


def test_mixed_results_two_hosts() -> None:
    events = typed("mixed-two-local")
    hello = by_task(events, "Say hello", "localhost")
    assert hello.role == "greet" and hello.kind == "ok" and hello.message == "hello from the greet role"
    assert by_task(events, "Write a file", "second").kind == "changed"
    assert by_task(events, "Skip on purpose", "localhost").kind == "skipped"
    ignored = by_task(events, "Fail and ignore it", "localhost")
    assert ignored.kind == "failed" and ignored.ignored and ignored.rc == 1
    assert ignored.message == "`/bin/false` exited 1"
    loop = by_task(events, "Fail in a loop and ignore it", "localhost")
    assert loop.ignored and "sys.exit(5)" in loop.message and "exited 5" in loop.message
    real = by_task(events, "Fail for real", "second")
    assert real.kind == "failed" and not real.ignored and real.rc == 3
    assert real.message.endswith("exited 3: boom")

    run = replay("mixed-two-local", rc=2, status="failed")
    local, second = run.hosts["localhost"], run.hosts["second"]
    # The recap: a rescued failure and ignored failures do not fail a host.
    assert local.status == "ok" and local.message == ""
    assert local.stats == HostStats(ok=9, changed=1, failed=0, skipped=2, unreachable=0, ignored=2, rescued=1)
    assert second.status == "failed" and second.message == real.message
    assert second.stats.failed == 1
    # The rescued failure is still on record; the fatal one is last.
    assert [f.task for f in second.failures] == ["Fail inside a block", "Fail for real"]
    # set_stats per host, aggregated over two tasks the way Ansible aggregates.
    assert local.data == {"npuops_test": {"first": "localhost", "second": 2}}
    assert second.data == {"npuops_test": {"first": "second", "second": 2}}
    # set_stats without per_host: the run's data from the final stats event.
    assert set(run.run_data) == {"npuops_run"}
    assert not run.ok


def test_check_mode_diff_event() -> None:
    (write,) = [e for e in typed("write-file-check-diff") if e.kind not in ("task_start", "stats")]
    assert write.kind == "changed" and write.changed
    assert write.diff and write.diff[0]["after"] == "written\n"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("limit-no-match", "Specified inventory, host pattern and/or --limit leaves us with no hosts to target."),
        ("broken-inventory", "No inventory was parsed, please check your configuration and options."),
    ],
)
def test_ansible_errors_before_any_task(name: str, expected: str) -> None:
    run = replay(name, rc=1, status="failed")
    assert run.hosts == {}
    assert run.errors[0] == expected


def test_verbose_error_with_origin() -> None:
    raw = {"event": "verbose", "stdout": "\x1b[0;31m[ERROR]: couldn't resolve module/action 'x'.\x1b[0m\n"
                                         "\x1b[0;31mOrigin: /p/bad.yml:4:7\x1b[0m"}
    assert ansible_errors(raw) == ["couldn't resolve module/action 'x'. (/p/bad.yml:4:7)"]
    assert ansible_errors({"event": "verbose", "stdout": "[WARNING]: something"}) == []
    assert ansible_errors({"event": "runner_on_ok", "stdout": "[ERROR]: not a verbose event"}) == []


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"event": None},
        {"event": "runner_on_ok"},
        {"event": "runner_on_ok", "event_data": None},
        {"event": "runner_on_failed", "event_data": {"res": "not a dict", "duration": "x", "host": 5}},
        {"event": "runner_on_unreachable", "event_data": {"res": {"msg": None, "rc": "2"}}},
        {"event": "playbook_on_stats", "event_data": {"ok": "x", "dark": {"h": "1"}, "failures": {"h": 2}}},
        {"event": "runner_item_on_ok", "event_data": {"host": "h"}},
        {"event": "verbose", "stdout": 7},
    ],
)
def test_parser_is_total(raw: dict[str, Any]) -> None:
    event = parse_event(raw)
    assert event is None or isinstance(event, PlaybookEvent)
    assert isinstance(ansible_errors(raw), list)
    EventCollector().add(raw)


def test_stats_counts_ignore_garbage() -> None:
    event = parse_event({"event": "playbook_on_stats", "event_data": {"dark": {"h": "1"}, "failures": {"h": 2}}})
    assert event is not None and event.stats == {"h": HostStats(failed=2)}


@pytest.mark.parametrize(
    ("res", "kind", "message"),
    [
        ({"msg": "non-zero return code", "rc": 2, "cmd": ["npuops", "node"], "stderr": "a\nnpuops: error: x\n"},
         "failed", "`npuops node` exited 2: a | npuops: error: x"),
        ({"msg": "Error executing command.", "rc": 13, "cmd": "npuops node"}, "failed",
         "cannot execute `npuops node` on the host: Permission denied (EACCES)"),
        ({"msg": "Task failed: Failed to connect to the host via ssh: refused"}, "unreachable",
         "Failed to connect to the host via ssh: refused"),
        ({"msg": "One or more items failed", "results": [{"failed": False}, {"failed": True, "msg": "item 2"}]},
         "failed", "item 2"),
        ({"changed": False, "skip_reason": "Conditional result was False"}, "skipped", "Conditional result was False"),
        ({}, "failed", "task failed"),
    ],
)
def test_result_message(res: dict[str, Any], kind: Any, message: str) -> None:
    assert result_message(res, kind) == message
