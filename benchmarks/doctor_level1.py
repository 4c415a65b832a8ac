"""Time `npuops doctor --level 1` against recorded captures, concurrent versus one check at a time.

The vendor tools are replaced by scripts on PATH that replay real captures (tests/fixtures/ascend),
so process start-up costs are real. Both variants run side by side, interleaved, in one process;
the ratio is what to read (these machines are noisy).

    python benchmarks/doctor_level1.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from npuops.doctor.context import CheckContext  # noqa: E402
from npuops.doctor.registry import discover_checks, select_checks  # noqa: E402
from npuops.doctor.runner import run_checks  # noqa: E402
from npuops.hardware.probe import Probe  # noqa: E402
from npuops.settings import Settings  # noqa: E402
from tests.support.captures import capture  # noqa: E402
from tests.support.fake_commands import write_fake_tool  # noqa: E402


def one_run(bin_dir: Path, root: Path, workers: int) -> float:
    settings = Settings(root=root, environ={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    checks = select_checks(discover_checks(), 1, None, None)
    start = time.perf_counter()
    report = run_checks(checks, CheckContext(Probe(settings)), max_workers=workers)
    elapsed = time.perf_counter() - start
    assert not [o for o in report.outcomes if o.result.status.value == "error"], "a check crashed"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp) / "bin"
        write_fake_tool(bin_dir, "npu-smi", capture("npu-smi-info_910b1_8dev_busy_elided_1.txt"))
        root = Path(tmp) / "root"
        root.mkdir()
        one_run(bin_dir, root, 8)  # warm imports and caches
        concurrent, sequential = [], []
        for _ in range(args.rounds):
            concurrent.append(one_run(bin_dir, root, 8))
            sequential.append(one_run(bin_dir, root, 1))
    c, s = statistics.median(concurrent), statistics.median(sequential)
    print(f"doctor level 1 over {len(select_checks(discover_checks(), 1, None, None))} checks, "
          f"{args.rounds} rounds (median)")
    print(f"  concurrent (8 workers): {c * 1000:8.1f} ms")
    print(f"  sequential (1 worker):  {s * 1000:8.1f} ms")
    print(f"  ratio concurrent/sequential: {c / s:.2f}")


if __name__ == "__main__":
    main()
