"""Host side of the GPU writer rules (stamps/layout.py): each program's range of stamp seqs, reserved at submit,
and the windows of the device ring to copy to the host once ops completed.

The kernel writes exactly `plan.traffic.stamp_records` records per program (KernelCh start and stop, then its
KernelSteps in slice order) at seq_base.. of its channel's ring and never past seq_n; `header.reserved` (and
`sampled_out`) move here, before the launch, so the drain's lap check holds without any store from the device.
"""
from __future__ import annotations

import numpy as np

from ...plan.traffic import stamp_records
from ...stamps.layout import STAMP_DTYPE, RingViews
from ..base import Work
from .layout import ARGS_DTYPE

Window = tuple[int, int, int, int]     # copy_windows: (c0, c1, col, n); copy_regions: (offset, pitch, width, height)
_SEQ_BASE = ARGS_DTYPE.fields["seq_base"][1] // 4   # u32 offsets of Args.seq_base and Args.seq_n
_SEQ_N = ARGS_DTYPE.fields["seq_n"][1] // 4


class SeqRanges:
    def __init__(self, rings: RingViews):
        self.slots = rings.slots
        self._hdr = rings.header.view(np.uint64).reshape(-1, 8)
        self._res = self._hdr[:, 0]                                  # header.reserved: last reserved seq per channel
        self._plans: dict[tuple, tuple] = {}

    def reserve(self, work: Work, rec: np.ndarray) -> None:
        """Fill rec's (ARGS_DTYPE, one record) seq_base/seq_n for every program of work, in the kernel's order."""
        _, uch, inv, tot, first, n, skipped = self._plan(work)
        u32, m = rec.view(np.uint32), len(n)
        if m == 0:                                          # nothing runs on a channel (count 0, self only)
            return
        if len(uch) == m and uch[-1] == m - 1:             # one program per channel 0..m-1 (rings): views only
            seq = self._res[:m]
            u32[_SEQ_BASE:_SEQ_BASE + m] = seq + first     # low 32 bits, as the kernel keeps them
            seq += tot
        else:
            base = self._res[uch]
            u32[_SEQ_BASE:_SEQ_BASE + m] = base[inv] + first
            self._res[uch] = base + tot
        u32[_SEQ_N:_SEQ_N + m] = n
        if skipped:
            self._hdr[uch[0], 1] += np.uint64(skipped)

    def _plan(self, work: Work) -> tuple:
        """Per plan and stamping mode: channels, records per program and where each starts in its channel."""
        plan = work.plan
        key = (id(plan), work.stamp_steps, work.stamp_channels, work.sample_rate)
        sp = self._plans.get(key)
        if sp is not None and sp[0] is plan:
            return sp
        progs = plan.programs if plan.func != "send_recv" else \
            sorted(plan.programs, key=lambda q: (q.channel, q.params["part"]))     # kernel order (_p2p_args)
        counts = [stamp_records(q, max(1, int(work.sample_rate)), work.stamp_steps, work.stamp_channels)
                  for q in progs]
        chan = np.array([q.channel for q in progs], dtype=np.int64)
        n = np.array([c for c, _ in counts], dtype=np.int64)
        uch, inv = np.unique(chan, return_inverse=True)
        tot = np.bincount(inv, weights=n, minlength=len(uch)).astype(np.int64)
        before = np.cumsum(n) - n                            # records of earlier programs, same channel
        before -= (np.cumsum(tot) - tot)[inv]
        # One op lapping its own ring: one program's warp writes in seq order, so its newest records survive as
        # after any overrun; several programs of a channel would write the same slots in no order (torn
        # records), so they write nothing and the drain counts the whole range lost.
        crowded = (tot > self.slots) & (np.bincount(inv, minlength=len(uch)) > 1)
        n = np.where(crowded[inv], 0, n)
        if len(self._plans) > 256:
            self._plans.clear()
        sp = (plan, uch, inv, tot.astype(np.uint64), (before + 1).astype(np.uint64), n.astype(np.uint32),
              sum(s for _, s in counts))
        self._plans[key] = sp
        return sp


def copy_windows(lo: np.ndarray, hi: np.ndarray, slots: int) -> list[Window]:
    """Ring windows that hold seqs lo[c]+1 .. hi[c] of every channel c (one lap at most): (c0, c1, col, n) =
    rows c0..c1-1, slots col..col+n-1. Channels that moved alike (a collective) share one window over their
    span; channels that drifted apart get one each. Copying slots outside a channel's range is harmless: a slot
    of an op still running is re-copied once that op completed, and the drain trusts nothing before that."""
    act = np.flatnonzero(hi > lo)
    if not len(act):
        return []
    last = hi[act].astype(np.int64)
    first = np.maximum(lo[act].astype(np.int64) + 1, last - slots + 1)
    f, l = int(first.min()), int(last.max())
    if l - f < slots:
        spans = [(int(act[0]), int(act[-1]) + 1, f, l)]
    else:
        spans = [(c, c + 1, a, b) for c, a, b in zip(act.tolist(), first.tolist(), last.tolist())]
    out = []
    for c0, c1, a, b in spans:
        col, n = a % slots, b - a + 1
        while n > 0:
            k = min(n, slots - col)
            out.append((c0, c1, col, k))
            n -= k
            col = 0
    return out


def copy_regions(windows: list[Window], slots: int) -> list[Window]:
    """2-D copies (offset, pitch, width, height), in bytes from the first row of the (merged) ring, that move
    the windows: one per window, a row per channel in it."""
    e = STAMP_DTYPE.itemsize
    p = slots * e
    return [(c0 * p + col * e, p, n * e, c1 - c0) for c0, c1, col, n in windows]
