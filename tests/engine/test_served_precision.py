"""Served-model precision with the real vLLM CPU engine and the tiny model (issue: precision checks).

- vLLM float32 against the transformers float32 reference from the same weights: agrees;
- the same weights with noise added (a second tiny model made here, 5 % of each tensor's RMS) as the reference:
  detected as a failure — the comparison cannot pass whatever it is given;
- a golden file recorded from the session's engine passes against a second launch of the same model
  (`npuops launch --foreground --verify --golden`), a tampered golden file fails against it, and a launch whose
  verification fails stops itself and exits non-zero.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.engine import EngineProcess, engine_env, make_model, short_tmp_dir
from tests.support.http_server import free_port
from tests.support.npuops_cli import npuops_argv
from tests.support.paths import REPO
from tests.support.workspace import PLAN_FLAGS, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def doctor(env: dict[str, str], *args: str) -> dict[str, object]:
    proc = subprocess.run(npuops_argv("doctor", "--only", "served-precision", "--json", *args), env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=900, check=False)
    (check,) = json.loads(proc.stdout)["checks"]
    assert isinstance(check, dict)
    assert proc.returncode == (0 if check["status"] == "pass" else 1), proc.stderr
    return check


@pytest.fixture
def env(engine_python: Path, engine_compile_cache: Path, tmp_path: Path) -> dict[str, str]:
    # The session's inductor cache, which the session engine's warm-up has filled: the engines launched here
    # compile the same logprobs kernel on their first request (tests/support/engine.py, warm_up) and find it there.
    values = engine_env(tmp_path / "work", short_tmp_dir(), engine_compile_cache)
    values["NPUOPS_STACK_PYTHON"] = str(engine_python)  # the transformers reference runs there
    values["NPUOPS_STATE_DIR"] = str(tmp_path / "state")
    return values


def test_vllm_agrees_with_transformers_and_noise_is_caught(running_engine: EngineProcess, tiny_model: Path,
                                                            engine_python: Path, env: dict[str, str],
                                                            tmp_path: Path) -> None:
    url = running_engine.base_url
    clean = doctor(env, "--endpoint", url, "--reference-model", str(tiny_model))
    assert clean["status"] == "pass", clean["message"]
    evidence = clean["evidence"]
    assert isinstance(evidence, dict)
    assert evidence["agreement"] == 1.0 and evidence["max_logprob_diff"] < 1e-4
    assert evidence["reference"] == "transformers" and len(evidence["prompts"]) == 8

    noisy = make_model(engine_python, tmp_path / "noisy", noise=0.05)
    caught = doctor(env, "--endpoint", url, "--reference-model", str(noisy))
    assert caught["status"] == "fail", caught["message"]
    found = caught["evidence"]
    assert isinstance(found, dict)
    # The noise shows as a bound the comparison broke: agreement below its floor or a logprob difference above its cap.
    assert (found["agreement"] < found["bounds"]["min_agreement"]
            or found["max_logprob_diff"] > found["bounds"]["max_logprob_diff"]), found
    assert caught["remediation"]


def test_a_golden_file_passes_against_a_second_launch(running_engine: EngineProcess, tiny_model: Path,
                                                      engine_python: Path, env: dict[str, str],
                                                      tmp_path: Path) -> None:
    golden = tmp_path / "golden.json"
    recorded = subprocess.run(npuops_argv("golden", "record", "--endpoint", running_engine.base_url, "--output",
                                          str(golden), "--dtype", "float32", "--json"),
                              env=env, capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert recorded.returncode == 0, recorded.stderr
    assert json.loads(recorded.stdout)["prompts"] == 8

    port = free_port()
    out = tmp_path / "launch.out"
    with open(out, "w") as stdout:
        launcher = subprocess.Popen(
            npuops_argv("launch", str(tiny_model), *PLAN_FLAGS, "--name", "second", "--port", str(port),
                        "--vllm", str(engine_python.parent / "vllm"), "--foreground", "--verify",
                        "--golden", str(golden)),
            env=env, stdout=stdout, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        wait_for(lambda: "verify " in out.read_text() or launcher.poll() is not None, 300, "the verification")
        assert "verify     PASS" in out.read_text(), out.read_text()[-3000:]

        # The same check against the second engine with a tampered golden file fails.
        data = json.loads(golden.read_text())
        data["generations"][0]["token_ids"][0] += 1
        tampered = tmp_path / "tampered.json"
        tampered.write_text(json.dumps(data))
        check = doctor(env, "--endpoint", f"http://127.0.0.1:{port}", "--golden", str(tampered))
        assert check["status"] == "fail" and "agreement" in str(check["message"])
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()

    # A launch whose verification fails does not stay up.
    failing = subprocess.run(
        npuops_argv("launch", str(tiny_model), *PLAN_FLAGS, "--name", "third", "--port", str(free_port()),
                    "--vllm", str(engine_python.parent / "vllm"), "--foreground", "--verify",
                    "--golden", str(tampered)),
        env=env, capture_output=True, text=True, cwd=REPO, timeout=400, check=False)
    assert failing.returncode == 1, failing.stdout[-2000:] + failing.stderr[-2000:]
    assert "verify     FAIL" in failing.stdout and "verification failed; stopping it" in failing.stderr
