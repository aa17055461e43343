"""KernelCh start/stop pairing for the drain (stamps/drain.py): the two records a channel program leaves become
one; and what is left of a program after a lap."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .layout import FLAG_CH_STOP, KIND_CHANNEL, member, take_rows


def pair_channels(out: np.ndarray, is_ch: np.ndarray, open_: dict, drop: Callable[[str, int], None]) -> np.ndarray:
    """KernelCh start/stop records -> one record (ready = start, done = stop) at the stop, in place; returns
    the rows to keep (the starts go).

    Vectorised: sorted by (channel, op, peer, direction, arrival), a stop right after its start pairs in
    place; only records whose partner is in another poll go through `open_` (the drain's, kept across polls:
    (channel, op, peer, direction) -> start clock; a few per poll)."""
    idx = np.flatnonzero(is_ch)
    sel = take_rows(out, idx)
    m = len(sel)
    stp = (sel["flags"] & FLAG_CH_STOP) != 0
    cols = (sel["channel"], sel["op"], sel["peer"], sel["flags"] & 1)
    order = np.lexsort((np.arange(m),) + cols[::-1])
    stp = stp[order]
    cols = tuple(c[order] for c in cols)
    same = np.zeros(m + 1, bool)               # same[j]: row j has the key of row j - 1
    same[1:m] = np.logical_and.reduce([c[1:] == c[:-1] for c in cols])
    ok = np.zeros(m, bool)
    ok[1:] = stp[1:] & ~stp[:-1] & same[1:m]   # a stop right after its own start
    used = np.zeros(m, bool)
    used[:-1] = ok[1:]
    ready = sel["ready"][order]
    start = np.zeros(m, np.uint64)
    start[1:] = ready[:-1]
    loose = np.flatnonzero(~ok & ~used)
    if len(loose):
        keys = np.column_stack(cols)[loose].tolist()
        for j, key, is_stop, nxt in zip(loose.tolist(), keys, stp[loose].tolist(), same[loose + 1].tolist()):
            key = tuple(key)
            if not is_stop:
                if nxt or key in open_:        # a start whose stop never came (it overran): counted, not kept
                    drop("unpaired", 1)
                if not nxt:                    # else a later start of the same key supersedes it
                    open_[key] = int(ready[j])
                continue
            st = open_.pop(key, None)
            if st is None:
                drop("unpaired", 1)
                continue
            ok[j], start[j] = True, st
    rows = idx[order[ok]]
    out["wait"][rows] = out["ready"][rows] = start[ok]
    keep = ~is_ch
    keep[rows] = True
    return keep


def after_lap(st: np.ndarray, chan, cut: np.ndarray, ch_ops: np.ndarray, uniq, open_: dict,
              drop: Callable[[str, int], None]) -> np.ndarray | None:
    """Rows (ring words, seq order per channel) to keep, None for all, on channels whose cursor jumped over lapped
    entries (cut[c], cleared once settled): a program whose KernelCh start was lapped must go whole, or its
    KernelSteps would lie in no KernelCh. Either writer's program begins with its start (cpu stamper: start,
    steps, stop; gpu writer: start, stop, steps), so a channel's rows before its next start go, counted as
    overrun, and so do its held starts (unpaired: their stops were lapped). Unless its first KernelCh row is the
    stop of a held start of an op in uniq (its programs' keys are unique per channel): the lap fell inside that
    program, which keeps its KernelCh and the rows up to it. (Where keys repeat, the stop may close a later program
    of that key, its start lapped with the held one's stop: pairing them made one KernelCh of two programs.)
    Rows of ops that stamp no KernelCh (not in ch_ops, the drain's expect) stay. chan: an array, or one int."""
    w5, n = st[:, 5], len(st)
    is_ch = ((w5 >> np.uint64(48)) & np.uint64(0xFF)) == KIND_CHANNEL
    stop = ((w5 >> np.uint64(56)) & np.uint64(FLAG_CH_STOP)) != 0
    chs = np.broadcast_to(np.asarray(chan, np.int64), (n,))
    keep = np.ones(n, bool)
    for c in np.unique(chs[cut[chs]]).tolist():
        pos = np.flatnonzero(chs == c)
        chp = pos[is_ch[pos]]
        if len(chp):
            j = int(chp[0])
            w, op = int(w5[j]), int(st[j, 4]) & 0xFFFFFFFF
            if stop[j] and op in uniq and (c, op, w >> 32 & 0xFFFF, w >> 56 & 1) in open_:
                cut[c] = False
                continue
            held = [k for k in open_ if k[0] == c]
            for k in held:
                del open_[k]
            if held:
                drop("unpaired", len(held))
        starts = chp[~stop[chp]]
        if len(starts):
            cut[c] = False
            pos = pos[pos < starts[0]]
        keep[pos[member(st[pos, 4] & np.uint64(0xFFFFFFFF), ch_ops)]] = False
    if keep.all():
        return None
    drop("overrun", int(n - keep.sum()))
    return keep
