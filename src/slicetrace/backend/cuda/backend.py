"""CudaBackend: one process per GPU, one kernel launch per operation on the caller's stream.

`submit` is asynchronous like NCCL: it enqueues the launch and returns a token (a CUDA event);
`wait` (completion.py) polls it against a deadline and turns a stuck, aborted or mismatched launch, or a peer of
the op that has closed or exited, into CommTimeoutError/PeerError/MismatchError, raising the abort words first so the kernel exits and the GPU is
free again.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Any

import numpy as np

from ...config import Settings
from ...errors import BackendError, MismatchError, PeerError, UsageError, credit
from ...rendezvous import Store
from ...stamps.layout import RingViews
from ..base import DTYPES, Backend, P2pLedger, Work, quiet_thread
from ..opsig import SigTable, coll_name
from ..procs import PeerWatch
from . import buffers, clock
from .args import KernelArgs, auto_channels
from .compile import Kernels, arch_of
from .completion import Completion, ends_within
from .ipc import CommMemory, same_settings
from .order import P2pOrder
from .seqs import SeqRanges
from .tokens import Pending, Token
from .watchdog import Watchdog
from .layout import CTYPES, MAX_THREADS

log = logging.getLogger("slicetrace")


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise BackendError(f"backend='cuda' needs CuPy (pip install cupy-cuda13x): {e}") from None
    return cupy


_PER_THREAD = 2         # cudaStreamPerThread: one handle, another stream in each thread


class CudaBackend(Completion, Backend, KernelArgs):
    name = "cuda"
    STORE_KEYS = ("cfg/{r}", "ipc/{r}", "ipc-open/{r}", "sigseg", "sigs/{r}", "proc/{r}", "closed/{r}", "sent/{r}",
                  "close/{r}", "abort")
    reserves_stamps = True      # header.reserved after submit is exactly the end of the op's seqs
    stamps_fetched = True       # the drain reads the rings after fetch_stamps

    def __init__(self, settings: Settings, rank: int, world: int, store: Store, job: str):
        super().__init__(settings, rank, world, store, job)
        cupy = _cupy()
        from cupy.cuda import runtime
        self._rt = runtime
        ndev = runtime.getDeviceCount()
        if ndev < 1:
            raise BackendError("backend='cuda' found no CUDA device")
        cur = runtime.getDevice()
        self.device = cur if cur != 0 else rank % ndev    # a device the caller chose is kept
        cupy.cuda.Device(self.device).use()
        self.max_channels = settings.nchannels or (64 if world <= 4 else 32)
        self.n_warps = settings.nthreads // 32
        gen = self.generation
        self._prefix = self.store_prefix("cuda", gen)
        self._side = self._copy = self._fetch = self._fork = self._join = self._dog = self.sigs = None
        same_settings(store, self._prefix, rank, world, settings.timeout_s, nchannels=self.max_channels,
                      buffsize=settings.buffsize, p2p_chunksize=settings.p2p_chunk_bytes)
        # connections: max_channels for the rings, as many again for send/recv (args.P2P_CONN), so a send that
        # fits the FIFO and a collective can be issued in either order at the two ends
        self.mem = CommMemory(rank, world, 2 * self.max_channels, settings.buffsize, self.max_channels,
                              settings.ring_slots, store, self._prefix, settings.timeout_s)   # frees on failure
        try:
            self._setup(settings, rank, world, store)
        except BaseException:               # e.g. a peer that never arrives: free what was made, then raise
            self._free()
            raise

    def _setup(self, settings: Settings, rank: int, world: int, store: Store) -> None:
        runtime = self._rt
        self.kernels = Kernels(settings.cache_dir, arch_of(self.device))
        self._extra: dict[str, str] = {}                  # measurement variants (scripts/bench_cuda.py --variants)
        self.seqs = SeqRanges(self.mem.rings)             # stamp seqs, reserved per program at submit
        self._side = runtime.streamCreateWithFlags(1)     # non-blocking: clock probe and abort DMA
        self._copy = runtime.streamCreateWithFlags(1)     # self copies of a group, beside its kernel
        self._fetch = runtime.streamCreateWithFlags(1)    # stamp records to the host (drain thread)
        self._fork = runtime.eventCreateWithFlags(2)      # cudaEventDisableTiming
        self._join = runtime.eventCreateWithFlags(2)
        self._cache: dict[tuple, tuple[Any, np.ndarray, Any, int, int]] = {}
        self._fns: dict[tuple[str, bool], int] = {}
        self._broken: str | None = None
        self._broken_as: type = PeerError
        self._broken_op: tuple[str, int] | None = None   # the op the abort belongs to (Completion.abort)
        self._told = False                              # the abort's error reached the caller
        self._closed = False
        self._lost: list[str] = []                      # sends to this rank it never received (close)
        self.ledger = P2pLedger()
        self._last: Token | None = None
        self._pending = Pending()                       # launched ops not seen done yet, in issue order
        self._clock: tuple[int, int] = (0, 1 << 62)
        self._probe_busy = False
        self._all = tuple(p for p in range(world) if p != rank)
        self.order: P2pOrder | None = None
        if world > 1:                     # what every rank says each collective is: a mismatch raises, never mixes
            self.sigs = SigTable.open(store, self._prefix, self.job, rank, world, settings.timeout_s,
                                      extra=P2pOrder.nbytes(world))
            store.barrier(f"{self._prefix}/sigs", rank, world, settings.timeout_s)
            self.sigs.attached()
            self.order = P2pOrder(self.sigs, rank, world)   # and the messages issued around each collective
        self.watch = PeerWatch(store, self._prefix, rank)
        self.watch.publish()
        self._dog = Watchdog(self)

    def describe(self) -> str:
        s = self.settings
        chans = s.nchannels or f"auto, up to {self.max_channels}"
        return (f"device {self.device} ({arch_of(self.device)}), channels {chans}, {s.nthreads} threads per channel, "
                f"FIFO {s.buffsize} B in 8 steps, {s.ring_slots} stamp slots per ring, p2p chunk {s.p2p_chunk_bytes} "
                f"B, kernel cache {s.cache_dir}")

    # ---- buffers ----
    @property
    def rings(self) -> RingViews:
        return self.mem.rings

    def as_buffer(self, x: Any, what: str) -> tuple[Any, str, int]:
        return buffers.as_buffer(x, what, self.device)

    def empty_like(self, buf: Any, count: int) -> Any:
        return buffers.empty_like(buf, count)

    def user_buffer(self, buf: Any, like: Any = None) -> Any:
        return buffers.user_buffer(buf)

    def byte_view(self, buf: Any) -> Any:
        return buf              # parts are addressed by pointer + offset x the plan's itemsize (1: bytes)

    def channels_for(self, nbytes: int) -> int:
        """Channel count this backend would pick for an op of nbytes (settings.nchannels wins)."""
        return self.settings.nchannels or auto_channels(nbytes, self.max_channels)

    def p2p_channels(self) -> int:
        return self.max_channels

    def enter_call(self) -> int | None:
        # As NCCL does: an op runs on the communicator's device whatever the calling thread's current device is
        # (a thread that never chose one is on device 0), and the caller's is restored after it.
        cur = self._rt.getDevice()
        if cur == self.device:
            return None
        self._rt.setDevice(self.device)
        return cur

    def exit_call(self, prev: int | None) -> None:
        if prev is not None:
            self._rt.setDevice(prev)

    def thread_init(self) -> None:
        # A new thread's current device is 0: its first runtime call (an event query) would create a context on
        # GPU 0 in every other rank's process (~200 ms once, ~500 MiB of GPU 0 each). Ours first.
        self._rt.setDevice(self.device)
        buffers.capture_mode_thread_local()
        quiet_thread()

    def fetch_stamps(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Bring seqs lo[c]+1..hi[c] of every channel (all of completed ops) into the host mirror."""
        self.mem.fetch(lo, hi, self.device, self._fetch, self.settings.timeout_s)

    # ---- kernels ----
    def prepare(self, dtypes: tuple[str, ...] = DTYPES, steps: tuple[bool, ...] = (False, True)) -> None:
        """Compile (or load from the cache) every kernel variant these dtypes need, in parallel."""
        jobs = [("slicetrace.cu", self._defines(d, s)) for d in dtypes for s in steps]
        self.kernels.prepare(jobs + [("clock.cu", {})])
        for d in dtypes:
            for s in steps:
                self._fn(d, s)

    # ---- submit ----
    def submit(self, work: Work) -> Token:
        if self._closed:
            raise UsageError("the cuda backend is closed")
        if self._broken is not None:    # an earlier op's failure (or none's): not this op's
            self._told = True
            raise credit(self._broken_as(f"rank {self.rank}: communicator aborted earlier: {self._broken}"),
                         self._broken_op)
        if self.mem.words[1]:           # a kernel of ours exited on a peer's abort: the next would start from stale steps
            self._fail(self._mismatch(self._last) or PeerError(self.cannot_finish(self._last) or "aborted"),
                       self._last)  # a mismatch a peer found first is ours too (as wait() says it)
        if work.dtype not in CTYPES:
            raise UsageError(f"dtype={work.dtype!r} is not one of {DTYPES}")
        stream = buffers.stream_ptr(work.stream, self.device)
        buffers.refuse_capture(self._rt, stream)
        last = self._last
        if last is not None and (last.stream != stream or stream == _PER_THREAD) and not last.event.done:
            # one communicator's ops run in issue order whatever their streams (NCCL serialises its launches
            # too): each kernel takes up the FIFO step counters where the previous one left them
            self._rt.streamWaitEvent(stream, last.event.ptr, 0)
        plan = work.plan
        sig = None if self.sigs is None or plan.func == "send_recv" else \
            self.sigs.number(plan, work.dtype, work.redop, self.settings.step_bytes)   # before the launch
        try:
            if sig is not None:
                self.order.numbered(sig[0])     # with the messages issued before it
            return self._launch(work, stream, sig)
        except BaseException as e:      # numbered but not launched: the peers' kernels would pair off by one
            if sig is not None:
                self.abort(f"rank {self.rank}: {coll_name(sig, work.seq_number)} failed before its launch: "
                           f"{type(e).__name__}: {e}", op=(plan.func, work.seq_number))
            raise

    def _launch(self, work: Work, stream: int, sig: tuple | None) -> Token:
        plan = work.plan
        joined = False
        if plan.programs:               # a group refused here has run nothing, its self copies included
            rec, params, fn, nb, nt = self._record(work)
        if plan.func == "send_recv":
            joined = buffers.enqueue_self_copies(self._rt, work, stream, bool(plan.programs), self._copy, self._fork,
                                                 self._join)
        elif not plan.programs:
            buffers.local_copy(self._rt, work, stream)
        if plan.programs:
            u32 = rec.view(np.uint32)
            u32[22] = work.tag & 0xFFFFFFFF                              # op_tag
            u32[23] = 1 if work.stamp_channels else 0                    # stamp_ch
            u32[21] = max(1, int(work.sample_rate))                      # sample_rate
            if work.stamp_steps or work.stamp_channels:
                self.seqs.reserve(work, rec)
            from cupy.cuda import driver
            driver.launchKernel(fn if not work.stamp_steps else self._fn(work.dtype, True), nb, 1, 1, nt, 1, 1,
                                0, stream, ctypes.addressof(params), 0)
        if plan.func == "send_recv":    # counted once enqueued: an error past here leaves no message uncounted
            self.ledger.count(work, self.rank)
            if self.order is not None:
                self.order.count(work)
        if joined:
            self._rt.streamWaitEvent(stream, self._join, 0)
        ev = _cupy().cuda.Event(block=False, disable_timing=True, interprocess=False)
        self._rt.eventRecord(ev.ptr, stream)
        peers = self._all if plan.func != "send_recv" else tuple({p.peer for p, _ in work.parts} - {self.rank})
        self._last = Token(ev, work.tag, peers, stream, sig, (plan.func, work.seq_number))
        self._pending.add(self._last)   # ops run in issue order: one waits for every earlier op's peers too
        return self._last


    def _maxt(self) -> int:             # the kernel's launch bounds; a measurement variant may lower them
        return int(self._extra.get("ST_MAX_THREADS", MAX_THREADS))

    # ---- clocks ----
    def clock_sync(self) -> tuple[int, int]:
        if self._probe_busy and self._rt.streamQuery(self._side) != 0:
            return self._clock[0], self._clock[1] * 2
        fn = self.kernels.function("clock.cu", "st_clock", {}, self.settings.assert_warm)
        r = clock.measure(fn, self.mem.probe, self.mem.probe_ptr, self._side)
        self._probe_busy = r is None
        if r is not None:
            self._clock = r
        return self._clock

    def keep_rings(self) -> None:
        self.mem.keep_rings()           # and _free keeps the fetch stream that poll may still use

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._last is not None and self._broken is None:
            try:
                self.wait(self._last, self.settings.timeout_s)     # it may queue behind long work: no less
            except Exception as e:          # an op never synchronized: say so, then free everything
                log.warning("rank %d: its last op failed before close: %s", self.rank, e)
                self._told = False          # raised inside close: the caller has not heard it
        if self._broken is not None:
            self.abort(self._broken)        # a kernel still queued exits at its first wait: free nothing under it
            if self._last is not None and not ends_within(self._last.event, min(self.settings.timeout_s, 10.0)):
                log.warning("rank %d: its last kernel has not run yet (queued behind other work): its memory is "
                            "kept, not freed under it", self.rank)
                self.mem.leak()
        try:                                # every op of ours ended: what we sent, then that we closed
            if self._broken is None:
                self.ledger.publish(self.store, f"{self._prefix}/sent/{self.rank}",
                                    0 if self.sigs is None else self.sigs.seq)
            self.watch.closed()             # a peer still waiting for us raises now rather than at its timeout
        except Exception:
            pass
        try:
            self._rt.streamSynchronize(self._side)
        except Exception:
            pass
        failed = None
        try:
            self.store.barrier(f"{self._prefix}/close", self.rank, self.world,     # a dead peer ends it at once
                               5.0 if self._broken else self.settings.timeout_s,
                               check=lambda: self.check_peers(closing=True))
        except Exception as e:
            failed = e
        unheard = (self._broken_as, self._broken, self._broken_op) if self._broken is not None and not self._told \
            else None
        if self._broken is None:            # met: every collective every rank ran is in the table now; not met
            mism = self.mismatch()          # (a peer that found a mismatch first aborted): its row is there too
            if failed is None:              # every rank's ops have ended and its sends are published
                try:
                    keys = {p: f"{self._prefix}/sent/{p}" for p in self._all}
                    self._lost = self.ledger.lost(self.store, keys, self.rank, 5.0)
                    mism = mism or "; ".join(self.ledger.mismatched) or None
                except Exception as e:      # a diagnostic: closing goes on
                    log.warning("rank %d: could not check for unreceived messages at close: %s", self.rank, e)
            unheard = None if mism is None else (MismatchError, mism, None)
            if failed is not None and mism is None:
                log.warning("rank %d: the close barrier failed (unreceived messages not checked): %s", self.rank,
                            failed)
        self._cache.clear()
        self._free()
        if unheard is not None:     # an op the watchdog aborted (its results are wrong), or one that ended before
            kind, why, op = unheard     # its peer said what it ran: the caller never heard it
            raise credit(kind(f"rank {self.rank}: found at close: {why}"), op)

    def _free(self) -> None:
        """Device memory, streams and events (also of a set-up that failed part way)."""
        if self._dog is not None:
            self._dog.stop()
        if self.sigs is not None:
            self.sigs.close()
        self.mem.close()
        for destroy, h in ((self._rt.streamDestroy, self._side), (self._rt.streamDestroy, self._copy),
                           (self._rt.streamDestroy, None if self.mem.kept else self._fetch),
                           (self._rt.eventDestroy, self._fork), (self._rt.eventDestroy, self._join)):
            try:
                if h is not None:
                    destroy(h)
            except Exception:
                pass
