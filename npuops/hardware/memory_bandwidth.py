"""The memory bandwidth of this host, measured: the roofline of the CPU engine's decode step.

A decode step streams the model's weights (and the batch's KV cache) from memory once, so the fastest step is
their bytes over the bandwidth the host's cores can read at. No file reports that figure (DMI gives each DIMM's
speed, to root only, and says nothing of how many channels the cores reach), so it is measured, as STREAM does,
on buffers far larger than any cache: libc's memchr scans a zeroed buffer for a byte that is not there (it reads
every byte, vectorized, and writes none), one thread per CPU this process may use (ctypes releases the GIL for
the call), best of a few rounds. The best over 1..N threads is kept: on a host whose cores already serve, one
thread may read faster than two.

The figure is measured once per host and kept with the node's calibration (npuops/plan/calibration.py); NPUs'
HBM bandwidth comes from the chip catalog instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from dataclasses import dataclass

from npuops.errors import EnvironmentMissingError

BUFFER_BYTES = 256 * 2**20  # per thread: far above any L3 cache
ROUNDS = 4
SCANS_PER_ROUND = 3


@dataclass(frozen=True)
class MeasuredBandwidth:
    bytes_per_s: float
    threads: int  # the thread count that read fastest
    method: str

    def describe(self) -> str:
        return f"{self.bytes_per_s / 1e9:.1f} GB/s ({self.method})"


def _memchr() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        function = libc.memchr
    except (OSError, AttributeError) as exc:
        raise EnvironmentMissingError(f"cannot load the C library's memchr to measure memory bandwidth ({exc})",
                                      "run npuops on a Linux host with glibc or musl") from None
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return function


def _read_rate(memchr: ctypes._CFuncPtr, buffers: list[ctypes.Array[ctypes.c_char]],  # type: ignore[name-defined]
               buffer_bytes: int) -> float:
    """Bytes per second that len(buffers) threads read together, best of ROUNDS."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = threading.Barrier(len(buffers) + 1)

        def scan(buffer: ctypes.Array[ctypes.c_char], start: threading.Barrier = start) -> None:
            start.wait()
            for _ in range(SCANS_PER_ROUND):
                memchr(buffer, 1, buffer_bytes)

        threads = [threading.Thread(target=scan, args=(b,), daemon=True) for b in buffers]
        for thread in threads:
            thread.start()
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            thread.join()
        best = min(best, time.perf_counter() - began)
    return len(buffers) * SCANS_PER_ROUND * buffer_bytes / best


def measure_read_bandwidth(max_threads: int, buffer_bytes: int = BUFFER_BYTES) -> MeasuredBandwidth:
    """The host's memory read bandwidth: the best of 1..max_threads threads (see the module's docstring)."""
    memchr = _memchr()
    best = MeasuredBandwidth(0.0, 1, "")
    for threads in range(1, max(1, max_threads) + 1):
        # create_string_buffer writes its zeros: every page is resident before the clock starts.
        buffers = [ctypes.create_string_buffer(buffer_bytes) for _ in range(threads)]
        rate = _read_rate(memchr, buffers, buffer_bytes)
        del buffers
        if rate > best.bytes_per_s:
            best = MeasuredBandwidth(rate, threads, f"memchr, {threads} thread{'s' * (threads > 1)} of "
                                                    f"{buffer_bytes // 2**20} MiB, best of {ROUNDS}")
    return best
