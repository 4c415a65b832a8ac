"""Which figures time the engine's steps: the client's stream, or the engine's own histograms.

`vllm bench serve` times a request's first streamed chunk (TTFT) and spreads the rest over its later tokens
(TPOT). When the API server falls behind the engine (a busy host), one chunk carries several steps' tokens: the
first comes late and TPOT falls towards zero (a 2-core host gave a median TPOT of 0.00 ms four benches in four).
The engine's histograms (vLLM's `/metrics`, scraped before and after the bench) time every step where it runs,
however the stream is chunked later. A burst is what they contradict: a client TPOT under half the engine's.

Then TTFT, TPOT and ITL come from the engine (its mean over the bench, exact from the histograms' sums; their
buckets are too coarse for a median), and the report says so. Without engine histograms (an endpoint that
exports none) the only check left is the hardware's: a TPOT below the fastest step the memory bandwidth allows
cannot be a decode step, and such a bench times nothing.

An endpoint that streams N tokens a chunk (vLLM's --stream-interval N, which a plan sets where tokens come faster
than a reader needs them) has the client time one gap per chunk: its ITL is that gap over N, a token's share. Its
TTFT and TPOT still time the steps (the first token goes alone), except where the first token decodes to no text
yet (part of a UTF-8 character): then a short reply arrives in one chunk and the client's TPOT is ~0 (a CI run's
16-token replies at N = 16: median ITL and TPOT 0.00 ms), which is a burst like any other, and the engine's
figures time the bench. (Taking the engine's means whenever N > 1 was tried and is wrong: its mean TTFT is a
different figure from the client's median, a third of it on a CI run's small-model bench.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from npuops.bench.serve_bench import ServeFigures
from npuops.instance.metrics import EngineLatency
from npuops.plan.performance import Roofline

# A client TPOT under this share of the engine's is a stream in bursts: on a steady stream the client's TPOT is
# about the engine's (the demo's tiny model on 2 cores: client median 2.64 ms, engine mean 2.56 ms).
BURST_SHARE = 0.5
CLIENT, ENGINE = "client", "engine"
TIMED = ("ttft", "tpot", "itl")


@dataclass(frozen=True)
class StreamTiming:
    """The TTFT, TPOT and ITL a bench's ratios and calibration use, where they come from, and why."""

    source: str  # CLIENT (the stream's medians) or ENGINE (the histograms' means)
    ttft_ms: float
    tpot_ms: float
    itl_ms: float
    timed: bool  # whether these figures time the engine's steps (False: a burst nothing could correct)
    note: str | None  # why the engine's figures, or why none time the steps; None for a steady stream

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "ttft_ms": round(self.ttft_ms, 3), "tpot_ms": round(self.tpot_ms, 3),
                "itl_ms": round(self.itl_ms, 3), "timed": self.timed, "note": self.note}

    def figure(self, metric: str) -> float:
        return float(getattr(self, f"{metric}_ms"))


def choose_timing(measured: ServeFigures, engine: dict[str, EngineLatency] | None, limits: Roofline | None,
                  spec_tokens: int = 0, stream_interval: int = 1) -> StreamTiming:
    """The figures that time the engine (see the module's docstring). `stream_interval`: the tokens a streamed
    chunk carries (vLLM's --stream-interval), so the client's gap between chunks spans that many steps. Pure."""
    client = {m: measured.latency[m].median_ms for m in TIMED}
    client["itl"] /= max(stream_interval, 1)
    if engine is not None and all(m in engine for m in TIMED):
        engine_tpot = engine["tpot"].mean_ms
        if client["tpot"] >= BURST_SHARE * engine_tpot:
            return StreamTiming(CLIENT, client["ttft"], client["tpot"], client["itl"], True, None)
        cause = (f"the endpoint streams {stream_interval} tokens a chunk and the API server fell behind the engine"
                 if stream_interval > 1 else "the API server fell behind the engine")
        note = (f"median TPOT {client['tpot']:.2f} ms at the client, {engine_tpot:.2f} ms in the engine's own "
                f"histogram: the stream delivered its tokens in bursts ({cause}), so TTFT, TPOT and ITL are the "
                "engine's (means over the bench, from its /metrics)")
        return StreamTiming(ENGINE, engine["ttft"].mean_ms, engine_tpot, engine["itl"].mean_ms, True, note)
    if limits is not None:
        # Per output token: a speculative step yields up to 1 + K tokens.
        fastest_ms = limits.fastest_step_s / (1 + spec_tokens) * 1e3
        if client["tpot"] < fastest_ms:
            note = (f"median TPOT {client['tpot']:.2f} ms is below the fastest step the memory bandwidth allows "
                    f"({fastest_ms:.2f} ms): the stream delivered its tokens in bursts (the API server fell behind "
                    "the engine), and the endpoint exports no engine histograms to time its steps by")
            return StreamTiming(CLIENT, client["ttft"], client["tpot"], client["itl"], False, note)
    return StreamTiming(CLIENT, client["ttft"], client["tpot"], client["itl"], True, None)
