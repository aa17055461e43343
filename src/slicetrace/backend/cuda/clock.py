"""GPU %globaltimer -> host CLOCK_MONOTONIC offset, measured by a probe kernel.

The host writes a round number into mapped memory; the kernel, already spinning, reads %globaltimer
and acknowledges. The read happened between the host's two monotonic_ns() calls around that round,
so offset = midpoint - timer with uncertainty = half the bracket (+ one 32 ns timer tick).
"""
from __future__ import annotations

import ctypes
import time

TICK_NS = 32


def launch(fn: int, grid: int, block: int, stream: int, *args: ctypes._SimpleCData) -> None:
    from cupy.cuda import driver
    ptrs = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    driver.launchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, ctypes.addressof(ptrs), 0)


def measure(fn: int, probe, probe_ptr: int, stream: int, rounds: int = 24,
            timeout_s: float = 2.0) -> tuple[int, int] | None:
    """(offset_ns, uncertainty_ns), or None when the probe did not run in time (device busy)."""
    probe[:4] = 0
    launch(fn, 1, 32, stream, ctypes.c_uint64(probe_ptr), ctypes.c_int(rounds),
           ctypes.c_uint64(int(timeout_s * 1e9)))
    deadline = time.monotonic() + timeout_s
    while probe[3] != 1:
        if time.monotonic() > deadline:
            return None
    best = None
    for r in range(1, rounds + 1):
        t0 = time.monotonic_ns()
        probe[0] = r
        while probe[1] < r:
            if time.monotonic() > deadline:
                probe[0] = rounds
                return best_of(best)
        t1 = time.monotonic_ns()
        g = int(probe[2])
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, (t0 + t1) // 2 - g)
    return best_of(best)


def best_of(best: tuple[int, int] | None) -> tuple[int, int] | None:
    if best is None:
        return None
    bracket, offset = best
    return offset, bracket // 2 + TICK_NS
