"""backend='cpu': one process per rank, Simple-protocol FIFOs in shared memory, numpy data path.

`submit` runs a work to completion before it returns: channel 0 (and every point-to-point part,
round-robin) in the caller's thread, channels 1.. in worker threads. See shm.py for the memory layout,
transport.py for waits and failure detection, worker.py for the ring primitives, p2p.py for point-to-point groups.
"""
from __future__ import annotations

import os
import secrets
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ...errors import BackendError, MismatchError, PeerError, UsageError, credit, plural
from ...stamps.layout import RingViews, ring_bytes
from ..base import HostBackend, Work, host_pointer, part_views, quiet_thread
from ..procs import pid_ns_id, proc_start_time, this_proc
from ..segment import Segment, host_id, sigterm_exits, unlink_name
from .shm import (ABORT_MISMATCH, ABORT_PEER, C_ABORT, C_BUFFSIZE, C_CLOSED, C_FUTEX, C_HEARTBEAT, C_MAGIC, C_NCH,
                  C_P2PCHUNK, C_PID, C_PIDNS, C_POOL, C_SLOTS, C_START, C_WORLD, MAGIC, PAGE, REASON_MAX,
                  REASON_OFF, advice, layout, pool_offset, segment_size)
from . import affinity, futex
from .stamper import FastRingWriter
from ..opsig import encode_sig
from .transport import Conn, Guard
from .p2p import pending_messages, run_p2p
from .pool import Pool
from .setup_peers import SetupPeers
from . import worker
from .worker import Direct, RingJob, run_ring
from .channels import run_channels
from .symmetric import run_symmetric
from ...plan.symmetric import SYM_FUNCS, SYM_MIN

HEARTBEAT_S = 0.1


def _pool_thread() -> None:
    affinity.unbind_thread()
    quiet_thread()


def peer_pid(pctl: Any, own_ns: int) -> int:
    """A peer's pid as this process may judge it: 0 (not judged by pid) unless both name one PID namespace."""
    return int(pctl[C_PID]) if pctl[C_PIDNS] and pctl[C_PIDNS] == own_ns else 0


