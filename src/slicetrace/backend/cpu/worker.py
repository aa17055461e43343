"""Executes plan primitives with numpy: ring channel programs and concurrent point-to-point groups.

Reference semantics of one slice of a primitive (plan.schedule.Prim), n = slice elements:

    recv:  wait tail >= rstep + ss ; r = recv FIFO slot (rstep % 8)
    send:  wait head + 8 >= sstep + ss ; s = next rank's FIFO slot (sstep % 8)
    data:  send r'=src ; recvReduceSend s = r + src ; recvReduceCopySend dst = r + src, s = dst ; ...
    post:  tail = sstep + ss (to the next rank), head = rstep + ss (credit back); steps += ss

Empty slices wait and post like the others (both sides keep their step counters in lockstep).
Direct slices (registered memory, pool.py): a sender whose input lies in its pool posts, for a `send` slice, where
it lies (H_PTRS) and copies nothing: the receiver reads it from there. A sender whose receiver's output lies in the
receiver's pool writes a slice bound for that output (recvCopySend, recv) there at once: the receiver only
forwards it. NCCL's direct read and direct write, on the same steps, credits and stamps.
Stamp clocks: wait before waiting, ready after the wait, done before the tail is posted; a program stages its
clocks alone (stamper.stage_ring), the records they make are its layout's (ring_layout()). Point-to-point groups:
p2p.py.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ...errors import BackendError
from ...plan.traffic import sampled_slices
from ...stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP
from .shm import H_DSTOFF, H_DSTSEQ, H_HEAD, H_PTRS, H_TAIL
from .stamper import FastRingWriter, RingLayout, tail
from .transport import RECLAIM_MIN

# IEEE overflow to inf (float16 sums) is the data's, as on NCCL: no numpy warning per slice from our reductions
warnings.filterwarnings("ignore", r"(overflow|invalid value) encountered", RuntimeWarning, __name__)

# min/max as NCCL's fminf/fmaxf/__hmin: a NaN loses to a number (NaN where every rank has NaN)
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.fmin, "max": np.fmax, "avg": np.add}
# primitive -> compute kind
K_SEND, K_COPYSEND, K_RECV, K_RCS, K_RRS, K_RRCS, K_RRC = range(7)
KINDS = {"send": K_SEND, "copySend": K_COPYSEND, "recv": K_RECV, "recvCopySend": K_RCS,
         "recvReduceSend": K_RRS, "recvReduceCopySend": K_RRCS, "recvReduceCopy": K_RRC}
NSTEPS = 8
DIRECT_MIN = 16 << 10       # smaller slices keep the FIFO (a peer view per slice costs more than the copy saves)
_CH_START, _CH_STOP = tail(0, KIND_CHANNEL, 0), tail(0, KIND_CHANNEL, FLAG_CH_STOP)   # a ring program's KernelCh


def finish_avg(d: np.ndarray, nranks: int) -> None:
    """Integer avg = sum / nranks, truncated toward zero (NCCL's SumPostDiv). Floats never get here: premul."""
    if d.dtype.kind == "u":
        np.floor_divide(d, nranks, out=d)
    else:
        q = np.floor_divide(d, nranks)
        q += (d < 0) & (q * nranks != d)
        d[...] = q


def premul(dt: np.dtype, redop: str, nranks: int):
    """Floating avg is NCCL's PreMulSum: each rank's input times 1/nranks (float(1.0/n) in the type) as it enters
    the sum, so a sum past the type's range does not overflow; None for every other op and type."""
    if redop != "avg" or dt.kind in "iu":
        return None
    return np.asarray(np.float32(1.0 / nranks)).astype(dt)[()] if dt.itemsize < 8 else dt.type(1.0 / nranks)


class Direct:
    """A ring op's registered memory (pool.py): its number (both ends count collectives alike), where its buffers
    lie in this rank's pool (bytes, -1: elsewhere), whether this rank has a pool, the neighbours' pools (or None)."""
    __slots__ = ("seq", "src_b", "dst_b", "mine", "rpool", "spool")

    def __init__(self, seq: int, src_b: int, dst_b: int, mine: bool, rpool, spool):
        self.seq, self.src_b, self.dst_b, self.mine, self.rpool, self.spool = seq, src_b, dst_b, mine, rpool, spool


class RingJob:
    """Everything one ring channel program needs, bound once per work."""
    __slots__ = ("work", "rconn", "sconn", "writer", "guard", "delta", "dx")

    def __init__(self, work, rconn, sconn, writer: FastRingWriter | None, guard, delta: int | None,
                 dx: Direct | None = None):
        self.work, self.rconn, self.sconn, self.writer, self.guard = work, rconn, sconn, writer, guard
        self.delta = delta       # byte address of sendbuf minus recvbuf when they overlap (in place), else None
        self.dx = dx             # None: no registered memory here or at a ring neighbour


def run_ring(prog, job: RingJob) -> None:
    """One channel program; its clocks are staged (FastRingWriter.stage_ring) with the records they make (ring_layout,
    once per cached program and stamp flags), also when a wait fails."""
    work, w = job.work, job.writer
    spec = _SPECS.get(id(prog))
    if spec is None or spec[0] is not prog:
        spec = _spec(prog)
    if w is None:
        _ring_slices(spec, job, None)
        return
    # stage_ring's words: its ints (the steps set by _ring_slices), then the clocks in ring_layout()'s order
    words = [0, work.tag & 0xFFFFFFFF, 0, job.rconn.peer & 0xFFFF, 0, job.sconn.peer & 0xFFFF]
    chans = work.stamp_channels
    if chans:
        words.append(time.monotonic_ns())
    try:
        _ring_slices(spec, job, words)
        if chans:
            words.append(time.monotonic_ns())
    finally:
        rate = work.sample_rate
        key = rate << 2 | work.stamp_steps << 1 | chans        # the program's layouts, by stamp flags (ints)
        lay = spec[2].get(key)
        if lay is None:
            lay = spec[2][key] = ring_layout(prog, work.recvbuf.dtype.itemsize, work.plan.proto.slice_steps,
                                             max(rate, 1), work.stamp_steps, chans)
        w.stage_ring(words, lay)


def ring_layout(prog, isz: int, ss: int, rate: int, steps: bool, chans: bool) -> RingLayout:
    """run_ring and _ring_slices stage a KernelCh start (one clock), per non-empty slice (t0, tr, td) received,
    (tw, ts, td) sent, or (t0, tr, ts, td) both ways (the send wait begins at tr), then a KernelCh stop (one
    clock). Records are made for the slices plan.traffic.sampled_slices keeps (the rule the peer and the cuda
    kernel's counts share): the others' clocks are staged, their records are not."""
    recs: list[tuple] = []      # RingLayout's: wait, ready, done clock indices, direction, step offset, word 5
    done_at = [(0, 0)]
    if chans:
        recs.append((0, 0, 0, 2, 0, _CH_START))
        done_at.append((1, 0))
    if steps:
        skipped = 0                     # slices sampled out
        for n, hr, hs, kr, ks, keep_r, keep_s in sampled_slices(prog, rate):
            c = len(done_at) - 1        # this slice's first clock
            if keep_r:
                recs.append((c, c + 1, c + 2 + hs, 0, kr * ss, n * isz | _RTAIL))
            if keep_s:
                recs.append((c + hr, c + 1 + hr, c + 2 + hr, 1, ks * ss, n * isz | _STAIL))
            skipped += hr + hs - keep_r - keep_s
            done_at += [None] * (2 + (hr and hs)) + [(len(recs), skipped)]
    if chans:
        c = len(done_at) - 1
        recs.append((c, c, c, 2, 0, _CH_STOP))
        done_at.append((len(recs), done_at[-1][1]))
    return RingLayout(recs, done_at)


def _spec(prog) -> tuple:
    """A program's per-primitive constants, once per cached program (plans are cached per op shape): (kind,
    receives, sends, src, dst (0 in, 1 out, 2 none), src_off, dst_off, final, slices) each, and its layouts
    (ring_layout())."""
    bi = {"in": 0, "out": 1, None: 2}
    spec = prog, tuple((KINDS[p.name], p.recv_from is not None, p.send_to is not None, bi[p.src], bi[p.dst],
                        p.src_off, p.dst_off, p.final, p.slices) for p in prog.prims), {}
    if len(_SPECS) >= 1024:
        _SPECS.clear()
    _SPECS[id(prog)] = spec
    return spec


_SPECS: dict[int, tuple] = {}       # id(program) -> _spec's (program, ...): the program kept, so the id is its own
_RTAIL, _STAIL = tail(0, KIND_STEP, 0), tail(0, KIND_STEP, FLAG_SEND)     # KernelStep word 5 without size and peer


def _slot_view(views: list, conn, slot: int, n: int, dt, se: int):
    """FIFO slot `slot`'s first n elements, kept in views (Conn.slot_views) for the next slice of that size."""
    i = slot * se
    v = conn.view(dt)[i:i + n]
    views[slot] = n, v
    return v


def _peer_dst(sctl, dx: Direct, guard, speer: int, ch: int, sstep: int, isz: int) -> int:
    """The next rank's output for this op, in elements of its pool (-1: not there); it posts it as it starts."""
    guard.wait_ge(sctl, H_DSTSEQ, dx.seq, speer, ("the output address", speer, ch, sstep))
    if sctl[H_DSTSEQ] != dx.seq:
        raise BackendError(f"rank {speer} posted its output for collective #{sctl[H_DSTSEQ]} where #{dx.seq} was due "
                           f"on channel {ch}: the ring's direct slices lost step")
    b = sctl[H_DSTOFF] - 1
    return b // isz if b >= 0 else -1


def _ring_slices(spec: tuple, job: RingJob, stamps: list | None) -> None:
    work = job.work
    plan, rconn, sconn, guard, w = work.plan, job.rconn, job.sconn, job.guard, job.writer
    dt = work.recvbuf.dtype
    proto = plan.proto
    ss, spc = proto.slice_steps, proto.chunk_steps
    isz = dt.itemsize
    se = proto.step_bytes // isz
    # NCCL rounds conn->step up to a multiple of the chunk steps when a primitive starts
    rconn.step = rstep = -(-rconn.step // spc) * spc
    sconn.step = sstep = -(-sconn.step // spc) * spc
    if stamps is not None:
        stamps[2], stamps[4] = rstep, sstep     # the steps of the program's records count from these (ring_layout())
    rctl, sctl = rconn.ctl, sconn.ctl
    if rctl[H_HEAD] < rstep:             # credit for the steps the rounding skipped (NCCL's PostRecv does too)
        rconn.post(H_HEAD, rstep)
    rsv, ssv = rconn.slot_views(dt, se), sconn.slot_views(dt, se)     # (n, view) per FIFO slot
    rwake, swake = rconn.wakes, sconn.wakes             # a neighbour that sleeps on a futex (transport.Conn.post)
    rbase, sbase = rconn.base, sconn.base
    pol, freed, pc = sconn.reclaim, rconn.freed, time.perf_counter_ns
    bufs = (work.sendbuf, work.recvbuf, None)
    redop = work.redop
    red = UFUNCS[redop]
    avg = redop == "avg"
    pre, mul = premul(dt, "avg", plan.nranks) if avg else None, np.multiply
    avg = avg and pre is None                   # integers: divided once, at the final write
    nranks, ch, rpeer, speer = plan.nranks, spec[0].channel, rconn.peer, sconn.peer
    copyto, wait = np.copyto, guard.wait_ge
    stamp = w is not None and work.stamp_steps
    clock = time.monotonic_ns
    delta = job.delta
    tmin = -(-RECLAIM_MIN // isz)               # slices of RECLAIM_MIN bytes or more: n >= tmin
    tw = tr = ts = t0 = td = 0
    dx, rptr, sptr, sdst, last_dr, sm, p, nd = job.dx, False, False, None, 0, 0, 0, 0
    if dx is not None:
        rptr, sptr = dx.mine or dx.rpool is not None, dx.mine or dx.spool is not None   # direct slices may flow
        if dx.mine:                 # where the previous rank may write our output, for this op
            rctl[H_DSTOFF] = dx.dst_b + 1
            rctl[H_DSTSEQ] = dx.seq
        rpv = dx.rpool.view(dt) if dx.rpool is not None else None
        spv = dx.spool.view(dt) if dx.spool is not None else None
        src_e = dx.src_b // isz if dx.src_b >= 0 and pre is None else -1
        dmin = -(-DIRECT_MIN // isz)
    for kind, hr, hs, si, di, so, do, fin, slices in spec[1]:
        src, dst = bufs[si], bufs[di]
        fin = avg and fin
        same = kind == K_COPYSEND and delta is not None and so * isz + delta == do * isz
        for off, n in slices:
            if hr:
                rn = rstep + ss                      # this slice's end: the tail it waits for, the head it posts
                if rctl[H_TAIL] >= rn:               # data already there: ready = wait, read after seeing it
                    if stamp:
                        t0 = tr = clock()
                else:
                    if stamp:
                        t0 = clock()
                    wait(rctl, H_TAIL, rn, rpeer, ("data", rpeer, ch, rstep), rbase)
                    if stamp:
                        tr = clock()                 # after the tail was seen: never before the sender's done
                if n:
                    p = rctl[H_PTRS + (rstep & 7)] if rptr else 0
                    if p == 0:
                        k, r = rsv[rstep & 7]
                        if k != n:
                            r = _slot_view(rsv, rconn, rstep & 7, n, dt, se)
                    elif p == 1:                     # already in our output
                        b = do + off
                        r = dst[b:b + n]
                    else:                            # in the sender's input
                        i = (p - 2) // isz
                        r = rpv[i:i + n]
            if hs:
                if stamp:
                    tw = ts = tr if hr else clock()  # the send wait starts when the recv wait ended
                sn = sstep + ss
                if sctl[H_HEAD] < sn - NSTEPS:
                    wait(sctl, H_HEAD, sn - NSTEPS, speer, ("credit", speer, ch, sstep), sbase)
                    if stamp:
                        ts = clock()
                if n:
                    if sptr:
                        sm = 0
                        if kind == K_SEND:
                            if src_e >= 0 and n >= dmin:
                                sm = 2 + (src_e + so + off) * isz
                                last_dr = sn
                        elif kind != K_RRS and spv is not None and n >= dmin:
                            if sdst is None:
                                sdst = _peer_dst(sctl, dx, guard, speer, ch, sstep, isz)
                            if sdst >= 0:
                                sm = 1
                                i = sdst + do + off
                                s = spv[i:i + n]
                        sctl[H_PTRS + (sstep & 7)] = sm
                        nd += sm > 0
                    if sm == 0:
                        k, s = ssv[sstep & 7]
                        if k != n:
                            s = _slot_view(ssv, sconn, sstep & 7, n, dt, se)
            if n:
                # the write into the send FIFO is timed for the reclaim decision, from RECLAIM_MIN bytes only
                timed = hs and n >= tmin and sm == 0       # t1, t2 set and read only then
                if kind == K_RRS:
                    a = so + off
                    if timed:
                        t1 = pc()
                    if pre is None:
                        red(r, src[a:a + n], out=s)
                    else:
                        mul(src[a:a + n], pre, out=s)
                        red(s, r, out=s)
                    if timed:
                        t2 = pc()
                elif kind == K_RRCS or kind == K_RRC:
                    a, b = so + off, do + off
                    d = dst[b:b + n]
                    if pre is None:
                        red(src[a:a + n], r, out=d)
                    else:
                        mul(src[a:a + n], pre, out=d)
                        red(d, r, out=d)
                    if fin:
                        finish_avg(d, nranks)
                    if hs:
                        if timed:
                            t1 = pc()
                        copyto(s, d)
                        if timed:
                            t2 = pc()
                elif kind == K_SEND:
                    a = so + off
                    if timed:
                        t1 = pc()
                    if sm > 1:
                        pass                                # the receiver reads it from our input
                    elif pre is None:
                        copyto(s, src[a:a + n])
                    else:
                        mul(src[a:a + n], pre, out=s)
                    if timed:
                        t2 = pc()
                elif kind == K_RCS:
                    b = do + off
                    if timed:
                        t1 = pc()
                    copyto(s, r)
                    if timed:
                        t2 = pc()
                    if p != 1:
                        copyto(dst[b:b + n], r)
                elif kind == K_RECV:
                    if p != 1:
                        b = do + off
                        copyto(dst[b:b + n], r)
                else:   # K_COPYSEND
                    a, b = so + off, do + off
                    if timed:
                        t1 = pc()
                    copyto(s, src[a:a + n])
                    if timed:
                        t2 = pc()
                    if not same:
                        copyto(dst[b:b + n], src[a:a + n])
                if timed:
                    pol.wrote(sstep & 7, n * isz, t2 - t1)
                if hr and p == 0:
                    freed(rstep & 7, n * isz)
            if stamp:
                td = clock()
            if hs:                                   # publish the slice
                if swake:
                    sconn.post(H_TAIL, sn)
                else:
                    sctl[H_TAIL] = sn
            if hr:                                   # return the credit
                if rwake:
                    rconn.post(H_HEAD, rn)
                else:
                    rctl[H_HEAD] = rn
            if stamp and n:                          # ring_layout()'s order: it drops the sampled-out records
                if hr and hs:
                    stamps += (t0, tr, ts, td)
                elif hr:
                    stamps += (t0, tr, td)
                else:
                    stamps += (tw, ts, td)
            if hs:
                sstep = sn
            if hr:
                rstep = rn
    if last_dr and sctl[H_HEAD] < last_dr:     # our input may change once we return: the receiver has read it
        wait(sctl, H_HEAD, last_dr, speer, ("credit", speer, ch, sstep), sbase)
    rconn.step, sconn.step = rstep, sstep
    sconn.direct += nd
