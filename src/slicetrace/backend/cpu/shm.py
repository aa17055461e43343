"""Shared-memory segments of the cpu backend: one per rank, created by that rank, attached by its peers.

Segment of rank r (all offsets 4 KiB aligned):

    control block      4 KiB   pid, heartbeat, abort word + reason, op-signature table, p2p stall (read by peers)
    connections        (nch + world) x (4 KiB header + buffsize FIFO); r is the *receiver* of all of them:
                       index c < nch: ring channel c from rank r-1; index nch + s: point-to-point from rank s
    stamp rings        stamps.layout.ring_bytes(nch, ring_slots)  (read by this rank's drain thread)
    registered pool    cpu_pool bytes (C_POOL): Comm.mem_alloc's buffers, read and written by ring peers (pool.py)

A segment's pages are reserved at creation (posix_fallocate): a /dev/shm too small is a BackendError, not SIGBUS.
Segments bypass Python's resource_tracker (spawned ranks share one tracker, and a segment registered by
both its creator and an attacher makes the tracker print spurious errors). The creator unlinks it
once every rank attached (the mapping lives on), so nothing stays in /dev/shm however a rank ends; before that, a
rank killed in its set-up has its name removed by a peer (it says the name and its pid first: the `making` key),
and a launcher removes what else a set-up that failed part way left, by the job string in the name (`st_<job>_...`).
"""
from __future__ import annotations

import os

from ...stamps.layout import ring_bytes
from ..segment import SHM_DIR

PAGE = 4096
MAGIC = 0x53544350_55000008        # "STCPU" + layout version 8
NSIG = 16                          # op-signature / message tables keep the last 16 entries

# control block, u64 word indices
C_MAGIC, C_PID, C_START, C_HEARTBEAT, C_ABORT, C_ABORT_FROM, C_CLOSED, C_REASON_LEN = range(8)
C_NCH, C_BUFFSIZE, C_WORLD, C_SLOTS = 8, 9, 10, 11
C_FUTEX = 12                               # 1: this rank's ring waits sleep on a futex; its peers wake it
C_P2PCHUNK = 13                            # p2p_chunksize: both ends must cut a message's steps alike
C_PIDNS = 14                               # its PID namespace (procs.pid_ns_id): a pid means nothing elsewhere
C_POOL = 15                                # bytes of its registered pool (0: none; its ring peers never go direct)
REASON_OFF, REASON_MAX = 256, 512          # bytes
SIG_WORD = 1024 // 8                       # 16 entries x 4 words: seq, count, packed, cfg
# a stalled p2p progress loop (stall.py): epoch (0 while written), tick, lanes (STALL_MANY: too many to list),
# last epoch, then 2 words per lane to the block's end
C_STALL = 1536 // 8
STALL_EPOCH, STALL_TICK, STALL_NLANES, STALL_LAST, STALL_LANE0 = range(5)
STALL_LANES = (PAGE // 8 - C_STALL - STALL_LANE0) // 2
STALL_MANY = 1 << 32
# connection header, u64 word indices (tail and head on separate cache lines)
H_TAIL, H_HEAD, H_MSG = 0, 8, 16           # H_MSG: 16 entries x 4 words: seq+1, count, dtype code, whole message's count
H_MSGACK = 80                              # headers the receiver has checked: a sender stays < NSIG ahead of it
H_SLEEP = 1                                # word after tail / head: 1 while its waiter sleeps on it (futex.py)
# FIFO line reclaim (transport.Reclaim): the mode word the sender sets, then one word per slot that the
# receiver writes when it frees the slot: 0 = not yet, 1 = freed as is, 2 + ns = lines reclaimed in ns
H_RECLAIM, H_RECLAIMED = 128, 136
# direct slices (worker.py): per slot, what the sender posted before the tail: 0 = in the FIFO, 1 = written into
# the receiver's dst at the slice's own place, 2 + b = read it from the sender's pool at byte b. H_DSTOFF/H_DSTSEQ:
# the receiver's dst for the ring op it runs (pool byte + 1, 0 = not in the pool), then that op's number (last)
H_PTRS, H_DSTOFF, H_DSTSEQ = 144, 152, 153
# symmetric kernels (symmetric.py), in the header of the point-to-point connection from the poster: its buffers'
# pool bytes, then the op's number once it entered (SYM_IN) and once it stored into every window (SYM_OUT); the
# word after each is its futex sleep flag (H_SLEEP)
SYM_SRC, SYM_DST, SYM_IN, SYM_OUT = 160, 161, 168, 176

ABORT_PEER, ABORT_MISMATCH, ABORT_TIMEOUT = 1, 2, 3


def layout(nch: int, world: int, buffsize: int) -> tuple[int, int, int]:
    """(offset of connection 0, connection stride, offset of the stamp rings); total = rings + ring_bytes."""
    stride = PAGE + buffsize
    rings = PAGE + (nch + world) * stride
    return PAGE, stride, rings


def pool_offset(nch: int, world: int, buffsize: int, slots: int) -> int:
    _, _, rings = layout(nch, world, buffsize)
    return rings + -(-ring_bytes(nch, slots) // PAGE) * PAGE


def segment_size(nch: int, world: int, buffsize: int, slots: int, pool: int = 0) -> int:
    return pool_offset(nch, world, buffsize, slots) + -(-pool // PAGE) * PAGE


def advice(nch: int, world: int, buffsize: int, slots: int, pool: int = 0) -> str:
    """What a segment that did not fit is made of, and the settings that size each part."""
    _, stride, rings = layout(nch, world, buffsize)
    fifo, ring = (nch + world) * stride, segment_size(nch, world, buffsize, slots) - rings
    reg = f" and {pool / 2**20:.1f} MiB of registered pool (cpu_pool {pool})" if pool else ""
    return (f", and every rank on this host needs one such segment: {fifo / 2**20:.1f} MiB of FIFOs ((nchannels "
            f"{nch} + world {world}) x buffsize {buffsize}), {ring / 2**20:.1f} MiB of stamp rings (nchannels x "
            f"ring_slots {slots}){reg}. Lower SLICETRACE_BUFFSIZE (buffsize=, default 4M), SLICETRACE_NCHANNELS "
            f"(nchannels=), SLICETRACE_STAMP_RING_SLOTS (ring_slots=)" + (" or SLICETRACE_CPU_POOL (cpu_pool=)"
                                                                        if pool else ""))


def shm_shortfall(nranks: int, nch: int, buffsize: int, slots: int, pool: int = 0) -> str | None:
    """Why nranks ranks' segments together cannot fit in /dev/shm, else None: asked before any rank starts (a
    typo of 100000 ranks would otherwise spawn 100000 processes that each fail)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None             # no /dev/shm to measure: the backend reports its own failure
    free = st.f_bavail * st.f_frsize
    need = nranks * segment_size(nch, nranks, buffsize, slots, pool)
    if need <= free:
        return None
    return (f"the cpu backend's shared memory would need about {need / 2**20:,.0f} MiB in {SHM_DIR} and "
            f"{free / 2**20:,.0f} MiB is free{advice(nch, nranks, buffsize, slots, pool)}")
