"""A replica leaves its router before it drains and joins it once healthy (npuops/instance/router_admin.py),
against a stand-in router that replays vllm-router 0.1.17's recorded answers (tests/fixtures/router/worker-api.txt);
tests/systemd/test_router.py does it with the real router under systemd."""

from __future__ import annotations

import http.server
import re
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from npuops.instance.router_admin import join_router, leave_router, replica_url, router_of, worker_urls
from npuops.launch.install import write_instance
from npuops.launch.instance_files import LaunchSpec, render_instances
from npuops.plan.catalog import load_model
from npuops.plan.inputs import PlanOptions, Workload
from npuops.plan.planner import make_plan
from npuops.plan.target import cpu_target
from tests.support.http_server import free_port
from tests.support.model_dirs import write_tiny_model
from tests.support.paths import FIXTURES

RECORDED = (FIXTURES / "router" / "worker-api.txt").read_text(encoding="utf-8").splitlines()


def _recorded(kind: str) -> tuple[str, int]:
    """The recorded answer of one kind ("removed", "added", "already exists"), a template for any URL."""
    line = next(line for line in RECORDED if kind in line and not line.startswith("$"))
    body, status = line.rsplit(" ", 1)
    return re.sub(r"http://\S+", "{url}", body), int(status)


class _Router(http.server.BaseHTTPRequestHandler):
    workers: ClassVar[set[str]] = set()
    calls: ClassVar[list[tuple[str, str, str | None]]] = []

    def do_POST(self) -> None:
        path, _, query = self.path.partition("?")
        url = urllib.parse.parse_qs(query)["url"][0]
        verb = path.strip("/")
        type(self).calls.append((verb, url, self.headers.get("Authorization")))
        if verb == "add_worker":
            kind = "already exists" if url in self.workers else "added"
            self.workers.add(url)
        else:
            kind = "removed"
            self.workers.discard(url)
        template, status = _recorded(kind)
        data = template.format(url=url).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def routed(tmp_path: Path) -> Iterator[tuple[list, int]]:  # type: ignore[type-arg]
    port = free_port()
    model = write_tiny_model(tmp_path / "tiny-llama")
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", replicas=2))
    instances = render_instances(plan, LaunchSpec(name="m", port=port, state_dir=tmp_path / "state"))
    for instance in instances:
        write_instance(instance, tmp_path / "state", unit_dir_file=instance.unit_name)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Router)
    _Router.workers, _Router.calls = set(instances[-1].record.backends), []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield [i.record for i in instances], port
    finally:
        server.shutdown()
        server.server_close()


def test_the_recorded_list_is_read() -> None:
    assert worker_urls(RECORDED[1].encode()) == ["http://127.0.0.1:18901", "http://127.0.0.1:18902"]
    assert worker_urls(b"Successfully removed worker: x") is None and worker_urls(b'{"urls": 3}') is None


def test_a_replica_leaves_and_joins_its_router(routed: tuple[list, int]) -> None:  # type: ignore[type-arg]
    (r0, r1, router), _port = routed
    assert router_of(r1) == router and router_of(router) is None  # the router itself is behind nothing
    url = replica_url(r1, router)
    assert url in router.backends
    left = leave_router(r1, "sk-key")
    assert left is not None and left.done and left.message == f"out of router m (Successfully removed worker: {url})"
    assert url not in _Router.workers and replica_url(r0, router) in _Router.workers
    joined = join_router(r1, "sk-key")
    assert joined is not None and joined.done and url in _Router.workers
    again = join_router(r1, "sk-key")  # already there (a restart the router never noticed): done all the same
    assert again is not None and again.done and "already exists" in again.message
    assert all(key == "Bearer sk-key" for _, _, key in _Router.calls)


def test_no_router_here_or_none_answering(routed: tuple[list, int], tmp_path: Path) -> None:  # type: ignore[type-arg]
    (_r0, r1, router), _port = routed
    from dataclasses import replace

    alone = replace(r1, behind=None)
    assert leave_router(alone, None) is None and join_router(alone, None) is None
    prefill = replace(r1, pd_role="prefill")  # one of a PD router's pools: left to its health checks
    assert leave_router(prefill, None) is None and join_router(prefill, None) is None
    (Path(router.directory) / "instance.json").unlink()  # the router on another host: no record here
    assert leave_router(r1, None) is None


def test_a_router_that_does_not_answer_is_said_so(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny-llama")
    plan = make_plan(load_model(str(model)), cpu_target(16 * 2**30, 4, 1), Workload(128, 32),
                     PlanOptions(kv_cache_memory_bytes=256 * 2**20, dtype="float32", replicas=2))
    instances = render_instances(plan, LaunchSpec(name="m", port=free_port(), state_dir=tmp_path / "state"))
    for instance in instances:
        write_instance(instance, tmp_path / "state", unit_dir_file=instance.unit_name)
    r1 = instances[1].record
    left, joined = leave_router(r1, None), join_router(r1, None)
    assert left is not None and not left.done and "did not answer (not running?)" in left.message
    assert joined is not None and not joined.done and "--worker-urls" in joined.message
