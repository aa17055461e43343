"""Registered memory of the cpu backend (cpu_pool bytes at the end of a rank's segment, shm.py).

Comm.mem_alloc carves arrays from it, as ncclMemAlloc + ncclCommRegister give NCCL buffers its peers can reach.
Every peer maps the whole segment at set-up, so a ring op whose buffers lie here moves slices directly
(worker.py): the receiver reads the sender's input in place of a FIFO copy, and the sender writes the receiver's
output. Allocation is first fit over page-aligned blocks; the caller frees with Comm.mem_free.
A symmetric allocation (mem_alloc(..., symmetric=True), as ncclCommWindowRegister's NCCL_WIN_COLL_SYMMETRIC) is a
window: all_reduce, all_gather and reduce_scatter whose buffers are all windows run the symmetric kernels on every
rank (plan/symmetric.py, symmetric.py), which load from and store to every peer's window.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import UsageError
from ..base import host_pointer

ALIGN = 4096                # a page: any dtype view of a block starts aligned


class Pool:
    """First-fit allocator over one rank's registered bytes; offset() says where an array lies in them."""

    def __init__(self, mv: Any, size: int):
        self.size = size
        self.buf = np.frombuffer(mv, np.uint8) if size else None
        self.base = host_pointer(self.buf) if size else 0
        self.free: list[tuple[int, int]] = [(0, size)] if size else []     # (offset, bytes), by offset
        self.used: dict[int, int] = {}                                      # offset -> bytes reserved
        self.windows: dict[int, int] = {}                                   # symmetric ones: offset -> bytes

    def alloc(self, shape: Any, dtype: Any, symmetric: bool = False) -> np.ndarray:
        try:
            dt = np.dtype(dtype)
            shp = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        except (TypeError, ValueError) as e:
            raise UsageError(f"mem_alloc: shape={shape!r}, dtype={dtype!r}: {e}") from None
        if any(d < 0 for d in shp):
            raise UsageError(f"mem_alloc: shape={shape!r} has a negative dimension; dimensions must be >= 0")
        nbytes = math.prod(shp) * dt.itemsize
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        if self.size == 0:
            raise UsageError("mem_alloc needs registered memory: this communicator has cpu_pool=0; set "
                             "SLICETRACE_CPU_POOL (or cpu_pool=) to the bytes to reserve per rank, e.g. 256M")
        if nbytes == 0:
            return np.empty(shp, dt)        # nothing to share (mem_free takes it back as a no-op)
        for i, (off, size) in enumerate(self.free):
            if size >= need:
                self.free[i:i + 1] = [(off + need, size - need)] if size > need else []
                self.used[off] = need
                if symmetric:
                    self.windows[off] = nbytes
                return self.buf[off:off + nbytes].view(dt).reshape(shp)
        left = sum(s for _, s in self.free)
        big = max((s for _, s in self.free), default=0)
        raise UsageError(f"mem_alloc: {nbytes} bytes (shape {shp}, {dt}) do not fit in the registered pool of "
                         f"{self.size} bytes (cpu_pool): {left} bytes free, the largest free block {big}; raise "
                         f"SLICETRACE_CPU_POOL (cpu_pool=) or mem_free buffers no longer used")

    def release(self, arr: Any) -> None:
        if isinstance(arr, np.ndarray) and arr.size == 0:
            return
        off = self.offset(arr, 1) if isinstance(arr, np.ndarray) else -1
        if off not in self.used:
            raise UsageError(f"mem_free: {type(arr).__name__} is not an array returned by this communicator's "
                             f"mem_alloc (or it was freed already)")
        size = self.used.pop(off)
        self.windows.pop(off, None)
        free = sorted(self.free + [(off, size)])
        merged: list[tuple[int, int]] = []
        for o, s in free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged

    def offset(self, arr: Any, itemsize: int) -> int:
        """Byte offset of contiguous `arr` in this pool (a multiple of itemsize), else -1."""
        if not self.size or not arr.flags.c_contiguous:
            return -1
        off = host_pointer(arr) - self.base
        if 0 <= off and off + arr.nbytes <= self.size and off % itemsize == 0:
            return off
        return -1

    def window(self, arr: Any, itemsize: int) -> int:
        """Byte offset of contiguous `arr` in this pool when it lies inside one symmetric allocation, else -1."""
        off = self.offset(arr, itemsize)
        if off < 0 or not self.windows:
            return -1
        for o, n in self.windows.items():
            if o <= off and off + arr.nbytes <= o + n:
                return off
        return -1
