"""Point-to-point groups on the cpu backend: every part progresses round-robin in one thread, so an all_to_all
of any size cannot deadlock. Each connection is a lane; only its head part moves. A send describes its message in
a header slot before any data (count and dtype, checked by the receiver: MismatchError), and never laps a header
the receiver has not checked yet.

Stamp clocks as in worker.py, except the wait: lanes share the thread, so a lane's wait starts at the first poll
that found it blocked (else wait = ready), and time spent on other lanes is not charged to this lane's peer.
"""
from __future__ import annotations

import time

import numpy as np

from ...errors import plural
from ...stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP
from ..base import DTYPES
from .shm import ABORT_MISMATCH, ABORT_PEER, C_CLOSED, H_HEAD, H_MSG, H_MSGACK, H_TAIL, NSIG
from .stall import StallBackoff, lane_words
from .stamper import tail
from .transport import RECLAIM_MIN

NSTEPS = 8


class _Lane:
    """One connection's queue of parts (group order); only the head part moves."""

    __slots__ = ("conn", "queue", "prog", "buf", "i", "twait", "k", "writer", "first", "recs", "ktail", "ch_tails",
                 "empty", "held", "msg")

    def __init__(self, conn, queue):
        self.conn, self.queue = conn, queue
        self.prog = self.buf = self.writer = None
        self.i = self.twait = self.k = self.msg = 0
        self.first = True
        self.empty = False              # a 0-element receive, done once the sender's header is there
        self.held = False               # a send whose header would lap one the receiver has not checked yet
        self.recs: list[int] = []       # the current part's records, staged when it ends (as run_ring's)
        f = FLAG_SEND if conn.is_send else 0
        self.ktail = tail(conn.peer, KIND_STEP, f)
        self.ch_tails = tail(conn.peer, KIND_CHANNEL, f), tail(conn.peer, KIND_CHANNEL, f | FLAG_CH_STOP)  # KernelCh


class _Blocked:
    """What a stalled progress loop waits for, lane by lane; formatted only if the wait fails."""
    __slots__ = ("lanes", "dcode")

    def __init__(self, lanes: list, dcode: int):
        self.lanes, self.dcode = lanes, dcode

    def toward(self, peer: int) -> str:
        """What the stalled lanes on `peer` move, for a MismatchError (Backoff.check_order)."""
        out = []
        for ln in self.lanes:
            c = ln.conn
            if c.peer != peer:
                continue
            if ln.held:                     # its next header waits for the receiver to check ours
                out.append(f"a send to rank {peer}")
                continue
            total, dcode = self._message(ln)
            way = ("send", "to") if c.is_send else ("receive", "from")
            out.append(f"a {way[0]} of {total} x {DTYPES[dcode]} {way[1]} rank {peer}")
        return " and ".join(out)

    def _message(self, ln: _Lane) -> tuple[int, int]:
        """(count, dtype code) of the caller's message that the lane's current part (a held lane's next) cuts."""
        pr = (ln.queue[0] if ln.held else ln.prog).params
        return (pr["hdr"][2], pr["hdr"][1]) if pr["hdr"] else (pr["total"], self.dcode)

    def stall(self) -> list:
        """The lanes as stall.publish takes them."""
        return [lane_words(ln.conn.peer, ln.conn.is_send, ln.held, *self._message(ln)) for ln in self.lanes]

    def __str__(self) -> str:
        out = []
        for ln in self.lanes:
            c = ln.conn
            if ln.held:
                out.append(f"rank {c.peer} to check our message #{c.msg_seq - NSIG} (header slots full)")
            elif ln.prog is not None:
                kind = "credit" if c.is_send else "data"
                out.append(f"{kind} from rank {c.peer} on channel {ln.prog.channel} (step {c.step})")
        return "point-to-point progress: " + ("; ".join(out) or "nothing")


def self_copies(work) -> None:
    """Sends to self into their receives from self (paired and checked by the plan): NCCL's self copy."""
    for i, j in work.plan.self_pairs:
        sb, rb = work.parts[i][1], work.parts[j][1]
        if rb.size:
            np.copyto(rb, sb)


def run_p2p(work, send_conns, recv_conns, writers, guard) -> None:
    """All parts progress round-robin in this thread: an all_to_all of any size cannot deadlock."""
    plan = work.plan
    self_copies(work)
    bufs = {p.index: b for p, b in work.parts}
    order: dict[tuple[int, bool], list] = {}
    for prog in plan.programs:
        pr = prog.params
        order.setdefault((pr["peer"], pr["is_send"]), []).append(prog)
    lanes = [_Lane((send_conns if s else recv_conns)[peer], progs) for (peer, s), progs in order.items()]
    dcode = DTYPES.index(work.dtype)
    op = work.tag & 0xFFFFFFFF
    stamp_ch = work.stamp_channels
    stamp = work.stamp_steps
    rate = max(1, work.sample_rate)
    clock = time.monotonic_ns
    se = plan.proto.step_bytes // np.dtype(work.parts[0][1].dtype).itemsize if work.parts else 1
    try:
        _progress(lanes, bufs, writers, op, stamp_ch, stamp, rate, dcode, se, guard, clock)
    finally:
        for ln in lanes:                     # a failed group's parts still reach the trace
            if ln.recs:
                ln.writer.stage(ln.recs)
                ln.recs = []


