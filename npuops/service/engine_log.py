"""Reading progress out of the engine's log: which start-up stage a line announces. Pure.

The lines are vLLM's own (v0.32; vllm-ascend logs through the same code paths), e.g. from
tests/fixtures/engine/vllm-cpu-0.32-startup.log:
    (Worker pid=14857) INFO 11-29 11:41:53 [cpu_model_runner.py:68] Starting to load model /tmp/cap/tiny...
    (EngineCore pid=14808) INFO 11-29 11:41:54 [kv_cache_utils.py:2327] CPU KV cache size: 262,144 tokens, ...
    (APIServer pid=14727) INFO 11-29 11:41:59 [entry.py:140] Starting vLLM server on http://127.0.0.1:8312
"Healthy" is not read from the log: only an answer from /health counts.
"""

from __future__ import annotations

import re

from npuops.instance.state import Stage

_STAGE_LINES: tuple[tuple[Stage, re.Pattern[str]], ...] = (
    # gpu_model_runner.py / cpu_model_runner.py "Starting to load model %s..." (vllm-ascend's runner too).
    (Stage.LOADING, re.compile(r"Starting to load model|Loading weights|Loading safetensors checkpoint")),
    # kv_cache_utils.py "%s KV cache size: %s tokens" after the profile run.
    (Stage.KV_CACHE, re.compile(r"KV cache size: [\d,]+ tokens")),
    # CUDA/ACL graph capture (absent with --enforce-eager).
    (Stage.GRAPHS, re.compile(r"Capturing (?:CUDA|ACL|NPU)? ?graphs|Graph capturing finished|capturing.*graph",
                              re.IGNORECASE)),
    # entry.py "Starting vLLM server on %s"; uvicorn's own line on older versions.
    (Stage.LISTENING, re.compile(r"Starting vLLM server on|Uvicorn running on|Application startup complete")),
)

_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")


def stage_of(line: str) -> Stage | None:
    """The start-up stage a log line announces, if any."""
    for stage, pattern in _STAGE_LINES:
        if pattern.search(line):
            return stage
    return None


def kv_cache_tokens(line: str) -> int | None:
    match = _KV_TOKENS.search(line)
    return int(match.group(1).replace(",", "")) if match else None


# vLLM's EngineCore on SIGTERM with --shutdown-timeout (vllm/v1/engine/core.py _handle_shutdown): how many requests
# it drains, and when none is left.
_DRAINING = re.compile(r"\[shutdown\] EngineCore: draining in-flight requests count=(\d+)")
_DRAINED = re.compile(r"\[shutdown\] EngineCore: request processing complete")


def drain_count(line: str) -> int | None:
    """The requests a stopping engine still holds, from its own shutdown lines (0 once drained), or None."""
    match = _DRAINING.search(line)
    if match:
        return int(match.group(1))
    return 0 if _DRAINED.search(line) else None
