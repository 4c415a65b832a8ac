"""The memory bandwidth of this host, measured: the roofline of the CPU engine's decode step.

A decode step streams the model's weights (and the batch's KV cache) from memory once, so the fastest step is
their bytes over the bandwidth the host's cores can read at. No file reports that figure (DMI gives each DIMM's
speed, to root only, and says nothing of how many channels the cores reach), so it is measured, as STREAM does,
on buffers larger than the last-level cache: libc's memchr scans a zeroed buffer for a byte that is not there (it reads
every byte, vectorized, and writes none), one thread per CPU this process may use (ctypes releases the GIL for
the call), best of a few rounds. The best over 1..N threads is kept: on a host whose cores already serve, one
thread may read faster than two.

The figure is measured once per host and kept with the node's calibration (npuops/plan/calibration.py); NPUs'
HBM bandwidth comes from the chip catalog instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from npuops.errors import EnvironmentMissingError

# Per thread: twice the last-level cache, at least 64 MiB. A sequential scan of twice the cache finds none of its
# start still cached when it comes round again (the cache holds the scan's last half), so every round reads memory;
# 2 x 32 MiB of L3 here measures the same as 256 MiB (32-34 GB/s) in a tenth of the time, which matters because a
# CPU plan measures it when nothing is kept yet.
MIN_BUFFER_BYTES = 64 * 2**20
MAX_BUFFER_BYTES = 1024 * 2**20
LAST_LEVEL_CACHE = "/sys/devices/system/cpu/cpu0/cache/index3/size"
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


def parse_cache_size(text: str) -> int | None:
    """sysfs's cache size ("32768K", "105M") in bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if match is None:
        return None
    return int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]


def buffer_bytes_for(cache_bytes: int | None) -> int:
    """The per-thread buffer for a last-level cache of `cache_bytes` (unknown: the largest)."""
    if cache_bytes is None:
        return MAX_BUFFER_BYTES // 4
    return min(MAX_BUFFER_BYTES, max(MIN_BUFFER_BYTES, 2 * cache_bytes))


def _last_level_cache_bytes() -> int | None:
    try:
        return parse_cache_size(Path(LAST_LEVEL_CACHE).read_text())
    except OSError:
        return None


# What the measurement may hold at once: a many-core host reaches its bandwidth with a few threads per memory
# controller, long before one buffer per core would fill its RAM.
MAX_TOTAL_BYTES = 4 * 2**30


def thread_counts(max_threads: int, buffer_bytes: int) -> list[int]:
    """The thread counts to try: 1, 2, 4, ... and max_threads itself, as many as MAX_TOTAL_BYTES of buffers allow."""
    most = max(1, min(max_threads, MAX_TOTAL_BYTES // buffer_bytes))
    counts = {1 << k for k in range(most.bit_length()) if 1 << k <= most} | {most}
    return sorted(counts)


def measure_read_bandwidth(max_threads: int, buffer_bytes: int | None = None) -> MeasuredBandwidth:
    """The host's memory read bandwidth: the best of 1..max_threads threads (see the module's docstring)."""
    if buffer_bytes is None:
        buffer_bytes = buffer_bytes_for(_last_level_cache_bytes())
    memchr = _memchr()
    best = MeasuredBandwidth(0.0, 1, "")
    for threads in thread_counts(max_threads, buffer_bytes):
        # create_string_buffer writes its zeros: every page is resident before the clock starts.
        buffers = [ctypes.create_string_buffer(buffer_bytes) for _ in range(threads)]
        rate = _read_rate(memchr, buffers, buffer_bytes)
        del buffers
        if rate > best.bytes_per_s:
            best = MeasuredBandwidth(rate, threads, f"memchr, {threads} thread{'s' * (threads > 1)} of "
                                                    f"{buffer_bytes // 2**20} MiB, best of {ROUNDS}")
    return best
