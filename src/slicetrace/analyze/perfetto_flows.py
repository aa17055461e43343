"""`slicetrace convert`'s send -> receive flows: which receive took each KernelStep send's data, the flow id both
ends carry, and the instant in each slice that the arrow starts or ends at. A file here is analyze/perfetto.py's
_File: per slice t0, t1 (ns) and per KernelStep a `keys` row (slice, parent kind, is send, src, dst, channel, step,
ready - wait ns)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .perfetto_tracks import uuid64

KINDS = (None, "COLL", "P2P", "SYM")   # a KernelStep's parent kind (perfetto._kind), as a code; SYM: no flows


def mark_ns(f: Any) -> np.ndarray:
    """Each slice's flow instant (ns): a send's done (its end), a receive's ready (its wait + the clocks' ready -
    wait, kept within the slice)."""
    m = f.t1.copy()
    rcv = f.keys[f.keys[:, 2] == 0]
    si = rcv[:, 0]
    m[si] = f.t0[si] + np.clip(rcv[:, 7], 0, f.t1[si] - f.t0[si])
    return m


def pair_flows(files: list[Any], at_ns: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, int], int, int]:
    """Per file the flow id of each slice (0: none) for both ends of each send whose receive is in the files and
    ended no earlier than the send was done, how many flows of each communicator, how many sends got none, and how
    many receives ended before their send was done (clocks that disagree; Perfetto drops a terminating flow id met
    before its start, so those are left out). A receive ready a little before its send was done has its instant
    moved there (at_ns). What a send and its receive share (the key): the communicator, the connection (ring and
    point-to-point ones count their steps apart, hence the parent kind; a connection sits on one channel at both
    ends, plan.schedule.p2p_channel) and the FIFO step. Paired in numpy: one lexsort by key, receives before sends,
    each by time. A key seen n times on both sides (connections told apart by no parent, or a connection's step
    counter reused) pairs its i-th send with its i-th receive by time: one communicator's ops run one after the
    other on each rank. A key with more sends than receives (or fewer) pairs nothing: which is which is not known."""
    comms = sorted({f.comm for f in files})

    def columns(fi: int, f: Any) -> np.ndarray:
        si = f.keys[:, 0]
        return np.column_stack([np.full(len(si), comms.index(f.comm)), f.keys[:, 1:7], f.t0[si], np.full(len(si), fi),
                                si, at_ns[fi][si], f.t1[si]])
    cols = np.concatenate([columns(fi, f) for fi, f in enumerate(files)])
    cols = cols[cols[:, 1] != KINDS.index("SYM")]       # symmetric kernels: loads and stores, no send's receive
    # columns: comm, kind, snd, src, dst, ch, step, t0, file, slice, instant, t1
    fids = [np.zeros(len(f.t0), np.uint64) for f in files]
    if not len(cols):
        return fids, dict.fromkeys(comms, 0), 0, 0
    # by key, receives before sends, each by (begin, file, slice): a group's i-th receive pairs its i-th send
    order = np.lexsort((cols[:, 9], cols[:, 8], cols[:, 7], cols[:, 2], cols[:, 6], cols[:, 5], cols[:, 4],
                        cols[:, 3], cols[:, 1], cols[:, 0]))
    c = cols[order]
    del cols, order
    new = np.zeros(len(c) - 1, bool)
    for j in (0, 1, 3, 4, 5, 6):            # the key's columns
        new |= c[1:, j] != c[:-1, j]
    start = np.flatnonzero(np.r_[True, new])
    size = np.diff(np.r_[start, len(c)])
    sends = np.add.reduceat(c[:, 2], start)
    ok = sends * 2 == size
    unpaired = int(sends[~ok].sum())
    n = sends[ok]
    nth = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)           # a pair's index in its group
    rcv, snd = c[np.repeat(start[ok], n) + nth], c[np.repeat(start[ok] + n, n) + nth]
    del c
    back = rcv[:, 11] < snd[:, 10]         # the receive ended before its send was done: no instant in it follows
    late = (rcv[:, 10] < snd[:, 10]) & ~back
    for fi in range(len(files)) if late.any() else ():     # ready a little early (two GPUs' clocks a few ns
        m = late & (rcv[:, 8] == fi)                        # apart): drawn from the send's done, inside the receive
        at_ns[fi][rcv[m, 9]] = snd[m, 10]
    if back.any():
        rcv, snd, nth = rcv[~back], snd[~back], nth[~back]
    ids = np.zeros(len(snd), np.uint64)
    for a in range(0, len(snd), 1 << 15):   # a chunk of Python ints at a time
        ids[a:a + (1 << 15)] = [uuid64("flow", comms[s[0]], KINDS[s[1]], *s[3:7], i) for s, i in
                                zip(snd[a:a + (1 << 15), :7].tolist(), nth[a:a + (1 << 15)].tolist())]
    for end in (snd, rcv):
        for fi in range(len(files)):
            at = end[:, 8] == fi
            fids[fi][end[at, 9]] = ids[at]
    per_comm = np.bincount(snd[:, 0], minlength=len(comms)).tolist()
    return fids, dict(zip(comms, per_comm)), unpaired, int(back.sum())


def mark_kind(f: Any, fid: np.ndarray) -> np.ndarray:
    """Each slice's flow instant: 0 none, 1 a send's (the flow's start), 2 a receive's (its end)."""
    snd = np.zeros(len(f.t0), bool)
    snd[f.keys[:, 0]] = f.keys[:, 2] == 1
    return np.where(fid != 0, np.where(snd, 1, 2), 0).astype(np.int8)
