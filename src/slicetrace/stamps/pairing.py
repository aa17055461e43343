"""KernelCh start/stop pairing for the drain (stamps/drain.py): the two records a channel program leaves become one."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .layout import FLAG_CH_STOP, take_rows


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
