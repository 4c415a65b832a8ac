"""`npuops collect` on a node tree made for the test (Settings.root): the instance's files and logs, CANN's and
vllm-ascend's logs (its default directory and one an instance names with ascend_log_path), what is skipped and why,
and the instance's API key in none of it. Under real systemd: tests/systemd/test_collect.py."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

from npuops.instance.record import write_record
from npuops.settings import Settings
from npuops.support.collect import CollectRequest, collect_node, parse_since
from tests.support.instance_records import make_record


def test_a_nodes_bundle_holds_its_logs_and_no_key(tmp_path: Path) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    key = "sk-npuops-" + secrets.token_hex(16)
    record = make_record(state, "demo", manager="foreground")
    write_record(record)
    record.env_file.write_text(f'VLLM_API_KEY="{key}"\nHF_HUB_OFFLINE="1"\n')
    # A foreground run logs where its status directory (the instance's) is (elsewhere: test_collect_log_trees.py).
    moved = state / "demo" / "vllm-ascend"
    record.config_file.write_text('model: "/models/tiny"\nadditional-config: '
                                  f'"{{\\"ascend_log_path\\": \\"{moved}\\"}}"\n')
    Path(record.status_file).parent.mkdir(parents=True, exist_ok=True)
    Path(record.status_file).write_text(json.dumps({"supervisor_pid": 1, "stage": "healthy"}))
    record.engine_log.write_text(f"INFO a request with the key {key}\n")
    logs = {
        "root/ascend/log/debug/plog/plog-1_1.log": f"[ERROR] HCCL(1) bare key {key}\n",
        "root/ascend/log/vllm_ascend/vllm_ascend.log": "INFO vllm-ascend's own log\n",
        "root/ascend/log/debug/plog/old.log": "too old\n",
    }
    for path, text in logs.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    moved.mkdir()
    (moved / "vllm_ascend_001.log").write_text(f"INFO moved log, key={key}\n")
    old = time.time() - 3 * 3600
    os.utime(root / "root/ascend/log/debug/plog/old.log", (old, old))

    settings = Settings(root=root, state_dir=state, stack_python=sys.executable)
    bundle = collect_node(settings, CollectRequest(("demo", "nosuch"), parse_since("2h")))
    paths = {f.path for f in bundle.files}
    for part in ("node.json", "doctor.json", "instances/demo/files/env", "instances/demo/files/vllm.yaml",
                 "instances/demo/engine.log", "instances/demo/status.json", "instances/demo/status-report.json",
                 "ascend-logs/root/debug/plog/plog-1_1.log", "ascend-logs/root/vllm_ascend/vllm_ascend.log",
                 "ascend-logs/demo-vllm-ascend/vllm_ascend_001.log"):
        assert part in paths, (part, sorted(paths))
    assert "ascend-logs/root/debug/plog/old.log" not in paths  # older than --since
    for path in paths:
        assert key.encode() not in bundle.data(path), path
    assert b"bare key [REDACTED]" in bundle.data("ascend-logs/root/debug/plog/plog-1_1.log")
    assert bundle.data("instances/demo/engine.log") == b"INFO a request with the key [REDACTED]\n"
    skipped = {s.what: s.why for s in bundle.skipped}
    assert "no such instance" in skipped["instance nosuch"]
    assert "not installed" in skipped["npu-smi/info.txt"] and "not installed" in skipped["msnpureport"]
    assert bundle.meta["instances"] == ["demo"]
    # Every part is in the bundle or said to be left out: the tree has no uname (its PATH is the tree's own).
    assert "system/uname.txt" in paths or "not installed" in skipped["system/uname.txt"]
