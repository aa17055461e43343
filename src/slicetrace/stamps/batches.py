"""A poll's ring rows as the drain's consumer takes them (stamps/drain.py): decoded into paired records, KernelCh
starts paired into their stops, on the host clock, and sorted into one run per op and kind."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .layout import FLAG_SEND, KIND_CHANNEL, PAIRED_DTYPE, decode_rows, take_rows
from .pairing import pair_channels
from .scratch import Scratch

_LO32 = np.uint64(0xFFFFFFFF)
_DROPPED = np.iinfo(np.int64).max        # sort key of rows the KernelCh pairing removed


def op_runs(chan, st: np.ndarray, co: np.ndarray, open_: dict, drop: Callable[[str, int], None], scratch: Scratch,
            offset_ns: int) -> tuple[np.ndarray, list[int]] | None:
    """The records of started/completed ring rows st/co and the index where each run starts; None when the
    pairing kept no row. chan: the channel of every row (array), or one int when all rows come from one channel;
    open_: the drain's held KernelCh starts (kept across polls); drop: the consumer's loss count."""
    w4, w5 = st[:, 4], st[:, 5]
    kind = (w5 >> np.uint64(48)) & np.uint64(0xFF)
    is_ch = kind == KIND_CHANNEL
    has_ch = bool(is_ch.any())
    # Rows that the run sort below copies are a temporary: built in a reused buffer (stamps.scratch).
    resort = has_ch or bool(((w4 ^ w4[0]) & _LO32).any()) or bool((kind[0] != kind).any())   # every row's op
    buf = scratch.rows("out", len(st), PAIRED_DTYPE) if resort else None
    out = decode_rows(st, co, chan, kind, np.empty(len(st), dtype=PAIRED_DTYPE) if buf is None else buf)
    keep = None                                   # rows left once KernelCh starts are paired into stops
    if has_ch:
        keep = pair_channels(out, is_ch, open_, drop)
        if not keep.any():
            return None
    out["flags"] &= np.uint8(FLAG_SEND)           # PAIRED_DTYPE: FLAG_SEND only (the pairing read FLAG_CH_STOP)
    off = np.int64(offset_ns)
    for f in ("wait", "ready", "done"):
        out[f + "_ns"] = out[f].view(np.int64) + off
    ops, kinds = out["op"], out["kind"]
    if not resort:                               # one op, one kind
        starts = [0]
    else:
        # One run per kind and op across channels (a plugin takes an op's steps in one call, not one per
        # channel), KernelCh last (one may complete its op); stable: each channel's seq order. Rows the
        # pairing dropped sort last and are cut off.
        key = (kinds.astype(np.int64) << 32) | ops.astype(np.int64)
        if keep is not None:
            key[~keep] = _DROPPED
        o = np.argsort(key, kind="stable")[:None if keep is None else int(keep.sum())]
        out, key = take_rows(out, o), key[o]
        starts = [0] + (np.flatnonzero(key[1:] != key[:-1]) + 1).tolist()
    return out, starts