class CpuBackend(SetupPeers, HostBackend):
    STORE_KEYS = ("making/{r}", "seg/{r}", "attached/{r}", "failed/{r}")
    name = "cpu"
    synchronous = True          # submit() returns when the work is done
    stamps_fetched = True       # ring programs stage their records; fetch_stamps publishes them (stamper.py)
    sym_ops = 0                 # ops run by the symmetric kernels (symmetric.py)

    def __init__(self, settings, rank: int, world: int, store, job: str):
        super().__init__(settings, rank, world, store, job)
        if not 0 <= rank < world:
            raise UsageError(f"rank={rank} must be in 0..{world - 1}")
        self.nch = nch = settings.channels
        self._closed = False
        self._all_attached = False      # past the 'attached' barrier: every rank has every segment mapped
        self._told = False              # an abort's error reached the caller (else close raises a mismatch)
        self._ntok = 0
        self._coll_seq = 0
        self._sigs: dict[tuple, tuple] = {}     # (id(plan), dtype, redop) -> (plan, encode_sig's words)
        self._peer_segs: dict[int, Segment] = {}
        self._making: dict[int, bytes | None] = {}     # peers' 'making' keys: set once, read from the store once
        self._pool: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        gen = self.generation
        self._prefix = self.store_prefix("cpu", gen)
        with sigterm_exits():          # our name is in /dev/shm until every rank attached
            self._create(segment_size(nch, world, settings.buffsize, settings.ring_slots, settings.cpu_pool), gen)

    def _create(self, size: int, gen: int) -> None:
        s, rank = self.settings, self.rank
        name = f"st_{self.job}_{gen}_{rank}_{secrets.token_hex(3)}"
        try:        # the name and this process first: a peer that finds us killed before we publish removes it
            self.store.set(f"{self._prefix}/making/{rank}", f"{name} {this_proc()}".encode())
            self.seg = Segment(name, size, create=True, advice=advice(self.nch, self.world, s.buffsize, s.ring_slots,
                                                                      s.cpu_pool))
        except BaseException as e:      # e.g. a full /dev/shm: peers waiting for our segment hear why at once
            if not isinstance(e, FileExistsError):  # the name is ours (O_EXCL): a SIGTERM's exit as Segment ended
                unlink_name(name)                   # or returned, past its own cleanup, left it
            self._say_failed(e)
            raise
        try:
            self._setup()
        except BaseException as e:
            self._unlink_dead_peers()
            self._say_failed(e)     # a peer that finds our segment gone says why (not "closed or cleaned up")
            self.close()
            raise

    # ---- setup ----
    def _setup(self) -> None:
        s, nch, rank, world = self.settings, self.nch, self.rank, self.world
        conn0, stride, rings = layout(nch, world, s.buffsize)
        ctl = self.seg.words(0, PAGE)
        ctl[C_PID], ctl[C_START], ctl[C_HEARTBEAT] = os.getpid(), proc_start_time(os.getpid()), time.monotonic_ns()
        ctl[C_NCH], ctl[C_BUFFSIZE], ctl[C_WORLD], ctl[C_SLOTS] = nch, s.buffsize, world, s.ring_slots
        ctl[C_P2PCHUNK] = s.p2p_chunk_bytes
        ctl[C_PIDNS] = pid_ns_id()
        self._pool_at = pool_at = pool_offset(nch, world, s.buffsize, s.ring_slots)    # peers' pools lie there too
        ctl[C_POOL] = pool = self.seg.size - pool_at
        self.pool = Pool(self.seg.bytes_(pool_at, pool) if pool else None, pool)
        self._peer_pools: dict[int, np.ndarray] = {}
        ctl[C_MAGIC] = MAGIC
        self.ctl = ctl
        self._rings = RingViews(self.seg.bytes_(rings, ring_bytes(nch, s.ring_slots)), nch, s.ring_slots)
        self.writers = [FastRingWriter(self._rings, c) for c in range(nch)]
        self.guard = Guard(rank, ctl, self.seg.bytes_(REASON_OFF, REASON_MAX), s.timeout_s)
        crowded = world > len(affinity.allowed())
        if crowded:
            self.guard.spins = 10        # ranks share cores: the peer we poll for needs our core, yield early
        if s.cpu_wait == "futex" and not futex.available():
            raise BackendError(f"cpu_wait='futex' needs Linux on x86_64 or aarch64 (this is {sys.platform}, "
                               f"{os.uname().machine}); use 'auto' or 'spin'")
        self.guard.futex = s.cpu_wait == "futex" or (s.cpu_wait == "auto" and crowded and futex.available())
        ctl[C_FUTEX] = int(self.guard.futex)      # before the name is published: peers read it when they attach
        self._hb = threading.Thread(target=self._heartbeat, args=(weakref.ref(self), self._stop),
                                    name=f"slicetrace-heartbeat-r{rank}", daemon=True)
        self._hb.start()
        mine = f"{self.seg.name} {host_id()}".encode()
        if self.store.claim(f"{self._prefix}/seg/{rank}", mine) != mine:
            raise UsageError(f"rank {rank} of job {self.job!r} was joined by another process first (two communicators "
                             f"over one store share this job string); pass each communicator a job= of its own")
        names = self._names = {}
        self.guard.on_dead = lambda p: unlink_name(names[p])
        alive = self._peers_alive
        for p in range(world):
            if p != rank:
                names[p], host = self.store.get(f"{self._prefix}/seg/{p}", s.timeout_s, check=alive, what=f"rank "
                                                f"{p}'s cpu backend segment (job {self.job!r})").decode().split(" ", 1)
                self._attach(p, names[p], host)

        def conn(seg: Segment, idx: int, peer: int, is_send: bool) -> Conn:
            off = conn0 + idx * stride
            return Conn(seg.words(off, PAGE), seg.bytes_(off + PAGE, s.buffsize), peer, is_send, s.cpu_reclaim)
        prv, nxt = (rank - 1) % world, (rank + 1) % world
        self.ring_recv, self.ring_send, self.p2p_recv, self.p2p_send = [], [], {}, {}
        if world > 1:
            self.ring_recv = [conn(self.seg, c, prv, False) for c in range(nch)]
            self.ring_send = [conn(self._peer_segs[nxt], c, nxt, True) for c in range(nch)]
            for c in range(nch):         # wake the neighbour that sleeps on what we post: credit back, data on
                self.ring_recv[c].wakes = bool(self.guard.peers[prv][0][C_FUTEX])
                self.ring_send[c].wakes = bool(self.guard.peers[nxt][0][C_FUTEX])
            for p in self._peer_segs:
                self.p2p_recv[p] = conn(self.seg, nch + p, p, False)
                self.p2p_send[p] = conn(self._peer_segs[p], nch + rank, p, True)
        self._direct = self.pool.size > 0 or bool({prv, nxt} & set(self._peer_pools))
        self._sym = self.pool.size > 0 and len(self._peer_pools) == world - 1      # every rank has a pool
        # everyone attached: the name is no longer needed, and a rank that ends without close() (torchrun, kill -9)
        # leaves nothing in /dev/shm; the memory lives until the last rank unmaps it
        self.store.barrier(f"{self._prefix}/attached", rank, world, s.timeout_s, check=alive)
        self._all_attached = True
        self._unlink_names()
        cpus = affinity.candidates(rank, world, nch) if s.cpu_bind == "on" else []    # launch() resolves "auto"
        self._bound = affinity.bind(cpus) if cpus else None      # after the heartbeat thread started

    def describe(self) -> str:
        s = self.settings
        if self._bound is not None:
            bound = f"bound to cpu {min(os.sched_getaffinity(0))}"
        else:       # affinity.candidates' rule: one core per rank, one channel
            bound = "not bound" + (" (one core per rank and one channel only)" if s.cpu_bind == "on" else "")
        waits = "futex" if self.guard.futex else f"spin (yield after {self.guard.spins})"
        return (f"{plural(self.nch, 'channel')}, FIFO {s.buffsize} B in 8 steps, waits {waits} (cpu_wait={s.cpu_wait}), "
                f"{bound} (cpu_bind={s.cpu_bind}), "
                f"reclaim {s.cpu_reclaim}, {s.ring_slots} stamp slots per ring, p2p chunk {s.p2p_chunk_bytes} B")

    def _attach(self, p: int, name: str, host: str) -> None:
        try:
            seg = Segment(name)
        except FileNotFoundError:
            if host != host_id():
                raise BackendError(f"rank {p} runs on host {host}, rank {self.rank} on {host_id()}: the cpu backend "
                                   f"moves data through one host's shared memory (/dev/shm), so every rank must run "
                                   f"on one machine (in one container); across hosts use backend='cuda' or "
                                   f"torch.distributed") from None
            why, dead = self.store.try_get(f"{self._prefix}/failed/{p}"), self._died_making(p)
            raise PeerError(f"rank {p}'s segment {name!r} is gone: " + (
                f"rank {p}'s set-up failed: {why.decode()}" if why else f"rank {p} {dead}" if dead else
                f"rank {p} closed or was cleaned up")) from None
        self._peer_segs[p] = seg
        pctl = seg.words(0, PAGE)
        s = self.settings
        mine = (self.nch, s.buffsize, self.world, s.ring_slots, s.p2p_chunk_bytes)
        theirs = (pctl[C_NCH], pctl[C_BUFFSIZE], pctl[C_WORLD], pctl[C_SLOTS], pctl[C_P2PCHUNK])
        if pctl[C_MAGIC] != MAGIC or theirs != mine:
            raise MismatchError(f"rank {p} runs the cpu backend with (nchannels, buffsize, world, ring_slots, "
                                f"p2p_chunksize)={theirs}, rank {self.rank} with {mine}; every rank needs the same "
                                f"settings")
        self.guard.peers[p] = (pctl, seg.bytes_(REASON_OFF, REASON_MAX), peer_pid(pctl, self.ctl[C_PIDNS]),
                               pctl[C_START])
        if pctl[C_POOL]:            # ring neighbours' for direct slices, everyone's for symmetric kernels
            self._peer_pools[p] = np.frombuffer(seg.bytes_(self._pool_at, pctl[C_POOL]), np.uint8)

    @staticmethod
    def _heartbeat(ref: "weakref.ref[CpuBackend]", stop: threading.Event) -> None:
        """By weak reference: a communicator dropped without close() is freed (its segments unmapped), and this
        thread ends at its next beat."""
        quiet_thread()
        while not stop.wait(HEARTBEAT_S):
            be = ref()
            try:
                be.ctl[C_HEARTBEAT] = time.monotonic_ns()
            except (AttributeError, TypeError, ValueError, IndexError):    # gone, or its view released by close
                return
            del be

    # ---- Backend API ----
    @property
    def rings(self) -> RingViews:
        return self._rings

    def submit(self, work: Work) -> Any:
        if self._closed:
            raise BackendError(f"rank {self.rank}: the cpu backend is closed; create a new communicator")
        if self.guard.aborted():
            raise self._aborted()
        if work.plan.nranks != self.world or work.plan.rank != self.rank:
            raise UsageError(f"plan for rank {work.plan.rank} of {work.plan.nranks} given to rank {self.rank} of "
                             f"{self.world}")
        try:
            if work.plan.func == "send_recv":
                work.parts = part_views(work.parts)
                run_p2p(work, self.p2p_send, self.p2p_recv, self.writers, self.guard)
            else:
                self._collective(work)
        except (PeerError, MismatchError, UsageError):
            self._told = True
            self.publish_stamps()                       # the failed op's slices reach the trace too
            raise
        except BaseException as e:                      # anything else mid-op: the peers must not hang
            self.guard.abort_all(ABORT_PEER, f"rank {self.rank} failed during op {work.tag}: "
                                             f"{type(e).__name__}: {e}")
            self.publish_stamps()
            raise
        self._ntok += 1
        return self._ntok

    def done(self, token: Any) -> bool:
        return True

    def fetch_stamps(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Every op is complete when the drain asks: publish everything staged (lo/hi cover it)."""
        self.publish_stamps()

    def publish_stamps(self) -> None:
        for w in self.writers:
            w.publish()

    def _aborted(self) -> Exception:
        """The abort's error; said again to a caller that heard it (a later op), it says it came earlier, credited to
        no op (the later op is innocent; the first error named the op that heard it)."""
        err, told, self._told = self.guard.abort_error(), self._told, True
        return credit(type(err)(f"rank {self.rank}: communicator aborted earlier: {err}"), None) if told else err

    def wait(self, token: Any, timeout_s: float) -> None:
        if self.guard.aborted():
            raise self._aborted()

    def _pending_messages(self) -> list[str]:
        """Messages a peer posted to this rank that it never received (p2p.pending_messages)."""
        return pending_messages(getattr(self, "p2p_recv", {}))

    def check_peers(self) -> None:
        self.guard.check(tuple(self.guard.peers))

    def symmetric(self, func: str, send: Any, recv: Any) -> bool:
        """Windows on a rank with every peer's pool mapped; at 2 ranks from SYM_MIN bytes (below, the ring's one
        FIFO exchange is quicker than two waits on every rank). The same on every rank that passes windows."""
        if not (self._sym and self.pool.windows and func in SYM_FUNCS):
            return False
        isz = send.dtype.itemsize
        return ((self.world > 2 or max(send.nbytes, recv.nbytes) >= SYM_MIN)
                and self.pool.window(send, isz) >= 0 and self.pool.window(recv, isz) >= 0)

    def direct_slices(self) -> int:     # ring slices this rank sent without its FIFO (registered memory)
        return sum(c.direct for c in self.ring_send)

    def unreceived(self) -> list[str]:
        return getattr(self, "_lost", [])

    def abort(self, reason: str) -> None:
        if not self._closed:
            self.guard.abort_all(ABORT_PEER, reason)

    def _unlink_names(self) -> None:
        """Every rank's segment name, ours and the peers' once each rank attached them all: a peer stopped or
        killed before its own unlink left its name in /dev/shm. Before that, ours only: a peer still attaching
        would find a live rank's segment gone and blame it (a dead one's is _unlink_dead_peers' or on_dead's)."""
        self.seg.unlink()
        for name in getattr(self, "_names", {}).values() if self._all_attached else ():
            unlink_name(name)

    def close(self) -> None:
        if self._closed:
            return
        g = getattr(self, "guard", None)            # absent when set-up failed
        if getattr(self, "ctl", None) is not None:
            self.ctl[C_CLOSED] = 1                  # before looking: a sender posting now sees it, or we its header
        self._lost = [] if g is None or g.aborted() else self._pending_messages()
        unheard = g.abort_error() if g is not None and g.ctl[C_ABORT] == ABORT_MISMATCH and not self._told else None
        self._closed = True
        self._stop.set()
        if getattr(self, "_bound", None) is not None:
            affinity.release(self._bound)
            self._bound = None
        if getattr(self, "_hb", None) is not None:
            self._hb.join(1.0)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        # the numpy views over the segments (FIFO slots, stamp rings): gone, the mappings close now (else a closed
        # communicator the caller keeps, or one a cycle holds, keeps its /dev/shm pages until GC)
        self.writers, self._rings, self.ring_send, self.ring_recv, self.p2p_recv, self.p2p_send = [], None, [], [], {}, {}
        self._unlink_names()            # again: a set-up that failed did not get there
        for seg in self._peer_segs.values():
            seg.close()
        self.seg.close()
        if unheard is not None:         # a message of ours a peer found mismatched after our op returned
            raise unheard

    # ---- collectives ----
    def _collective(self, work: Work) -> None:
        plan = work.plan
        n, count, func = plan.nranks, plan.count, plan.func
        a, b = work.sendbuf, work.recvbuf
        need_in = count * n if func == "reduce_scatter" else count
        need_out = count * n if func == "all_gather" else count
        if a is None or b is None or a.size != need_in or b.size != need_out:
            for buf, need, what in ((a, need_in, "sendbuf"), (b, need_out, "recvbuf")):
                if buf is None or buf.size != need:
                    got = "no buffer" if buf is None else plural(buf.size, "element")
                    raise UsageError(f"{func}: {what} has {got}, the plan needs {need}")
        if n == 1:
            if host_pointer(a) != host_pointer(b) and count:
                np.copyto(b, a[:count])
            return
        self._coll_seq += 1
        key = (id(plan), work.dtype, work.redop)        # plans are cached: one encoding per op kind, not per op
        hit = self._sigs.get(key)
        if hit is None or hit[0] is not plan:
            if len(self._sigs) > 256:
                self._sigs.clear()
            hit = self._sigs[key] = (plan, encode_sig(func, count, work.dtype, work.redop, plan.root, self.nch,
                                                      self.settings.step_bytes, bool(plan.algo)))
        sig = (self._coll_seq,) + hit[1]
        g = self.guard
        g.publish_sig(sig, work.seq_number)
        if plan.algo:
            run_symmetric(self, work, self._parallel)
            g.sig = None
            return
        delta = None
        if np.may_share_memory(a, b):                   # their bounds: cheaper than both addresses when apart
            pa, pb = host_pointer(a), host_pointer(b)
            if pa < pb + b.nbytes and pb < pa + a.nbytes:
                delta = pa - pb
        progs = plan.programs
        stamps = work.stamp_steps or work.stamp_channels
        dx = None
        # registered memory here or at a ring neighbour, and slices that may go direct (count alike on every rank)
        if self._direct and count * a.dtype.itemsize >= worker.DIRECT_MIN:
            isz, pool = a.dtype.itemsize, self.pool
            dx = Direct(self._coll_seq, pool.offset(a, isz), pool.offset(b, isz), pool.size > 0,
                        self._peer_pools.get((self.rank - 1) % n), self._peer_pools.get((self.rank + 1) % n))
        if len(progs) == 1:                             # one channel (the cpu default): no closure per op
            c = progs[0].channel
            run_ring(progs[0], RingJob(work, self.ring_recv[c], self.ring_send[c], self.writers[c] if stamps else
                                       None, g, delta, dx))
        elif progs:
            def job(prog) -> RingJob:
                c = prog.channel
                return RingJob(work, self.ring_recv[c], self.ring_send[c], self.writers[c] if stamps else None, g,
                               delta, dx)
            self._parallel(progs, lambda prog: run_ring(prog, job(prog)))
        g.check_sigs(sig, wait=True)          # every rank ran the same collective (or everyone raises)
        g.sig = None

    def _parallel(self, progs, run) -> None:
        """run(prog) for each program: channel 0 in this thread, the others in the channel threads."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, self.nch - 1), thread_name_prefix="slicetrace-ch",
                                            initializer=_pool_thread)
        run_channels(self._pool, self.guard, self.rank, progs, run)
