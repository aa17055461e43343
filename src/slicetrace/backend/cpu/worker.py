"""Executes plan primitives with numpy: ring channel programs and concurrent point-to-point groups.

Reference semantics of one slice of a primitive (plan.schedule.Prim), n = slice elements:

    recv:  wait tail >= rstep + ss ; r = recv FIFO slot (rstep % 8)
    send:  wait head + 8 >= sstep + ss ; s = next rank's FIFO slot (sstep % 8)
    data:  send r'=src ; recvReduceSend s = r + src ; recvReduceCopySend dst = r + src, s = dst ; ...
    post:  tail = sstep + ss (to the next rank), head = rstep + ss (credit back); steps += ss

Empty slices wait and post like the others (both sides keep their step counters in lockstep).
Stamp clocks: wait before waiting, ready after the wait, done before the tail is posted.
"""
from __future__ import annotations

import time

import numpy as np

from ...stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP
from ..base import DTYPES
from ...errors import PeerError
from .shm import ABORT_MISMATCH, C_CLOSED, H_HEAD, H_MSG, H_MSGACK, H_TAIL, NSIG
from .stamper import FastRingWriter, tail
from .transport import RECLAIM_MIN

UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "avg": np.add}
# primitive -> compute kind
K_SEND, K_COPYSEND, K_RECV, K_RCS, K_RRS, K_RRCS, K_RRC = range(7)
KINDS = {"send": K_SEND, "copySend": K_COPYSEND, "recv": K_RECV, "recvCopySend": K_RCS,
         "recvReduceSend": K_RRS, "recvReduceCopySend": K_RRCS, "recvReduceCopy": K_RRC}
NSTEPS = 8
_CH_START, _CH_STOP = tail(0, KIND_CHANNEL, 0), tail(0, KIND_CHANNEL, FLAG_CH_STOP)   # a ring program's KernelCh


def finish_avg(d: np.ndarray, nranks: int) -> None:
    """avg = sum / nranks. Floats divide; integers truncate toward zero (NCCL's SumPostDiv)."""
    if d.dtype.kind in "iu":
        if d.dtype.kind == "u":
            np.floor_divide(d, nranks, out=d)
        else:
            q = np.floor_divide(d, nranks)
            q += (d < 0) & (q * nranks != d)
            d[...] = q
    else:
        np.divide(d, d.dtype.type(nranks), out=d)


class RingJob:
    """Everything one ring channel program needs, bound once per work."""

    def __init__(self, work, rconn, sconn, writer: FastRingWriter | None, guard, delta: int | None):
        self.work, self.rconn, self.sconn, self.writer, self.guard = work, rconn, sconn, writer, guard
        self.delta = delta       # byte address of sendbuf minus recvbuf when they overlap (in place), else None


def run_ring(prog, job: RingJob) -> None:
    """One channel program; its records are staged (FastRingWriter.stage), also when a wait fails."""
    work, w = job.work, job.writer
    recs: list[int] = []        # wait, ready, done, op, step, w5 per record, in seq order (stamper.stage)
    chans = w is not None and work.stamp_channels
    op = work.tag & 0xFFFFFFFF
    if chans:
        t = time.monotonic_ns()
        recs += (t, t, t, op, 0, _CH_START)
    try:
        _ring_slices(prog, job, recs)
        if chans:
            t = time.monotonic_ns()
            recs += (t, t, t, op, 0, _CH_STOP)
    finally:
        if recs:
            w.stage(recs)


