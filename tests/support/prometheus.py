"""A real Prometheus and a real node_exporter for the tests (Debian's prometheus and prometheus-node-exporter,
which scripts/test.sh installs), each on 127.0.0.1 with a temporary data directory, stopped with the test.

Prometheus runs on the configuration `npuops monitor render` wrote; its HTTP API answers what it scraped, its
targets' health and its alerts (api/v1/query, /targets, /alerts). node_exporter serves only its textfile collector
(the doctor's textfile) and timex (the clock), the collectors npuops' rules read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_server import free_port

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


def _binary(name: str) -> str:
    found = shutil.which(name) or (name if Path(name).is_file() else None)
    if found is None:
        reason = f"{name} is missing: install Debian's prometheus and prometheus-node-exporter (scripts/test.sh does)"
        if os.environ.get("NPUOPS_REQUIRE_PROMTOOL") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{url} exited ({process.returncode}): {log.read_text(errors='replace')[-3000:]}")
        try:
            with DIRECT.open(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in {timeout_s:.0f} s: {log.read_text(errors='replace')[-3000:]}")


class Served:
    """A started process answering on 127.0.0.1:port, stopped by close()."""

    def __init__(self, argv: list[str], port: int, ready_path: str, log: Path) -> None:
        self.port = port
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _wait_ready(self.process, f"http://127.0.0.1:{port}{ready_path}", log)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_node_exporter(textfile_dir: Path, work: Path, port: int | None = None) -> Served:
    port = port or free_port()
    argv = [_binary(NODE_EXPORTER), f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
            "--collector.textfile", f"--collector.textfile.directory={textfile_dir}", "--collector.timex"]
    return Served(argv, port, "/metrics", work / "node-exporter.log")


class Prometheus(Served):
    """Prometheus on a rendered configuration, and its HTTP API."""

    def __init__(self, config: Path, work: Path) -> None:
        port = free_port()
        data = work / "prometheus-data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [_binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"]
        super().__init__(argv, port, "/-/ready", work / "prometheus.log")

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with DIRECT.open(f"http://127.0.0.1:{self.port}/api/v1/{path}{query}", timeout=30) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name]
