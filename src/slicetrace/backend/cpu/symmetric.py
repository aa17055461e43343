"""Symmetric kernels on the cpu backend (plan/symmetric.py): loads from and stores into every peer's window.

Every rank maps every peer's segment, pool included. Per op, a rank posts where its buffers lie in its pool and the
op's number into the header of its point-to-point connection to each peer (shm.SYM_*), then waits for every peer's
post: entered (the peer's input is ready and its output may be written). Its programs (one per channel) reduce
their cells from every rank's input and store them into every rank's output; then it posts `stored` and waits for
every peer's: its output is whole and nobody reads its input any more, so it may return. Waits sleep on futexes
when ranks outnumber cores, as the ring's do (Conn.post wakes the sleeper).

Records: a KernelCh per program, and per cell one KernelStep per peer and direction: the load from that peer
(received) and the store into its output (sent), each timed alone, so a slow link or a late rank shows on its own
records. The first cell's records wait from the op's start until they move (every peer has entered then): a late
rank shows there on all its peers, and as the last KernelCh start of the op.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ...errors import BackendError
from ...stamps.layout import FLAG_SEND, KIND_STEP
from ..base import host_pointer
from .shm import SYM_DST, SYM_IN, SYM_OUT, SYM_SRC
from .stamper import tail
from .worker import _CH_START, _CH_STOP, UFUNCS, finish_avg, premul    # KernelCh words as the ring's

# IEEE overflow (float16 sums) is the data's, as on NCCL: no numpy warning per cell (worker.py's rule)
warnings.filterwarnings("ignore", r"(overflow|invalid value) encountered", RuntimeWarning, __name__)


def run_symmetric(be, work, parallel) -> None:
    """One symmetric op on backend `be` (CpuBackend: pools, connections, guard, writers); parallel(progs, fn) runs
    fn(prog) for each program, channel 0 in this thread."""
    plan, g = work.plan, be.guard
    progs = plan.programs
    if not progs:
        return
    be.sym_ops += 1
    rank, n, seq = plan.rank, plan.nranks, be._coll_seq
    a, b = work.sendbuf, work.recvbuf
    dt = a.dtype
    isz = dt.itemsize
    stamps = work.stamp_steps or work.stamp_channels
    clock = time.monotonic_ns
    t0 = clock() if stamps else 0
    src_b, dst_b = be.pool.offset(a, isz), be.pool.offset(b, isz)     # windows (CpuBackend.symmetric said so)
    order = [(rank + j) % n for j in range(1, n)]           # each rank starts with its next: loads spread out
    for p in order:
        c = be.p2p_send[p]
        c.ctl[SYM_SRC], c.ctl[SYM_DST] = src_b, dst_b
        c.post(SYM_IN, seq)
    ins, outs = [a] * n, [b] * n
    for p in order:
        c = be.p2p_recv[p]
        ctl = c.ctl
        if ctl[SYM_IN] < seq:
            g.wait_ge(ctl, SYM_IN, seq, p, f"rank {p} to enter collective #{seq} (symmetric kernel)", c.base)
        if ctl[SYM_IN] != seq:
            raise BackendError(f"rank {p} entered collective #{ctl[SYM_IN]} where #{seq} was due: the symmetric "
                               f"kernels' entry words lost step")
    g.check_sigs(g.sig)         # each peer published its op before entering: the same one, or a MismatchError
    for p in order:
        ctl, pv = be.p2p_recv[p].ctl, be._peer_pools[p]
        s, d = ctl[SYM_SRC], ctl[SYM_DST]
        if s % isz or d % isz or s + a.nbytes > len(pv) or d + b.nbytes > len(pv):
            raise BackendError(f"rank {p} posted window bytes {s} / {d} for collective #{seq}, which do not hold "
                               f"{a.nbytes} / {b.nbytes} bytes of {dt} in its pool of {len(pv)}")
        ins[p], outs[p] = pv[s:s + a.nbytes].view(dt), pv[d:d + b.nbytes].view(dt)
    w = be.writers
    recs: dict[int, list] = {prog.channel: [] for prog in progs}
    try:
        parallel(progs, lambda prog: _cells(prog, work, ins, outs, order, w[prog.channel] if stamps else None,
                                            recs[prog.channel], t0))
        for p in order:
            be.p2p_send[p].post(SYM_OUT, seq)
        for p in order:
            c = be.p2p_recv[p]
            if c.ctl[SYM_OUT] < seq:
                g.wait_ge(c.ctl, SYM_OUT, seq, p, f"rank {p} to store collective #{seq} (symmetric kernel)", c.base)
        if work.stamp_channels:
            t = clock()
            for r in recs.values():
                r += (t, t, t, work.tag & 0xFFFFFFFF, 0, _CH_STOP)
    finally:
        if stamps:
            for ch, r in recs.items():
                w[ch].stage(r)


def _cells(prog, work, ins, outs, order, writer, recs: list, t0: int) -> None:
    """One program's cells: load and reduce from every rank (own input first), then store into every rank."""
    par = prog.params
    rank, nranks = work.plan.rank, work.plan.nranks
    src, dst, load, store = par["src"], par["dst"], par["load"], par["store"]
    a, o_me = ins[rank], outs[rank]
    dt = a.dtype
    isz = dt.itemsize
    redop = work.redop
    red, copyto = UFUNCS[redop], np.copyto
    pre = premul(dt, redop, nranks)
    fin = redop == "avg" and pre is None
    t2 = np.empty(max((k for _, k in par["cells"]), default=0), dt) if pre is not None and load else None
    op = work.tag & 0xFFFFFFFF
    stamp = writer is not None and work.stamp_steps
    clock = time.monotonic_ns
    if writer is not None and work.stamp_channels:
        recs += (t0, t0, t0, op, 0, _CH_START)
    rate, skipped = max(1, work.sample_rate), 0
    rtail = [tail(p, KIND_STEP, 0) for p in range(nranks)]
    stail = [tail(p, KIND_STEP, FLAG_SEND) for p in range(nranks)]
    own = not load and par["n"] > 0 and host_pointer(a[src:]) != host_pointer(o_me[dst:])   # all_gather not in place
    for i, (off, k) in enumerate(par["cells"]):
        keep = stamp and i % rate == 0
        s0, d0 = src + off, dst + off
        nb = k * isz
        if load:
            o = o_me[d0:d0 + k]
            mine = a[s0:s0 + k]
            for j, p in enumerate(order):
                t1 = clock() if keep else 0
                x = ins[p][s0:s0 + k]
                if pre is not None:
                    if j == 0:
                        np.multiply(mine, pre, out=o)
                    np.multiply(x, pre, out=t2[:k])
                    red(o, t2[:k], out=o)
                else:
                    red(mine if j == 0 else o, x, out=o)
                if keep:
                    recs += (t0 if i == 0 else t1, t1, clock(), op, i, nb | rtail[p])
            if fin:
                finish_avg(o, nranks)
        else:
            o = a[s0:s0 + k]
        if store:
            for p in order:
                t1 = clock() if keep else 0
                copyto(outs[p][d0:d0 + k], o)
                if keep:
                    recs += (t0 if i == 0 and not load else t1, t1, clock(), op, i, nb | stail[p])
            if own:
                copyto(o_me[d0:d0 + k], o)
        if stamp and not keep:
            skipped += (nranks - 1) * (load + store)
    if skipped:
        writer.sampled_out(skipped)

