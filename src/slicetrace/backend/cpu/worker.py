"""Executes plan primitives with numpy: ring channel programs and concurrent point-to-point groups.

Reference semantics of one slice of a primitive (plan.schedule.Prim), n = slice elements:

    recv:  wait tail >= rstep + ss ; r = recv FIFO slot (rstep % 8)
    send:  wait head + 8 >= sstep + ss ; s = next rank's FIFO slot (sstep % 8)
    data:  send r'=src ; recvReduceSend s = r + src ; recvReduceCopySend dst = r + src, s = dst ; ...
    post:  tail = sstep + ss (to the next rank), head = rstep + ss (credit back); steps += ss

Empty slices wait and post like the others (both sides keep their step counters in lockstep).
Stamp clocks: wait before waiting, ready after the wait, done before the tail is posted. Point-to-point groups:
p2p.py.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ...stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP
from .shm import H_HEAD, H_TAIL
from .stamper import FastRingWriter, tail
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


class RingJob:
    """Everything one ring channel program needs, bound once per work."""
    __slots__ = ("work", "rconn", "sconn", "writer", "guard", "delta")

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


def _spec(prog) -> tuple:
    """A program's per-primitive constants, once per cached program (plans are cached per op shape): (kind,
    receives, sends, src, dst (0 in, 1 out, 2 none), src_off, dst_off, final, slices) each."""
    bi = {"in": 0, "out": 1, None: 2}
    spec = prog, tuple((KINDS[p.name], p.recv_from is not None, p.send_to is not None, bi[p.src], bi[p.dst],
                        p.src_off, p.dst_off, p.final, p.slices) for p in prog.prims)
    if len(_SPECS) >= 1024:
        _SPECS.clear()
    _SPECS[id(prog)] = spec
    return spec


_SPECS: dict[int, tuple] = {}       # id(program) -> (program, _spec's tuples): the program kept, so the id is its own
_RTAIL, _STAIL = tail(0, KIND_STEP, 0), tail(0, KIND_STEP, FLAG_SEND)     # KernelStep word 5 without size and peer


def _ring_slices(prog, job: RingJob, recs: list) -> None:
    work = job.work
    plan, rconn, sconn, guard, w = work.plan, job.rconn, job.sconn, job.guard, job.writer
    spec = _SPECS.get(id(prog))
    if spec is None or spec[0] is not prog:
        spec = _spec(prog)
    dt = work.recvbuf.dtype
    proto = plan.proto
    ss, spc = proto.slice_steps, proto.chunk_steps
    isz = dt.itemsize
    se = proto.step_bytes // isz
    # NCCL rounds conn->step up to a multiple of the chunk steps when a primitive starts
    rconn.step = rstep = -(-rconn.step // spc) * spc
    sconn.step = sstep = -(-sconn.step // spc) * spc
    rctl, sctl = rconn.ctl, sconn.ctl
    if rctl[H_HEAD] < rstep:             # credit for the steps the rounding skipped (NCCL's PostRecv does too)
        rconn.post(H_HEAD, rstep)
    rsv, ssv = rconn.slot_views(dt, se), sconn.slot_views(dt, se)     # (n, view) per FIFO slot
    r0, s0 = rstep, sstep               # slice k of a direction: (step - its first) // ss, as at the peer's end
    rwake, swake = rconn.wakes, sconn.wakes             # a neighbour that sleeps on a futex (transport.Conn.post)
    rbase, sbase = rconn.base, sconn.base
    pol, freed, pc = sconn.reclaim, rconn.freed, time.perf_counter_ns
    bufs = (work.sendbuf, work.recvbuf, None)
    redop = work.redop
    red = UFUNCS[redop]
    avg = redop == "avg"
    pre, mul = premul(dt, "avg", plan.nranks) if avg else None, np.multiply
    avg = avg and pre is None                   # integers: divided once, at the final write
    nranks, ch, rpeer, speer = plan.nranks, prog.channel, rconn.peer, sconn.peer
    copyto, wait = np.copyto, guard.wait_ge
    op = work.tag & 0xFFFFFFFF
    stamp = w is not None and work.stamp_steps
    rate = work.sample_rate if work.sample_rate > 1 else 1
    clock = time.monotonic_ns
    rtail = stail = 0
    if stamp:                                   # word 5's constant part, for KernelStep records only
        rtail, stail = (rpeer & 0xFFFF) << 32 | _RTAIL, (speer & 0xFFFF) << 32 | _STAIL
    delta = job.delta
    tmin = -(-RECLAIM_MIN // isz)               # slices of RECLAIM_MIN bytes or more: n >= tmin
    tw = tr = ts = t0 = td = 0
    last_n = nbr = nbs = 0
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
                    k, r = rsv[rstep & 7]
                    if k != n:
                        i = (rstep & 7) * se
                        r = rconn.view(dt)[i:i + n]
                        rsv[rstep & 7] = n, r
            if hs:
                if stamp:
                    tw = ts = tr if hr else clock()  # the send wait starts when the recv wait ended
                sn = sstep + ss
                if sctl[H_HEAD] < sn - NSTEPS:
                    wait(sctl, H_HEAD, sn - NSTEPS, speer, ("credit", speer, ch, sstep), sbase)
                    if stamp:
                        ts = clock()
                if n:
                    k, s = ssv[sstep & 7]
                    if k != n:
                        i = (sstep & 7) * se
                        s = sconn.view(dt)[i:i + n]
                        ssv[sstep & 7] = n, s
            if n:
                # the write into the send FIFO is timed for the reclaim decision, from RECLAIM_MIN bytes only
                timed = hs and n >= tmin                   # t1, t2 set and read only then
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
                    if pre is None:
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
                    copyto(dst[b:b + n], r)
                elif kind == K_RECV:
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
                if hr:
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
            if stamp and n:
                if n != last_n:                        # word 5 changes with the slice size only
                    last_n, nbr, nbs = n, n * isz | rtail, n * isz | stail
                if rate == 1:
                    if hr and hs:
                        recs += (t0, tr, td, op, rstep, nbr, tw, ts, td, op, sstep, nbs)
                    elif hr:
                        recs += (t0, tr, td, op, rstep, nbr)
                    else:
                        recs += (tw, ts, td, op, sstep, nbs)
                else:           # per direction (plan.traffic.stamp_records): the peer keeps the same slices
                    kept = 0
                    if hr and (rstep - r0) // ss % rate == 0:
                        recs += (t0, tr, td, op, rstep, nbr)
                        kept += 1
                    if hs and (sstep - s0) // ss % rate == 0:
                        recs += (tw, ts, td, op, sstep, nbs)
                        kept += 1
                    if hr + hs - kept:
                        w.sampled_out(hr + hs - kept)
            if hs:
                sstep = sn
            if hr:
                rstep = rn
    rconn.step, sconn.step = rstep, sstep
