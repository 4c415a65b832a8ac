"""Prefill/decode disaggregation under real systemd: `npuops launch --pd 1:1` starts a prefill engine and a decode
engine of the tiny model (the real vLLM CPU engine, vLLM's ExampleConnector with the instance's shared KV
directory) and vllm-router in PD mode in front of them, each in its own hardened unit.

What must hold: a completion through the one endpoint is prefilled on the producer and decoded on the consumer,
which loads the prompt's KV instead of computing it (its "External Cache Hit!" log line and vLLM's
external_prefix_cache_hits_total counter); status shows both pools; a decode engine killed mid-run is restarted by
systemd while the endpoint reports it, and serves again.

The tests of this module share one booted systemd (the session's) and run in order.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

import pytest

from tests.support.http_server import free_port_run
from tests.support.systemd import ServingNode
from tests.systemd.test_lifecycle import status, wait_for
from tests.systemd.test_router import _request

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.systemd]

NAME = "pd"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# ~209 tokens of the tiny model's tokenizer: more than one 128-token KV block, so the consumer has whole blocks to
# load (ExampleConnector hands over the prompt's blocks but its last token, which the consumer computes itself).
LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)


def _complete(port: int, prompt: str) -> tuple[int, dict[str, Any]]:
    return _request(port, prompt, key=None)


def _counter(port: int, name: str, labels: str = "") -> float:
    """A counter from an engine's own /metrics (summed over its label sets that contain `labels`)."""
    with DIRECT.open(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    pattern = rf"^{re.escape(name)}\{{([^}}]*)\}} ([\d.e+]+)$"
    return sum(float(m.group(2)) for m in re.finditer(pattern, text, re.M) if labels in m.group(1))


@pytest.fixture(scope="module")
def port() -> int:
    # The router's port, the prefill and decode engines' (port+1, port+2) and the router's metrics (port+3).
    return free_port_run(4)


def test_launch_pd_starts_a_prefill_and_a_decode_engine_behind_a_pd_router(serving_node: ServingNode,
                                                                            port: int) -> None:
    node = serving_node
    done = node.launch(NAME, port, "--pd", "1:1", "--json", timeout=1500)
    report = json.loads(done.stdout)
    if not (done.returncode == 0 and report["ok"]):
        journal = node.systemd.run(["journalctl", "--no-pager", "-n", "120", "-u", f"{NAME}-p0", "-u",
                                    f"npuops-{NAME}-p0.service", "-u", f"npuops-{NAME}-d0.service"]).stdout
        pytest.fail(f"launch --pd failed (rc {done.returncode}):\n{done.stderr[-3000:]}\njournal:\n{journal}")
    assert [i["name"] for i in report["instances"]] == [f"{NAME}-p0", f"{NAME}-d0", NAME]
    for part, role in (("p0", "kv_producer"), ("d0", "kv_consumer")):
        config = (node.systemd.root / f"etc/npuops/{NAME}-{part}/vllm.yaml").read_text()
        assert f'\\"kv_role\\":\\"{role}\\"' in config and "ExampleConnector" in config, config
        assert f"/var/lib/npuops-{NAME}-kv" in config, config
    router = json.loads((node.systemd.root / f"etc/npuops/{NAME}/router.json").read_text())["argv"]
    assert router[:5] == ["--vllm-pd-disaggregation", "--prefill", f"http://127.0.0.1:{port + 1}",
                          "--decode", f"http://127.0.0.1:{port + 2}"], router
    # Each engine has its own core (VLLM_CPU_OMP_THREADS_BIND): two engines left to vLLM would share the first.
    binds = {(node.systemd.root / f"etc/npuops/{NAME}-{part}/env").read_text().split("VLLM_CPU_OMP_THREADS_BIND=")[1]
             .splitlines()[0] for part in ("p0", "d0")}
    assert len(binds) == 2, binds
    security = node.systemd.run(["systemd-analyze", "security", "--no-pager", f"npuops-{NAME}-d0.service"])
    score = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
    assert score and float(score.group(1)) <= 2.0, security.stdout[-2000:]


def test_a_completion_is_prefilled_on_the_producer_and_decoded_from_its_kv(serving_node: ServingNode,
                                                                           port: int) -> None:
    node = serving_node
    hits_before = _counter(port + 2, "vllm:external_prefix_cache_hits_total")
    prefilled_before = _counter(port + 1, "vllm:prompt_tokens_total")
    code, answer = _complete(port, LONG_PROMPT)
    assert code == 200 and answer["usage"]["completion_tokens"] == 8, answer
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert prompt_tokens > 129, answer["usage"]
    # The producer computed the prompt (and generated its one token); the consumer loaded whole blocks of it.
    assert _counter(port + 1, "vllm:prompt_tokens_total") - prefilled_before == prompt_tokens
    loaded = _counter(port + 2, "vllm:external_prefix_cache_hits_total") - hits_before
    assert loaded >= 128, loaded
    assert _counter(port + 2, "vllm:prompt_tokens_by_source_total", 'source="external_kv_transfer"') >= loaded
    log = json.loads(node.npuops("logs", NAME, "--part", "d0", "--json", "-n", "400").stdout)
    assert any("External Cache Hit!" in line for line in log["lines"]), log["lines"][-20:]
    kv_dir = node.systemd.root / f"var/lib/npuops-{NAME}-kv"
    assert any(kv_dir.iterdir()), "the producer wrote no KV into the shared directory"


def test_status_shows_both_pools(serving_node: ServingNode, port: int) -> None:
    now = status(serving_node, NAME)
    assert now["state"] == "healthy" and now["role"] == "router", now
    pools = {p["name"]: p.get("pd_role") for p in now["parts"]}
    assert pools == {f"{NAME}-p0": "prefill", f"{NAME}-d0": "decode"}, pools
    text = serving_node.npuops("status", NAME).stdout
    assert f"{NAME}-p0" in text and "prefill healthy" in text and "decode healthy" in text, text
    loaded = re.search(r"(\d+) prompt token\(s\) loaded from prefill", text)
    assert loaded and int(loaded.group(1)) >= 128, text


def test_a_killed_decode_engine_is_restarted_while_the_endpoint_reports_it(serving_node: ServingNode,
                                                                           port: int) -> None:
    node = serving_node
    unit = f"npuops-{NAME}-d0.service"
    restarts = int(node.systemd.unit_property(unit, "NRestarts"))
    engine = json.loads((node.systemd.root / f"var/lib/npuops-{NAME}-d0/supervisor.json").read_text())["engine_pid"]
    node.systemd.check(["kill", "-KILL", str(engine)])
    seen: list[str] = []

    def reported() -> bool:
        seen.append(status(node, NAME)["state"])
        return seen[-1].startswith("degraded") and f"{NAME}-d0" in seen[-1]

    wait_for("the endpoint reports d0 down", reported, 120, poll=1)
    wait_for("d0 restarted", lambda: int(node.systemd.unit_property(unit, "NRestarts")) > restarts, 180)
    wait_for("all healthy again", lambda: status(node, NAME)["state"] == "healthy", 400, poll=3)
    hits = _counter(port + 2, "vllm:external_prefix_cache_hits_total")
    deadline = time.monotonic() + 120
    while _complete(port, LONG_PROMPT + " again")[0] != 200 and time.monotonic() < deadline:
        time.sleep(2)
    assert _counter(port + 2, "vllm:external_prefix_cache_hits_total") > hits


def test_stop_stops_every_part(serving_node: ServingNode, port: int) -> None:
    node = serving_node
    done = node.npuops("stop", NAME, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout + done.stderr
    for unit in (f"npuops-{NAME}-router.service", f"npuops-{NAME}-p0.service", f"npuops-{NAME}-d0.service"):
        assert node.systemd.unit_property(unit, "ActiveState") in ("inactive", "failed"), unit