def _progress(lanes, bufs, writers, op, stamp_ch, stamp, rate, dcode, se, guard, clock) -> None:
    active = []
    for ln in lanes:
        if _next_part(ln, bufs, writers, op, stamp_ch, dcode, guard, clock) or ln.held:
            active.append(ln)
    bo = None
    idle = 0
    while active:
        moved = False
        for ln in active:
            conn = ln.conn
            ctl = conn.ctl
            while True:
                if ln.held:                  # the receiver has checked enough headers: post the next one
                    if conn.msg_seq >= ctl[H_MSGACK] + NSIG:
                        break
                    ln.held, moved = False, True
                    if not _next_part(ln, bufs, writers, op, stamp_ch, dcode, guard, clock):
                        break
                    continue
                if ln.empty:                 # no data to wait for: its header says whether the sender agrees
                    if not _header_posted(conn):
                        break
                    _check_msg(ln, dcode, guard)
                    ln.empty, moved = False, True
                    _end_part(ln, op, stamp_ch, clock)
                    if not _next_part(ln, bufs, writers, op, stamp_ch, dcode, guard, clock):
                        break
                    continue
                step = conn.step
                if conn.is_send:
                    if ctl[H_HEAD] + NSTEPS < step + 1:
                        if stamp and not ln.twait:   # waiting from here: not while other lanes were served
                            ln.twait = clock()
                        break
                elif ctl[H_TAIL] < step + 1:
                    if stamp and not ln.twait:
                        ln.twait = clock()
                    if ln.first and _header_posted(conn):
                        _check_msg(ln, dcode, guard)    # a header of 0 elements would leave us waiting for data
                    break
                tr = clock() if stamp else 0
                prim = ln.prog.prims[ln.i]
                n = prim.nelem
                o, i = prim.src_off, (step & 7) * se
                v = conn.view(ln.buf.dtype)[i:i + n]
                if conn.is_send:
                    if n * ln.buf.itemsize >= RECLAIM_MIN:
                        t1 = time.perf_counter_ns()
                        np.copyto(v, ln.buf[o:o + n])
                        conn.reclaim.wrote(step & 7, n * ln.buf.itemsize, time.perf_counter_ns() - t1)
                    else:
                        np.copyto(v, ln.buf[o:o + n])
                else:
                    if ln.first:
                        _check_msg(ln, dcode, guard)
                    np.copyto(ln.buf[o:o + n], v)
                    conn.freed(step & 7, n * ln.buf.itemsize)
                td = clock() if stamp else 0
                conn.step = step + 1
                ctl[H_TAIL if conn.is_send else H_HEAD] = step + 1
                if stamp and n:
                    if ln.k % rate == 0:
                        ln.recs += (ln.twait or tr, tr, td, op, step, n * ln.buf.itemsize | ln.ktail)
                    else:
                        ln.writer.sampled_out(1)
                    ln.twait = 0
                ln.k += 1
                ln.i += 1
                moved = True
                if ln.i == len(ln.prog.prims):
                    _end_part(ln, op, stamp_ch, clock)
                    if not _next_part(ln, bufs, writers, op, stamp_ch, dcode, guard, clock):
                        break
        if moved:
            active = [ln for ln in active if ln.prog is not None or ln.held]
            bo, idle = None, 0
        else:
            idle += 1
            if idle > guard.spins // 8:
                if bo is None:
                    bo = StallBackoff(guard, _Blocked(list(active), dcode), tuple(ln.conn.peer for ln in active))
                bo.pause()


