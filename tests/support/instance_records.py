"""A small factory for InstanceRecord objects in the service tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from npuops.instance.record import MANAGER_SYSTEMD, STATUS_FILE, InstanceRecord


def make_record(state_dir: Path, name: str = "demo", **overrides: Any) -> InstanceRecord:
    """A record as launch would write it under state_dir/<name>/; any field can be overridden."""
    directory = state_dir / name
    values: dict[str, Any] = {
        "name": name,
        "manager": MANAGER_SYSTEMD,
        "unit": f"npuops-{name}.service",
        "model_path": "/models/tiny",
        "served_model_name": "tiny",
        "host": "127.0.0.1",
        "port": 8000,
        "devices": (),
        "target_kind": "cpu",
        "hardware_label": "cpu",
        "vllm_command": ("/opt/npuops/venv/bin/vllm", "serve"),
        "instance_dir": str(directory),
        "status_file": str(directory / STATUS_FILE),
        "timeout_start_s": 600,
        "watchdog_s": 60,
        "stop_timeout_s": 30,
        "gpu_memory_utilization": 0.9,
        "graph_mode": False,
        "created_at": 1_700_000_000.0,
    }
    values.update(overrides)
    return InstanceRecord(**values)


def keep_status_under(instance_dir: Path, var: Path) -> None:
    """The record's supervisor status file under the test's directory (as the service data root), not the node's
    /var/lib."""
    path = instance_dir / "instance.json"
    data = json.loads(path.read_text())
    data["status_file"] = str(var / f"npuops-{instance_dir.name}" / "supervisor.json")
    (var / f"npuops-{instance_dir.name}").mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
