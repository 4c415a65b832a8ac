"""How many tokens a streaming client gets per chunk: vLLM's --stream-interval, chosen from the predicted TPOT."""

from __future__ import annotations

from npuops.errors import BadInputError
from npuops.plan.environment import feature_available
from npuops.plan.inputs import PlanOptions
from npuops.plan.performance import Prediction

# Streaming: a chunk about every STREAM_PERIOD_MS reads as continuous text (20 updates a second, several times a fast
# reader's pace), and sending each token on its own then only costs host time: the API server detokenizes, writes a
# JSON document and an HTTP chunk per token, the client reads each, and on a host-bound engine (a small model, many
# streams) that work competes with the engine's own steps. At most MAX_STREAM_INTERVAL tokens a chunk.
STREAM_PERIOD_MS = 50.0
MAX_STREAM_INTERVAL = 16


def stream_interval(options: PlanOptions, release: str | None, prediction: Prediction) -> int | None:
    """vLLM's --stream-interval: what the operator asked, else the tokens one chunk every STREAM_PERIOD_MS carries at
    the predicted TPOT (1, every token, where a token takes that long); None where the release's vLLM lacks it."""
    asked = options.fixed("stream_interval")
    supported = release is None or feature_available("stream_interval", release)
    if asked is not None:
        if asked > 1 and not supported:
            raise BadInputError(f"--stream-interval needs vLLM 0.13 or later; vllm-ascend {release} has vLLM's older "
                                "token-by-token streaming only",
                                "drop --stream-interval, or plan for vllm-ascend 0.13.0 or later "
                                "(--vllm-ascend-version)")
        return int(asked)
    if not supported:
        return None
    per_chunk = int(STREAM_PERIOD_MS // max(prediction.tpot_ms, 1e-3))
    return max(1, min(MAX_STREAM_INTERVAL, per_chunk))
