"""A small always-on plugin: per-link bytes and time, no trace file (the "metrics" built-in).

Keeps, per (channel, direction, peer): slices, bytes, time spent waiting (ready - wait) and moving data
(done - ready). Cheap enough to leave on; `snapshot()` returns the table, `finalize` logs a summary. It is
also the reference for writing a plugin: native version 8, batch path for KernelSteps, nothing else recorded.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..config import Settings
from ..events.abi import ActivationMask, CommInfo, EventType

log = logging.getLogger("slicetrace")


class _Ctx:
    def __init__(self, comm: CommInfo):
        self.comm = comm
        self.table: dict[tuple[int, int, int], np.ndarray] = {}   # key -> [slices, bytes, wait_ns, xfer_ns]


class LinkStatsPlugin:
    name = "linkstats"
    version = 8

    def __init__(self, settings: Settings | None = None):
        self.settings = settings

    def init(self, comm: CommInfo, mask: ActivationMask) -> _Ctx:
        mask.value = int(EventType.KERNEL_STEP)          # parents (Coll/P2p) are added by the host
        return _Ctx(comm)

    def start_event(self, ctx: _Ctx, descr: Any) -> Any:
        return ctx                                       # a handle for parents; nothing is recorded

    def stop_event(self, handle: Any, ts_ns: int) -> None:
        pass

    def record_event_state(self, handle: Any, state: Any, args: Any) -> None:
        pass

    def kernel_step_batch(self, ctx: _Ctx, parent: Any, recs: np.ndarray) -> int:
        key = (recs["channel"].astype(np.int64) * 1_000_000 + recs["is_send"].astype(np.int64) * 100_000
               + recs["peer"].astype(np.int64))
        wait = (recs["ready_ns"] - recs["wait_ns"]).astype(np.int64)
        xfer = (recs["done_ns"] - recs["ready_ns"]).astype(np.int64)
        for k in np.unique(key).tolist():
            m = key == k
            row = ctx.table.setdefault((k // 1_000_000, (k // 100_000) % 10, k % 100_000), np.zeros(4, np.int64))
            row += (int(m.sum()), int(recs["size"][m].sum()), int(wait[m].sum()), int(xfer[m].sum()))
        return len(recs)

    def snapshot(self, ctx: _Ctx) -> list[dict]:
        return [{"channel": c, "is_send": bool(s), "peer": p, "slices": int(v[0]), "bytes": int(v[1]),
                 "wait_us": v[2] / 1e3, "transfer_us": v[3] / 1e3,
                 "gbps": float(v[1] / v[3]) if v[3] else float("nan")}
                for (c, s, p), v in sorted(ctx.table.items())]

    def finalize(self, ctx: _Ctx) -> None:
        for row in self.snapshot(ctx):
            log.info("slicetrace linkstats rank %d: %s", ctx.comm.rank, row)
