"""`npuops rollout` under real systemd, with the real vLLM CPU engine and the real vllm-router: two replicas behind
one endpoint switched from one model revision to another (two tiny models with different weights, so their
answers differ) while four clients stream through the endpoint; a revision whose weights do not load, rolled back;
`--undo` back to the first revision.

What an operator relies on: no request fails and no stream is cut during any of it, every answer after a rollout
comes from the new revision, a failed replica is back on the revision before with the reason said, and `status`
and the history say which revision each replica serves.

The tests of this module share one booted systemd (the session's) and run in order.
"""

from __future__ import annotations

import json
import shutil
import struct
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine import engine_python_or_skip, make_model
from tests.support.http_server import free_port_run
from tests.support.streams import StreamingClients
from tests.support.systemd import MODELS, ServingNode
from tests.systemd.test_lifecycle import status

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.systemd]

NAME = "ro"
PROMPT = "The revision that answers this is"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def port() -> int:
    # The router's port, the replicas' (port+1, port+2), the router's metrics port (port+3) and the surge replica's.
    return free_port_run(5)


@pytest.fixture(scope="module")
def models(serving_node: ServingNode, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Inside the node: the launch's model (a), another revision with other weights (b), and one whose weights do
    not load (its safetensors data cut short; the header, all a plan reads, intact)."""
    made = make_model(engine_python_or_skip(), tmp_path_factory.mktemp("rollout") / "tiny-llama-v2", seed=7)
    inside = {"a": serving_node.model, "b": MODELS / "tiny-llama-v2", "broken": MODELS / "tiny-llama-broken"}
    root = serving_node.systemd.root
    shutil.copytree(made, root / inside["b"].relative_to("/"))
    broken = root / inside["broken"].relative_to("/")
    shutil.copytree(made, broken)
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    header = 8 + struct.unpack("<Q", data[:8])[0]
    weights.write_bytes(data[:header + (len(data) - header) // 2])
    return inside


def _answer(port: int) -> str:
    """The endpoint's (or a replica's) greedy answer to PROMPT."""
    body = json.dumps({"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with DIRECT.open(request, timeout=120) as answer:
        return str(json.loads(answer.read())["choices"][0]["text"])


def _rollout(node: ServingNode, *args: str) -> tuple[int, dict[str, Any], str]:
    done = node.npuops("rollout", NAME, *args, "--json", timeout=1500)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"rollout printed no JSON (rc {done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}")
    return done.returncode, report, done.stderr


def _revisions(node: ServingNode) -> list[dict[str, Any]]:
    return list(json.loads(node.npuops("rollout", NAME, "--history", "--json").stdout)["revisions"])


def _served_revisions(node: ServingNode) -> dict[str, int]:
    return {p["name"]: p["revision"] for p in status(node, NAME)["parts"]}


GOLDEN = "/srv/npuops-test/rollout-golden.json"


@pytest.fixture(scope="module")
def first_answer(serving_node: ServingNode, port: int, models: dict[str, Path]) -> str:
    # A start timeout for a busy 2-core machine: each new engine starts while the other replica serves the clients.
    # A drain of 10 s: every streamed answer here takes a few seconds, and vLLM's CPU EngineCore lingers until the
    # drain timeout after its workers exit (then it is killed): each of this module's stops then costs 10 s, not 30.
    done = serving_node.launch(NAME, port, "--dp", "2", "--start-timeout", "900", "--drain-timeout", "10", "--json",
                               timeout=1500)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stderr[-4000:]
    # The first model's golden answers, recorded while nothing else runs here (from a replica: the same engine).
    recorded = serving_node.npuops("golden", "record", "--endpoint", f"http://127.0.0.1:{port + 1}", "--output",
                                   GOLDEN, "--dtype", "float32", "--max-tokens", "8")
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    return _answer(port)


def test_a_rollout_under_streaming_load_cuts_nothing_and_serves_the_new_revision(
        serving_node: ServingNode, port: int, models: dict[str, Path], first_answer: str) -> None:
    node = serving_node
    assert _served_revisions(node) == {f"{NAME}-r0": 1, f"{NAME}-r1": 1}
    with StreamingClients(port, None, clients=4) as clients:
        code, report, progress = _rollout(node, "--model", str(models["b"]))
    print(f"rollout under load: {len(clients.answers)} streamed answers, {len(clients.cut())} cut")  # for -rA
    assert code == 0 and report["ok"], (report, progress[-4000:])
    assert report["from_revision"] == 1 and report["to_revision"] == 2
    assert f"model: {models['a']} -> {models['b']}" in report["changes"]
    assert [(p["name"], p["ok"], p["revision"]) for p in report["parts"]] == [
        (f"{NAME}-r0", True, 2), (f"{NAME}-r1", True, 2)]
    assert len(clients.answers) >= 8 and clients.cut() == [], [(a.error, a.completion_tokens)
                                                                 for a in clients.cut()]
    # Every answer now comes from the new weights: each replica's own, and the endpoint's, again and again.
    new = _answer(port + 1)
    assert new != first_answer and _answer(port + 2) == new
    assert [_answer(port) for _ in range(6)] == [new] * 6
    assert _served_revisions(node) == {f"{NAME}-r0": 2, f"{NAME}-r1": 2}
    now = status(node, NAME)
    assert now["state"] == "healthy" and now["revision"] == 2 and now["rollout"] is None, now
    assert [(r["number"], r["command"], r["outcome"]) for r in _revisions(node)] == [
        (1, "launch", "superseded"), (2, "rollout", "serving")]
    # The new engine stayed out of the router until the rollout had verified it, then the rollout put it in.
    journal = node.systemd.check(["journalctl", "-u", f"npuops-{NAME}-r0.service", "--no-pager", "-o", "cat"])
    assert f"npuops[{NAME}-r0]: held out of router {NAME} by rollout" in journal, journal[-3000:]
    assert f"{NAME}-r0: in router {NAME}" in progress, progress[-3000:]


def test_a_revision_that_does_not_load_is_rolled_back_and_the_endpoint_serves_on(
        serving_node: ServingNode, port: int, models: dict[str, Path]) -> None:
    node = serving_node
    serving = _answer(port)
    with StreamingClients(port, None, clients=4) as clients:
        code, report, progress = _rollout(node, "--model", str(models["broken"]))
    assert code != 0 and not report["ok"], report
    assert f"{NAME}-r0: revision 3 failed (it failed to start" in progress and "back to revision 2" in progress
    (part,) = report["parts"]
    assert part["name"] == f"{NAME}-r0" and part["rolled_back"] and part["revision"] == 2, part
    assert part["reason"].startswith("it failed to start"), part
    assert report["untouched"] == [f"{NAME}-r1"] and report["reason"].startswith(f"{NAME}-r0: it failed"), report
    assert clients.cut() == [], [(a.error, a.completion_tokens) for a in clients.cut()]
    assert _served_revisions(node) == {f"{NAME}-r0": 2, f"{NAME}-r1": 2}
    assert [_answer(port) for _ in range(4)] == [serving] * 4
    last = _revisions(node)[-1]
    assert (last["number"], last["outcome"]) == (3, "rolled back") and last["reason"] == report["reason"]
    assert status(node, NAME)["state"] == "healthy"
    text = node.npuops("rollout", NAME, "--history").stdout
    assert "revision 3" in text and "rolled back" in text, text


def test_undo_with_a_surge_serves_through_a_switch_of_every_replica_at_once(serving_node: ServingNode, port: int,
                                                                           first_answer: str) -> None:
    """`--undo --surge --max-unavailable 2`: a temporary replica of the first revision starts on the side, is
    verified and joins the router; then both replicas leave and switch at once while it alone serves the
    streaming clients; then it leaves, drains and is removed."""
    node = serving_node
    # Two clients, not four: the surge replica and both new engines start on this machine's two cores meanwhile.
    with StreamingClients(port, None, clients=2) as clients:
        code, report, progress = _rollout(node, "--undo", "--surge", "--max-unavailable", "2")
    assert code == 0 and report["ok"], (report, progress[-4000:])
    # From revision 2 (the rolled-back 3 never served) back to 1's files, as revision 4.
    assert (report["from_revision"], report["to_revision"], report["command"]) == (2, 4, "rollout --undo")
    assert report["changes"][0].startswith("back to revision 1 (launch"), report
    surge = report["surge"]
    assert (surge["name"], surge["ok"], surge["revision"]) == (f"{NAME}-surge", True, 4), surge
    assert f"{NAME}-surge: a surge replica of revision 4 on port {port + 4}" in progress, progress[-3000:]
    assert f"{NAME}-surge: in router {NAME}" in progress, progress[-3000:]
    assert f"{NAME}: the surge replica leaves the router, drains and is removed" in progress
    assert len(clients.answers) >= 2 and clients.cut() == [], [(a.error, a.completion_tokens)
                                                                for a in clients.cut()]
    assert [_answer(port) for _ in range(4)] == [first_answer] * 4
    assert _served_revisions(node) == {f"{NAME}-r0": 4, f"{NAME}-r1": 4}
    assert [r["outcome"] for r in _revisions(node)] == ["superseded", "superseded", "rolled back", "serving"]
    # Nothing of the surge replica is left: its files, its unit, its place in the router.
    assert not (node.systemd.root / f"etc/npuops/{NAME}-surge").exists()
    gone = node.systemd.run(["systemctl", "cat", f"npuops-{NAME}-surge.service"])
    assert gone.returncode != 0, gone.stdout
    assert [p["name"] for p in status(node, NAME)["parts"]] == [f"{NAME}-r0", f"{NAME}-r1"]


def test_a_revision_whose_answers_differ_from_the_golden_file_is_put_back(serving_node: ServingNode, port: int,
                                                                          models: dict[str, Path],
                                                                          first_answer: str) -> None:
    """--verify-golden: a replica of the new revision answers /health and a first request, but not as the golden
    file (the first model's, which serves again after --undo) says: it goes back before it ever rejoins the
    router."""
    node = serving_node
    golden = GOLDEN
    code, report, progress = _rollout(node, "--model", str(models["b"]), "--verify-golden", golden)
    assert code != 0 and not report["ok"], (report, progress[-3000:])
    (part,) = report["parts"]
    assert part["rolled_back"] and part["reason"].startswith(f"its answers differ from {golden}"), part
    assert report["untouched"] == [f"{NAME}-r1"]
    # It never served a client: the endpoint's answers stayed the first model's throughout.
    assert [_answer(port) for _ in range(4)] == [first_answer] * 4
    assert _served_revisions(node) == {f"{NAME}-r0": 4, f"{NAME}-r1": 4}
    assert _revisions(node)[-1]["outcome"] == "rolled back"


def test_remove_takes_the_revisions_with_the_instance(serving_node: ServingNode) -> None:
    node = serving_node
    removed = node.npuops("remove", NAME, "--force", "--json")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    for part in (NAME, f"{NAME}-r0", f"{NAME}-r1"):
        assert not (node.systemd.root / f"etc/npuops/{part}").exists(), part
