"""Running the plain-PyTorch baseline (npuops/bench/plain_pytorch.py) in the serving venv, with the devices free.

The process reads a request file and writes its result file (the same key names as `vllm bench serve`'s); its
stderr carries one progress line per batch, relayed here as progress. On an NPU instance the chips are the
instance's, and a second copy of the weights beside vLLM's KV cache does not fit: the instance is stopped for the
baseline and started again after (under systemd; a foreground run is the operator's terminal, so it is refused).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from npuops.bench.serve_bench import ServeFigures, parse_serve_result, scratch_dir
from npuops.errors import EnvironmentMissingError, MeasurementError, UsageError
from npuops.httpclient import base_url
from npuops.instance.control import parts_of, stop_instance
from npuops.instance.endpoint import health_ok
from npuops.instance.manager import SystemdManager, service_manager
from npuops.instance.record import MANAGER_SYSTEMD, InstanceRecord
from npuops.parsing import ParseError
from npuops.settings import Settings

# What plain_pytorch.py's exit codes mean (npuops' own: 3 bad input, 4 something missing).
_EXIT_MEANING = {3: "bad input", 4: "something it needs is missing"}


@contextmanager
def free_devices_for_baseline(settings: Settings, record: InstanceRecord | None, progress: Callable[[str], None],
                              manager: SystemdManager | None = None) -> Iterator[None]:
    """Stop an NPU instance for the duration (and start it again, healthy, after); nothing on the CPU engine."""
    if record is None or record.target_kind != "npu":
        yield
        return
    if record.manager != MANAGER_SYSTEMD:
        raise UsageError(f"the baseline needs {record.name}'s NPUs, and it runs in a terminal (--foreground)",
                         "launch it as a service, or stop it and bench another instance of the model")
    manager = manager or service_manager(settings)
    progress(f"baseline: stopping {record.name} to free devices {','.join(map(str, record.devices))}")
    stop_instance(record, manager)
    try:
        yield
    finally:
        progress(f"baseline: starting {record.name} again")
        for part in [*parts_of(record), record]:
            for unit in part.units:
                manager.start(unit)
        deadline = time.monotonic() + record.timeout_start_s
        url = base_url(record.host, record.port)
        while time.monotonic() < deadline and not health_ok(url, timeout=3.0):
            time.sleep(2.0)


def _environment(record: InstanceRecord | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    if record is not None and record.devices:
        env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(map(str, record.devices))
    return env


def run_plain_pytorch(python: Path, request: dict[str, Any], record: InstanceRecord | None, timeout_s: float,
                      progress: Callable[[str], None]) -> ServeFigures:
    work = scratch_dir()
    request_file, result_file = work / "baseline-request.json", work / "baseline-result.json"
    request_file.write_text(json.dumps(request), encoding="utf-8")
    argv = [str(python), "-m", "npuops.bench.plain_pytorch", str(request_file), str(result_file)]
    try:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   env=_environment(record), stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise EnvironmentMissingError(f"cannot run {python}: {exc.strerror}", "pass --vllm of the serving venv"
                                      ) from None
    last: list[str] = []
    started = time.monotonic()
    assert process.stderr is not None
    for line in process.stderr:
        line = line.rstrip()
        if line:
            last = [*last[-4:], line]
            progress(f"  {line}")
        if time.monotonic() - started > timeout_s:
            os.killpg(process.pid, 15)
            break
    rc = process.wait()
    if rc != 0 or not result_file.exists():
        meaning = _EXIT_MEANING.get(rc, "failed")
        raise MeasurementError(f"the plain-PyTorch baseline {meaning} (exit {rc}): {' | '.join(last[-2:])}",
                               "the same model and dtype must load with transformers in the serving venv")
    try:
        return parse_serve_result(result_file.read_text(encoding="utf-8"), str(result_file))
    except ParseError as exc:
        raise MeasurementError(str(exc), f"see {result_file}") from None