def _next_part(ln: _Lane, bufs, writers, op, stamp_ch, dcode, guard, clock) -> bool:
    """Make the next queued part current (KernelCh start, message header); False when the lane is done."""
    while ln.queue:
        conn = ln.conn
        if conn.is_send and conn.msg_seq >= conn.ctl[H_MSGACK] + NSIG:    # never wait here: the loop rechecks
            ln.prog, ln.held = None, True
            return False
        prog = ln.queue.pop(0)
        pr = prog.params
        m = conn.msg_seq
        conn.msg_seq = m + 1
        if conn.msg_left == 0:       # this piece starts one of the caller's messages (its pieces follow each other)
            conn.msg_left = pr["total"]
            conn.msgs += 1
        conn.msg_left = max(0, conn.msg_left - pr["count"])
        msg = conn.msgs - 1
        base = H_MSG + (m % NSIG) * 4
        if conn.is_send:             # describe the message before any of its data is posted
            conn.ctl[base + 1], conn.ctl[base + 2], conn.ctl[base + 3] = pr["hdr"] or (pr["count"], dcode, pr["total"])
            conn.ctl[base] = m + 1
            peer = guard.peers.get(conn.peer)      # after posting: a receiver closing now sees the header, or we it
            if peer is not None and peer[0][C_CLOSED] and conn.ctl[H_MSGACK] <= m:   # (an empty one it took: fine)
                raise guard.fail(ABORT_PEER, f"rank {guard.rank} sends message #{msg} to rank "
                                 f"{conn.peer}, which has closed its communicator: it would never be received")
        ln.prog, ln.buf, ln.i, ln.k, ln.first = prog, bufs[pr["part"]], 0, 0, True
        ln.msg = msg
        ln.empty = not conn.is_send and not prog.prims    # never wait here: the peer may wait for our next header
        ln.writer = writers[prog.channel]
        ln.twait = 0                 # not blocked yet (set when a poll finds no credit or no data)
        if stamp_ch:
            t = clock()
            ln.recs += (t, t, t, op, 0, ln.ch_tails[0])
        if prog.prims or ln.empty:
            return True
        _end_part(ln, op, stamp_ch, clock)
    ln.prog = None
    return False


def _end_part(ln: _Lane, op, stamp_ch, clock) -> None:
    if stamp_ch:
        t = clock()
        ln.recs += (t, t, t, op, 0, ln.ch_tails[1])
    if ln.recs:
        ln.writer.stage(ln.recs)
        ln.recs = []


def _header_posted(conn) -> bool:
    """The sender has described the receive lane's current message (its header slot holds that seq or later)."""
    return conn.ctl[H_MSG + (conn.msg_seq - 1) % NSIG * 4] >= conn.msg_seq


def _check_msg(ln: _Lane, dcode: int, guard) -> None:
    ln.first = False
    conn = ln.conn
    m = conn.msg_seq - 1
    base = H_MSG + (m % NSIG) * 4
    pr = ln.prog.params
    count, dcode, total = pr["hdr"] or (pr["count"], dcode, pr["total"])   # hdr: the caller's, in a mixed group
    if (conn.ctl[base] != m + 1 or conn.ctl[base + 1] != count or conn.ctl[base + 2] != dcode
            or conn.ctl[base + 3] != total):      # pieces alike, the messages they cut may still differ
        _mismatch(guard, conn, m, ln.msg, total, dcode)
    conn.ctl[H_MSGACK] = m + 1       # its slot may take a later header now


def _mismatch(guard, conn, m: int, msg: int, count: int, dcode: int) -> None:
    """m: the header (one per piece) that differs; msg: the caller's message number; count: elements of the whole
    receive."""
    base = H_MSG + (m % NSIG) * 4
    seq, pd, pt = conn.ctl[base], conn.ctl[base + 2], conn.ctl[base + 3]
    theirs = (f"a message of {pt} x {DTYPES[pd] if pd < len(DTYPES) else pd}" if seq else "no message")
    raise guard.fail(ABORT_MISMATCH, f"point-to-point mismatch: rank {guard.rank} expects message #{msg} of "
                     f"{count} x {DTYPES[dcode]} from rank {conn.peer}, rank {conn.peer} sends {theirs}")


def pending_messages(p2p_recv) -> list[str]:
    """The caller's messages whose headers a peer posted to this rank (p2p_recv: peer -> Conn) past the last one
    it received (shm.H_MSG slots; one header per piece). Called once C_CLOSED is set: a sender posts, then looks
    at C_CLOSED (above), so one of us sees the other (the stores and loads are many bytecodes apart)."""
    lost = []
    for p, conn in sorted(p2p_recv.items()):
        ctl, m, k, msgs, left, first = conn.ctl, conn.msg_seq, 0, 0, conn.msg_left, None
        while k < NSIG and ctl[H_MSG + (m + k) % NSIG * 4] == m + k + 1:
            w = H_MSG + (m + k) % NSIG * 4
            if left == 0:                   # a header that starts a message (pieces follow each other)
                left, msgs = ctl[w + 3], msgs + 1
                first = first if first is not None else ctl[w + 3]
            left = max(0, left - ctl[w + 1])
            k += 1
        if msgs:
            lost.append(f"{msgs}{'+' if k == NSIG else ''} from rank {p} (the first #{conn.msgs}: "
                        f"{plural(first, 'element')})")
    return lost