def _ring_slices(prog, job: RingJob, recs: list) -> None:
    work, plan = job.work, job.work.plan
    rconn, sconn, guard, w = job.rconn, job.sconn, job.guard, job.writer
    dt = work.recvbuf.dtype
    ss, spc = plan.proto.slice_steps, plan.proto.chunk_steps
    se = plan.proto.step_bytes // dt.itemsize
    rconn.round_step(spc)
    sconn.round_step(spc)
    rview, sview, rctl, sctl = rconn.view(dt), sconn.view(dt), rconn.ctl, sconn.ctl
    if rctl[H_HEAD] < rconn.step:        # credit for the steps the rounding skipped (NCCL's PostRecv does too)
        rconn.post(H_HEAD, rconn.step)
    rstep, sstep = rconn.step, sconn.step
    rwake, swake = rconn.wakes, sconn.wakes             # a neighbour that sleeps on a futex (transport.Conn.post)
    rbase, sbase = rconn.base, sconn.base
    pol, freed, pc = sconn.reclaim, rconn.freed, time.perf_counter_ns
    isz = dt.itemsize
    bufs = {"in": work.sendbuf, "out": work.recvbuf, None: None}
    red = UFUNCS[work.redop]
    avg = work.redop == "avg"
    nranks, ch, rpeer, speer = plan.nranks, prog.channel, rconn.peer, sconn.peer
    copyto, wait = np.copyto, guard.wait_ge
    op = work.tag & 0xFFFFFFFF
    stamp = w is not None and work.stamp_steps
    rate = max(1, work.sample_rate)
    clock = time.monotonic_ns
    rtail, stail = tail(rpeer, KIND_STEP, 0), tail(speer, KIND_STEP, FLAG_SEND)
    tw = tr = ts = t0 = td = 0
    last_n = nbr = nbs = 0
    k = 0
    for prim in prog.prims:
        kind = KINDS[prim.name]
        hr, hs = prim.recv_from is not None, prim.send_to is not None
        src, dst = bufs[prim.src], bufs[prim.dst]
        so, do = prim.src_off, prim.dst_off
        fin = avg and prim.final
        same = job.delta is not None and kind == K_COPYSEND and so * dt.itemsize + job.delta == do * dt.itemsize
        for off, n in prim.slices:
            if hr:
                t = rstep + ss
                if rctl[H_TAIL] >= t:                # data already there: ready = wait, read after seeing it
                    if stamp:
                        t0 = tr = clock()
                else:
                    if stamp:
                        t0 = clock()
                    wait(rctl, H_TAIL, t, rpeer, ("data", rpeer, ch, rstep), rbase)
                    if stamp:
                        tr = clock()                 # after the tail was seen: never before the sender's done
                if n:
                    i = (rstep & 7) * se
                    r = rview[i:i + n]
            if hs:
                if stamp:
                    tw = ts = tr if hr else clock()  # the send wait starts when the recv wait ended
                t = sstep + ss - NSTEPS
                if sctl[H_HEAD] < t:
                    wait(sctl, H_HEAD, t, speer, ("credit", speer, ch, sstep), sbase)
                    if stamp:
                        ts = clock()
                if n:
                    i = (sstep & 7) * se
                    s = sview[i:i + n]
            if n:
                t1 = t2 = 0      # around the write into the send FIFO (the reclaim decision times it)
                if kind == K_RRS:
                    a = so + off
                    t1 = pc()
                    red(r, src[a:a + n], out=s)
                    t2 = pc()
                elif kind == K_RRCS or kind == K_RRC:
                    a, b = so + off, do + off
                    d = dst[b:b + n]
                    red(src[a:a + n], r, out=d)
                    if fin:
                        finish_avg(d, nranks)
                    if hs:
                        t1 = pc()
                        copyto(s, d)
                        t2 = pc()
                elif kind == K_SEND:
                    a = so + off
                    t1 = pc()
                    copyto(s, src[a:a + n])
                    t2 = pc()
                elif kind == K_RCS:
                    b = do + off
                    t1 = pc()
                    copyto(s, r)
                    t2 = pc()
                    copyto(dst[b:b + n], r)
                elif kind == K_RECV:
                    b = do + off
                    copyto(dst[b:b + n], r)
                else:   # K_COPYSEND
                    a, b = so + off, do + off
                    t1 = pc()
                    copyto(s, src[a:a + n])
                    t2 = pc()
                    if not same:
                        copyto(dst[b:b + n], src[a:a + n])
                if hs and n * isz >= RECLAIM_MIN:
                    pol.wrote(sstep & 7, n * isz, t2 - t1)
                if hr:
                    freed(rstep & 7, n * isz)
            if stamp:
                td = clock()
            if hs:                                   # publish the slice
                if swake:
                    sconn.post(H_TAIL, sstep + ss)
                else:
                    sctl[H_TAIL] = sstep + ss
            if hr:                                   # return the credit
                if rwake:
                    rconn.post(H_HEAD, rstep + ss)
                else:
                    rctl[H_HEAD] = rstep + ss
            if stamp and n:
                if n != last_n:                        # word 5 changes with the slice size only
                    last_n, nbr, nbs = n, n * isz | rtail, n * isz | stail
                if k % rate:
                    w.sampled_out(hr + hs)
                elif hr and hs:
                    recs += (t0, tr, td, op, rstep, nbr, tw, ts, td, op, sstep, nbs)
                elif hr:
                    recs += (t0, tr, td, op, rstep, nbr)
                else:
                    recs += (tw, ts, td, op, sstep, nbs)
            if hs:
                sstep += ss
            if hr:
                rstep += ss
            k += 1
    rconn.step, sconn.step = rstep, sstep


