"""The kernel's argument record (layout.ARGS_DTYPE) for one work: the collective or send/recv group fields.

Mixed into CudaBackend (backend.py), whose comm memory, settings, channel limit and launch bounds these read.
"""
from __future__ import annotations

import ctypes
from collections import Counter
from typing import Any

import numpy as np

from ...errors import UsageError
from ..base import Work
from . import buffers
from .layout import ARGS_DTYPE, CTYPES, FUNC_IDS, ITEMSIZE, MAX_THREADS, MAXB, MAXG, MAXP, REDOP_IDS


def threads_for(nbytes: int, nblocks: int, nthreads: int, max_threads: int = MAX_THREADS) -> int:
    """NCCL: halve the threads while the op is small for them, then add the post warp."""
    nt = min(nthreads, max_threads - 32)
    while nbytes < nblocks * nt * 64 and nt > 64:
        nt = max(64, nt // 2 // 32 * 32)       # whole warps
    return nt + 32


def auto_channels(nbytes: int, max_channels: int) -> int:
    """NCCL's rule: fewer channels while each would carry less than 32 KiB (64 B x 512 threads)."""
    return max(1, min(max_channels, nbytes // (512 * 64)))


class KernelArgs:
    """Expects the backend's rank, mem (CommMemory), settings, max_channels, kernels, _cache, _fns, _extra and
    _maxt(). Also picks the kernel function of a work (measurement variants: extra_defines)."""
    mem: Any
    settings: Any
    max_channels: int

    @property
    def extra_defines(self) -> dict[str, str]:
        return self._extra

    @extra_defines.setter
    def extra_defines(self, defs: dict[str, str]) -> None:
        self._extra = dict(defs)
        self._cache.clear()             # cached launches hold the kernel built with the old defines
        self._fns.clear()

    def _fn(self, dtype: str, steps: bool) -> int:
        fn = self._fns.get((dtype, steps))      # per profiled op: the defines' key costs several us to build
        if fn is None:
            fn = self._fns[(dtype, steps)] = self.kernels.function("slicetrace.cu", "st_kernel",
                                                                   self._defines(dtype, steps),
                                                                   self.settings.assert_warm)
        return fn

    def _defines(self, dtype: str, steps: bool) -> dict[str, str]:
        return {"ST_T": CTYPES[dtype], "ST_STEPS": "1" if steps else "0", **self._extra}

    def _record(self, work: Work) -> tuple[Any, np.ndarray, Any, int, int]:
        """The launch of `work`: (args record, kernel params, function, blocks, threads), cached per plan,
        dtype, reduction and buffers (a hit costs a dict lookup)."""
        plan = work.plan
        if plan.func == "send_recv":
            ptrs: dict[int, int] = {}         # pieces of a split buffer share it: one pointer lookup each
            for _, b in work.parts:
                if id(b) not in ptrs:
                    ptrs[id(b)] = buffers.pointer(b)
            key = (id(plan), work.dtype, tuple(ptrs[id(b)] for _, b in work.parts))
        else:
            key = (id(plan), work.dtype, work.redop, self._ptr(work.sendbuf), self._ptr(work.recvbuf))
        hit = self._cache.get(key)
        if hit is not None and hit[0] is plan:
            return hit[1:]
        rec = np.zeros(1, dtype=ARGS_DTYPE)
        nb, nt = (self._p2p_args if plan.func == "send_recv" else self._coll_args)(work, rec[0])
        params = (ctypes.c_void_p * 1)(rec.ctypes.data)
        if len(self._cache) > 256:
            self._cache.clear()
        val = (plan, rec, params, self._fn(work.dtype, False), nb, nt)
        self._cache[key] = val
        return val[1:]

    @staticmethod
    def _ptr(b: Any) -> int:
        return 0 if b is None else buffers.pointer(b)

    def _common(self, work: Work, a: Any, nblocks: int) -> None:
        plan = work.plan
        if plan.itemsize != ITEMSIZE[work.dtype]:
            raise UsageError(f"plan itemsize {plan.itemsize} does not match dtype {work.dtype}")
        if nblocks > MAXB:
            raise UsageError(f"the plan has {nblocks} channels; the cuda backend runs at most {MAXB}")
        a["comm"] = self.mem.comm_ptr
        a["func"], a["nranks"], a["rank"], a["root"] = FUNC_IDS[plan.func], plan.nranks, plan.rank, plan.root
        a["redop"] = REDOP_IDS.get(work.redop, 0)
        a["nblocks"] = nblocks
        a["step_bytes"] = plan.proto.step_bytes
        a["slice_steps"], a["chunk_steps"] = plan.proto.slice_steps, plan.proto.chunk_steps
        if plan.proto.step_bytes * 8 != self.settings.buffsize:
            raise UsageError(f"plan step_bytes={plan.proto.step_bytes} does not match buffsize="
                             f"{self.settings.buffsize} / 8 of this backend's FIFOs")

    def _coll_args(self, work: Work, a: Any) -> tuple[int, int]:
        plan = work.plan
        progs = plan.programs
        per = progs[0].params["count"] if len(progs) > 1 else plan.count
        for i, p in enumerate(progs):
            if p.channel != i or p.params["lo"] != i * per or p.channel >= self.max_channels:
                raise UsageError(f"program {i} of the {plan.func} plan is not the contiguous channel split the "
                                 f"cuda kernel rebuilds (channel {p.channel}, lo {p.params['lo']})")
        if work.redop not in REDOP_IDS:
            raise UsageError(f"redop={work.redop!r} is not one of {tuple(REDOP_IDS)}")
        self._common(work, a, len(progs))
        a["sendbuf"], a["recvbuf"] = self._ptr(work.sendbuf), self._ptr(work.recvbuf)
        a["count"], a["per_ch"], a["chunk_elems"] = plan.count, per, progs[0].params["chunk_elems"]
        return len(progs), threads_for(plan.count * plan.itemsize, len(progs), self.settings.nthreads, self._maxt())

    def _p2p_args(self, work: Work, a: Any) -> tuple[int, int]:
        plan = work.plan
        bufs = {p.index: b for p, b in work.parts}
        offs = {p.index: p.offset for p, _ in work.parts}
        progs = sorted(plan.programs, key=lambda q: (q.channel, q.params["part"]))
        if len(progs) > MAXP:
            raise UsageError(f"a send/recv group of {len(progs)} programs; the cuda backend runs at most {MAXP} in one "
                             f"launch (a message from 1 MiB up is cut into pieces, one program each: send fewer large "
                             f"messages per peer in one group)")
        chans = sorted({q.channel for q in progs})
        per_peer = Counter((q.params["peer"], q.params["is_send"]) for q in progs)
        most = max(per_peer.values(), default=0)
        if most > self.max_channels:              # connections are numbered mod max_channels: two would share one
            raise UsageError(f"send/recv group: {most} parts to one peer in one direction; at most "
                             f"{self.max_channels} (nchannels)")
        self._common(work, a, len(chans))
        for i, q in enumerate(progs):
            k = q.params["conn"]                   # the plan's connection number; its channel follows from it
            if k >= self.max_channels or q.channel >= self.max_channels:
                raise UsageError(f"send/recv group: connection {k} or channel {q.channel}; at most "
                                 f"{self.max_channels} (nchannels)")
            d = a["parts"][i]
            d["ptr"] = buffers.pointer(bufs[q.params["part"]]) + offs[q.params["part"]] * plan.itemsize
            d["count"], d["peer"], d["conn"] = q.params["count"], q.params["peer"], self.max_channels + k   # P2P_CONN
            d["is_send"], d["channel"] = int(q.params["is_send"]), q.channel
        for b, ch in enumerate(chans):
            idx = [i for i, q in enumerate(progs) if q.channel == ch]
            if len(idx) > MAXG:
                raise UsageError(f"channel {ch} has {len(idx)} send/recv programs; at most {MAXG} per channel "
                                 f"(use more channels)")
            a["blk_first"][b], a["blk_n"][b] = idx[0], len(idx)
        a["nparts"] = len(progs)
        a["chunk_elems"] = progs[0].params["chunk_elems"] if progs else 1
        return len(chans), self._maxt()
