"""Symmetric-memory plans: NCCL's symmetric kernels (2.27+, buffers in ncclCommWindowRegister windows).

Every rank reaches every peer's window, so no FIFO and no ring: all_reduce is RSxLD_AGxST (rank r loads its part
of each channel's range from every rank's input, reduces it, and stores the result into every rank's output),
reduce_scatter is the first half (RSxLD: the result goes to r's own output), all_gather the second (AGxST: r's input
is stored into every output). One program per channel; its part is cut in cells of `cell_bytes`, and each cell is
one KernelStep per peer and direction (a load from the peer: received; a store to it: sent). Two waits per op,
both across all ranks: every rank has entered (its buffers may be read and written), every rank has stored.
"""
from __future__ import annotations

from .cache import plans_cache
from .schedule import ALIGN_BYTES, ChannelProgram, OpPlan, align_up, div_up, proto_for, split_channels

SYM_FUNCS = ("all_reduce", "all_gather", "reduce_scatter")
SYM_MIN = 64 << 10          # cpu, 2 ranks: smaller ops keep the ring (backend.symmetric)
# NCCL's symmetric kernel names (ncclSymkKernelId), as the v7 Coll descriptor's kernelVariant carries them
VARIANTS = {"all_reduce": "AllReduce_RSxLD_AGxST", "all_gather": "AllGather_ST", "reduce_scatter": "ReduceScatter_LD"}


@plans_cache(lambda func, nranks, rank, count, itemsize, *rest: count * itemsize)
def plan_symmetric(func: str, nranks: int, rank: int, count: int, itemsize: int, nchannels: int,
                   step_bytes: int) -> OpPlan:
    """Programs of kind 'sym', params: src / dst (the part's first element in every rank's input / output), n (its
    elements), load (reduce from every rank's input) and store (into every rank's output), cells ((offset, n)
    within the part). Cells are two FIFO steps (a Simple slice, 1 MiB by default): big enough that a numpy call's
    fixed cost is small, small enough that the sum stays in cache while it is stored."""
    if func not in SYM_FUNCS:
        raise ValueError(f"func={func!r}: symmetric kernels exist for {SYM_FUNCS}")
    proto = proto_for(func, step_bytes)
    cell = max(1, step_bytes * 2 // itemsize)
    align = max(1, ALIGN_BYTES // itemsize)
    programs = []
    traffic = nranks if func in ("all_gather", "reduce_scatter") else 1
    for ch, (lo, cnt) in enumerate(split_channels(count, itemsize, nchannels, traffic)):
        if func == "all_reduce":
            per = align_up(div_up(cnt, nranks), align)
            a = min(cnt, rank * per)
            src = dst = lo + a
            n = min(cnt - a, per)
        elif func == "reduce_scatter":
            src, dst, n = rank * count + lo, lo, cnt
        else:
            src, dst, n = lo, rank * count + lo, cnt
        cells = tuple((o, min(cell, n - o)) for o in range(0, n, cell))
        programs.append(ChannelProgram(ch, "sym", (), {"src": src, "dst": dst, "n": n, "cells": cells,
                                                       "load": func != "all_gather",
                                                       "store": func != "reduce_scatter"}))
    return OpPlan(func, nranks, rank, count, itemsize, 0, proto, tuple(programs), algo=VARIANTS[func])