# ---------------------------------------------------------------- point to point

class _Lane:
    """One connection's queue of parts (group order); only the head part moves."""

    __slots__ = ("conn", "queue", "prog", "buf", "i", "twait", "k", "writer", "first", "recs", "ktail", "ch_tails",
                 "empty", "held")

    def __init__(self, conn, queue):
        self.conn, self.queue = conn, queue
        self.prog = self.buf = self.writer = None
        self.i = self.twait = self.k = 0
        self.first = True
        self.empty = False              # a 0-element receive, done once the sender's header is there
        self.held = False               # a send whose header would lap one the receiver has not checked yet
        self.recs: list[int] = []       # the current part's records, staged when it ends (as run_ring's)
        f = FLAG_SEND if conn.is_send else 0
        self.ktail = tail(conn.peer, KIND_STEP, f)
        self.ch_tails = tail(conn.peer, KIND_CHANNEL, f), tail(conn.peer, KIND_CHANNEL, f | FLAG_CH_STOP)  # KernelCh


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
                        break
                elif ctl[H_TAIL] < step + 1:
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
                        ln.recs += (ln.twait, tr, td, op, step, n * ln.buf.itemsize | ln.ktail)
                    else:
                        ln.writer.sampled_out(1)
                    ln.twait = td
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
                    bo = guard.backoff(f"point-to-point progress with rank(s) {[ln.conn.peer for ln in active]}",
                                       tuple(ln.conn.peer for ln in active))
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
        base = H_MSG + (m % NSIG) * 4
        if conn.is_send:             # describe the message before any of its data is posted
            peer = guard.peers.get(conn.peer)
            if peer is not None and peer[0][C_CLOSED]:      # else a message that fits the FIFO would vanish
                raise PeerError(f"rank {guard.rank} sends message #{m} to rank {conn.peer}, which has closed its "
                                f"communicator: it would never be received")
            conn.ctl[base + 1], conn.ctl[base + 2] = pr["count"], dcode
            conn.ctl[base] = m + 1
        ln.prog, ln.buf, ln.i, ln.k, ln.first = prog, bufs[pr["part"]], 0, 0, True
        ln.empty = not conn.is_send and not prog.prims    # never wait here: the peer may wait for our next header
        ln.writer = writers[prog.channel]
        t = clock()
        ln.twait = t
        if stamp_ch:
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
    if conn.ctl[base] != m + 1 or conn.ctl[base + 1] != ln.prog.params["count"] or conn.ctl[base + 2] != dcode:
        _mismatch(guard, conn, m, ln.prog.params["count"], dcode)
    conn.ctl[H_MSGACK] = m + 1       # its slot may take a later header now


def _mismatch(guard, conn, m: int, count: int, dcode: int) -> None:
    base = H_MSG + (m % NSIG) * 4
    seq, pc, pd = conn.ctl[base], conn.ctl[base + 1], conn.ctl[base + 2]
    theirs = (f"message #{seq - 1} of {pc} x {DTYPES[pd] if pd < len(DTYPES) else pd}" if seq else "no message")
    raise guard.fail(ABORT_MISMATCH, f"point-to-point mismatch: rank {guard.rank} expects message #{m} of "
                     f"{count} x {DTYPES[dcode]} from rank {conn.peer}, rank {conn.peer} sends {theirs}")
