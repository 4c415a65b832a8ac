"""instances-healthy: what counts as a broken instance part, from `npuops status` documents (pure), read as
InstanceStatus from only the keys each case needs (an older npuops' answer may leave the others out)."""

from __future__ import annotations

from typing import Any

import pytest

from npuops.checks.instances import _problem
from npuops.instance.status import InstanceStatus


def status(state: str, **extra: Any) -> dict[str, Any]:
    return {"name": "qwen", "state": state, **extra}


@pytest.mark.parametrize(("document", "expected"), [
    (status("healthy"), None),
    (status("stopped"), None),
    (status("starting (gate)"), None),
    (status("unhealthy"), "qwen: runs but does not answer /health"),
    (status("failed", diagnosis={"id": "not-a-model", "cause": "the directory holds no model"}),
     "qwen: failed: [not-a-model] the directory holds no model"),
    (status("failed"), "qwen: failed"),
    (status("failed", diagnosis={"id": "signal-sigkill", "cause": "killed"},
            cluster={"ray": {"complete": False, "missing": ["node-b"]}}),
     "qwen: no live Ray node on node-b; failed: [signal-sigkill] killed"),
    (status("healthy", cluster={"ray": {"complete": False, "missing": ["node-b", "node-c"]}}),
     "qwen: no live Ray node on node-b, node-c"),
    (status("healthy", cluster={"ray": {"complete": True, "missing": []}}), None),
    (status("healthy", cluster={"ray": {"error": "cannot reach the Ray head at 10.0.0.1:6379: refused"}}),
     "qwen: cannot reach the Ray head at 10.0.0.1:6379: refused"),
    (status("healthy", cluster={"strategy": "dp"}), None),
    # A chip of its in Alarm under a serving engine (the supervisor's words, tests/service/test_chip_watch.py).
    (status("degraded: NPU 4 chip 0 (device 4, bus 0000:DA:00.0) is 'Alarm'"),
     "qwen: degraded: NPU 4 chip 0 (device 4, bus 0000:DA:00.0) is 'Alarm'"),
    (status("healthy", cluster={"ray": {"complete": False, "missing": [], "short": ["node-b"]}}),
     "qwen: the Ray nodes of node-b offer fewer resources than the engine needs"),
])
def test_problem(document: dict[str, Any], expected: str | None) -> None:
    assert _problem(InstanceStatus.from_json(document)) == expected


@pytest.mark.parametrize(("document", "expected"), [
    (status("stopped", manager="systemd", unit="npuops-qwen.service"),
     "`systemctl start npuops-qwen.service` if it should serve"),
    (status("failed", manager="systemd", unit="npuops-qwen.service"),
     "`npuops status qwen` and `npuops logs qwen` say why"),
    (status("failed", manager="systemd", unit="npuops-qwen.service", cluster={"strategy": "ray"}),
     "`npuops status qwen` and `npuops logs qwen` say why; `npuops status qwen -i INVENTORY --group GROUP` "
     "shows every host's part"),
    # A foreground run on a machine without systemd: no unit to start.
    (status("stopped", manager="foreground"),
     "launch qwen again (`npuops launch ... --name qwen --foreground`), or `npuops remove qwen`"),
    (status("failed", manager="foreground"), "`npuops logs qwen` says why; launch it again, or `npuops remove qwen`"),
    (status("degraded: NPU 4 chip 0 (device 4, bus 0000:DA:00.0) is 'Alarm'", manager="systemd"),
     "`npuops doctor --only chip-health,chip-health-detail` reads the chip's alarm; launch qwen again on the other "
     "chips (`--devices`), or reset or replace the chip"),
])
def test_the_fix_names_the_instance_and_how_it_runs(document: dict[str, Any], expected: str) -> None:
    from npuops.checks.instances import _fix

    fix = _fix(InstanceStatus.from_json(document))
    assert fix == expected and "NAME" not in fix
