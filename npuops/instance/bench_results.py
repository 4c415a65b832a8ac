"""An instance's benches: `<instance_dir>/bench/<time>.json` for each `npuops bench`, and `last.json`.

The report itself is built by npuops.bench; this module only keeps it with the instance and reads back the last
one for `npuops status`, which shows its headline (when, the load, throughput and latency beside the prediction).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from npuops.atomic import write_text_atomic
from npuops.instance.record import InstanceRecord

BENCH_DIR = "bench"
LAST_BENCH = "last.json"


def bench_dir(record: InstanceRecord) -> Path:
    return Path(record.instance_dir) / BENCH_DIR


def keep_bench(record: InstanceRecord, report: dict[str, Any]) -> Path:
    """Store a bench report with the instance (the timestamped file, then last.json pointing at the newest)."""
    directory = bench_dir(record)
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(float(report.get("at") or time.time())))
    text = json.dumps(report, indent=1) + "\n"
    path = directory / f"{stamp}.json"
    write_text_atomic(path, text, mode=0o644)
    write_text_atomic(directory / LAST_BENCH, text, mode=0o644)
    return path


def last_bench(record: InstanceRecord) -> dict[str, Any] | None:
    """The last bench report, or None when there is none (or it cannot be read: status shows no bench then)."""
    try:
        data = json.loads((bench_dir(record) / LAST_BENCH).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def bench_headline(report: dict[str, Any]) -> dict[str, Any] | None:
    """What status shows of a bench: when, the load, and the main figures with measured/predicted."""
    try:
        measured = report["measured"]
        latency = measured["latency"]
        ratios = report.get("ratios") or {}
        # The figures the bench's ratios are of: the engine's own when the client's stream could not time the steps (in
        # bursts, or several tokens a chunk; a bench
        # kept by an npuops before that choice has the client's medians alone).
        timing = report.get("timing") or {"source": "client", "ttft_ms": latency["ttft"]["median_ms"],
                                           "tpot_ms": latency["tpot"]["median_ms"]}
        return {
            "at": float(report["at"]), "file": report.get("file"), "load": dict(report["load"]),
            "output_throughput": float(measured["output_throughput"]),
            "median_ttft_ms": float(latency["ttft"]["median_ms"]),
            "median_tpot_ms": float(latency["tpot"]["median_ms"]),
            "figures": str(timing["source"]), "ttft_ms": float(timing["ttft_ms"]), "tpot_ms": float(timing["tpot_ms"]),
            "ratio_output_throughput": ratios.get("output_throughput"),
            "ratio_ttft": ratios.get("ttft"), "ratio_tpot": ratios.get("tpot"),
        }
    except (KeyError, TypeError, ValueError):
        return None


def render_bench_headline(headline: dict[str, Any]) -> str:
    """One line: `last bench 2026-12-01 20:14 (40 x 128/32, 4 in flight): 270 tok/s (0.95 of predicted), ...`."""
    load = headline["load"]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(headline["at"]))

    def ratio(key: str) -> str:
        value = headline.get(key)
        return f" ({value:.2f}x predicted)" if isinstance(value, (int, float)) else ""

    whose = " (the engine's own histograms)" if headline.get("figures") == "engine" else ""
    ttft = headline.get("ttft_ms", headline["median_ttft_ms"])
    tpot = headline.get("tpot_ms", headline["median_tpot_ms"])
    return (f"{when} ({load['num_prompts']} x {load['input_len']}/{load['output_len']} tokens, "
            f"{load['concurrency']} in flight): {headline['output_throughput']:.1f} output tok/s"
            f"{ratio('ratio_output_throughput')}, TTFT {ttft:.1f} ms{ratio('ratio_ttft')}, "
            f"TPOT {tpot:.2f} ms{ratio('ratio_tpot')}{whose}")
