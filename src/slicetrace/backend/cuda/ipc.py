"""Device memory of one communicator: FIFOs, tails, heads (one cudaMalloc, shared through CUDA IPC),
step counters (device, persistent across launches), the stamp rings (device memory, with their headers and a
pinned mirror on the host, filled by `fetch`), and mapped host memory for the abort flag and the clock probe.

Handles travel through the rendezvous store; every rank opens every peer's allocation (the ring is
rank order, p2p may reach any peer, so nothing assumes 2 ranks).
"""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np

from ...errors import BackendError, CommTimeoutError, MismatchError, UsageError
from ...rendezvous import Store
from ...stamps.layout import HEADER_DTYPE, STAMP_DTYPE, RingViews, ring_bytes
from .layout import COMM_DTYPE, CTRL, MAXRANKS, ipc_layout, peer_slot
from .seqs import copy_regions, copy_windows

_MAPPED = 3          # cudaHostAllocPortable | cudaHostAllocMapped


def host_array(ptr: int, nbytes: int) -> np.ndarray:
    """A uint8 numpy view over pinned host memory (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


def same_settings(store: Store, prefix: str, rank: int, world: int, timeout_s: float, **mine: int) -> None:
    """Every rank lays out its peers' FIFOs and cuts messages into steps with its own settings: refuse, on every
    rank, ranks whose settings differ (each kernel would read another offset than its peer wrote)."""
    store.set(f"{prefix}/cfg/{rank}", repr(sorted(mine.items())).encode())
    for p in range(world):
        if p != rank:
            theirs = store.get(f"{prefix}/cfg/{p}", timeout_s, what=f"rank {p}'s cuda settings").decode()
            if theirs != repr(sorted(mine.items())):
                raise MismatchError(f"rank {p} runs the cuda backend with {theirs}, rank {rank} with "
                                    f"{sorted(mine.items())}; every rank needs the same settings")


class CommMemory:
    def __init__(self, rank: int, world: int, nconn: int, buffsize: int, nring: int, slots: int,
                 store: Store, prefix: str, timeout_s: float):
        from cupy.cuda import runtime
        if world > MAXRANKS:
            raise BackendError(f"world={world} is more than the cuda backend's {MAXRANKS} ranks")
        self.rank, self.world, self.nconn, self.buffsize = rank, world, nconn, buffsize
        self._rt = runtime
        self._opened: list[int] = []
        self._dev: list[int] = []
        self._host: list[int] = []
        self.kept = False                   # keep_rings: the ring, its mirror and the fetch stream outlive close
        self._ctrl_lock = threading.Lock()  # the watchdog's abort writes `words` while close may free them
        self.rings = self.ring_mem = self.ctrl = self.words = self.probe = None
        try:
            self._make(rank, world, nconn, buffsize, nring, slots, store, prefix, timeout_s)
        except BaseException:           # e.g. a peer that never sent its handle: free what was made, then raise
            self.close()
            raise

    def _make(self, rank: int, world: int, nconn: int, buffsize: int, nring: int, slots: int, store: Store,
              prefix: str, timeout_s: float) -> None:
        runtime = self._rt
        self.fifo_off, total = ipc_layout(world, nconn, buffsize)
        self.base = self._malloc(total)                  # its own allocation: an IPC handle names all of it
        runtime.memset(self.base, 0, total)
        nk = nconn * max(1, world - 1)
        self.send_step = self._malloc(nk * 8)
        self.recv_step = self._malloc(nk * 8)
        for p, n in ((self.send_step, nk * 8), (self.recv_step, nk * 8)):
            runtime.memset(p, 0, n)
        # stamp ring: the kernels write whole entries in device memory, a row per channel; the host keeps the
        # headers and a pinned mirror (a merged RingViews), which the drain reads after a fetch
        self.nring, self.slots = nring, slots
        nb = ring_bytes(nring, slots, merged=True)
        self.ring_ptr = self._host_alloc(nb)
        self.ring_mem = host_array(self.ring_ptr, nb)
        self.ring_mem[:] = 0
        self.rings = RingViews(self.ring_mem, nring, slots, merged=True)
        self._mirror = self.ring_ptr + nring * HEADER_DTYPE.itemsize
        self.dring = self._malloc(nring * slots * STAMP_DTYPE.itemsize)
        runtime.memset(self.dring, 0, nring * slots * STAMP_DTYPE.itemsize)
        # control words (abort, status, one, clock probe): mapped host memory
        self.ctrl_ptr = self._host_alloc(4096)
        self.ctrl = host_array(self.ctrl_ptr, 4096)
        self.ctrl[:] = 0
        self.words = self.ctrl[:64].view(np.uint32)      # [0] abort, [1] status, [2] constant 1
        self.words[2] = 1
        self.probe = self.ctrl[256:512].view(np.uint64)  # clock probe: go, ack, timer, running
        self.probe_ptr = self.ctrl_ptr + 256
        # exchange IPC handles, then open every peer's allocation
        mine = bytes(runtime.ipcGetMemHandle(self.base))
        if store.claim(f"{prefix}/ipc/{rank}", mine) != mine:
            raise UsageError(f"rank {rank} of {prefix!r} was joined by another process first (two communicators over "
                             f"one store share a job string); pass each communicator a job= of its own")
        self.peer_base = [0] * world
        self.peer_base[rank] = self.base
        for p in range(world):
            if p != rank:
                h = store.get(f"{prefix}/ipc/{p}", timeout_s, what=f"rank {p}'s CUDA IPC handle")
                try:
                    self.peer_base[p] = runtime.ipcOpenMemHandle(h)
                except Exception as e:
                    raise BackendError(f"rank {rank} could not open rank {p}'s CUDA IPC memory: {e}") from e
                self._opened.append(self.peer_base[p])
        store.barrier(f"{prefix}/ipc-open", rank, world, timeout_s)
        self.comm_ptr = self._write_comm()

    def _malloc(self, n: int) -> int:
        p = self._rt.malloc(max(n, 256))
        self._dev.append(p)
        return p

    def _host_alloc(self, n: int) -> int:
        p = self._rt.hostAlloc(n, _MAPPED)
        self._host.append(p)
        return p

    def _write_comm(self) -> int:
        c = np.zeros(1, dtype=COMM_DTYPE)
        c["peer_base"][0, :self.world] = self.peer_base
        c["send_step"], c["recv_step"] = self.send_step, self.recv_step
        c["ring"] = self.dring
        c["abort_host"] = self.ctrl_ptr
        c["status_host"] = self.ctrl_ptr + 4
        c["fifo_off"], c["buffsize"] = self.fifo_off, self.buffsize
        c["world"], c["rank"], c["nconn"], c["slots"] = self.world, self.rank, self.nconn, self.slots
        ptr = self._malloc(COMM_DTYPE.itemsize)
        self._rt.memcpy(ptr, c.ctypes.data, COMM_DTYPE.itemsize, 1)       # cudaMemcpyHostToDevice
        return ptr

    def fetch(self, lo: np.ndarray, hi: np.ndarray, device: int, stream: int, timeout_s: float) -> None:
        """Copy seqs lo[c]+1..hi[c] of every channel from the device rings into the host mirror, and wait."""
        w = copy_windows(lo, hi, self.slots)
        if not w:
            return
        rt = self._rt
        prev = rt.getDevice()                # the drain thread selected ours (thread_init); a flushing user thread may be
        if prev != device:                   # on another device: copy and query on this rank's, then put it back
            rt.setDevice(device)
        try:
            for off, pitch, width, height in copy_regions(w, self.slots):
                rt.memcpy2DAsync(self._mirror + off, pitch, self.dring + off, pitch, width, height, 2, stream)
            if not self._copied(stream, timeout_s, 2e-6):
                raise CommTimeoutError(f"rank {self.rank}: copying stamp records to the host took longer "
                                       f"than timeout_s={timeout_s}")
        finally:
            if prev != device:
                rt.setDevice(prev)

    def _copied(self, stream: int, timeout_s: float, pause_s: float) -> bool:
        """Wait for the copies queued on `stream`; False if they took longer than timeout_s."""
        deadline = time.monotonic() + timeout_s
        while self._rt.streamQuery(stream) != 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(pause_s)
        return True

    def raise_peer_aborts(self, stream: int) -> None:
        """Write 1 into every peer's abort word (DMA on a side stream: works while kernels spin)."""
        for p, base in enumerate(self.peer_base):
            if p != self.rank and base:
                self._rt.memcpyAsync(base, self.ctrl_ptr + 8, 4, 1, stream)
        self._rt.memcpyAsync(self.base, self.ctrl_ptr + 8, 4, 1, stream)

    def progress(self, stream: int, timeout_s: float = 1.0) -> str:
        """Where every connection stands, from the tail and head words at both ends (DMA on a side stream: works
        while kernels spin), for the error of an op that did not finish: per channel and peer, the steps the
        sender posted and the receiver consumed. Never raises."""
        try:
            w, me, nk = self.world, self.rank, self.nconn * (self.world - 1)
            n = CTRL + 2 * nk * 128
            words = {p: np.zeros(n // 8, np.uint64) for p, base in enumerate(self.peer_base) if base}
            for p, buf in words.items():
                self._rt.memcpyAsync(buf.ctypes.data, self.peer_base[p], n, 2, stream)
            if not self._copied(stream, timeout_s, 1e-4):
                return "(connection progress unavailable: the copies did not finish)"
            tail = lambda p, k: int(words[p][(CTRL + k * 128) // 8])            # noqa: E731
            head = lambda p, k: int(words[p][(CTRL + (nk + k) * 128) // 8])     # noqa: E731
            rows: dict[tuple, list[int]] = {}
            for c in range(self.nconn):
                for p in range(w):
                    if p == me or p not in words:
                        continue
                    kl, kr = c * (w - 1) + peer_slot(me, p, w), c * (w - 1) + peer_slot(p, me, w)
                    st = (tail(me, kl), head(p, kr), tail(p, kr), head(me, kl))
                    if any(st):
                        rows.setdefault((p,) + st, []).append(c)
            if not rows:
                return "no connection of this rank has moved yet"
            lines = [f"channels {_spans(ch)}: from rank {p} posted {a} consumed {b}, to rank {p} posted {c} "
                     f"consumed {d}" for (p, a, b, c, d), ch in sorted(rows.items(), key=lambda kv: kv[1][0])]
            more = f"; and {len(lines) - 8} more" if len(lines) > 8 else ""
            return "connection steps: " + "; ".join(lines[:8]) + more
        except Exception as e:                # a diagnostic: never hide the error it is attached to
            return f"(connection progress unavailable: {type(e).__name__}: {e})"

    def raise_abort(self, stream: int) -> bool:
        """Raise this rank's abort word and every peer's; False once closed (the words are freed)."""
        if not self._ctrl_lock.acquire(timeout=5.0):
            return False                    # close holds it: the memory goes now
        try:
            if self.words is None:
                return False
            self.words[0] = 1
            try:
                self.raise_peer_aborts(stream)
            except Exception:  # noqa: BLE001 - the abort word above is set; the peers also see the store key
                pass
            return True
        finally:
            self._ctrl_lock.release()

    def keep_rings(self) -> None:
        """A drain poll still runs: leak the device ring and its pinned mirror rather than free them under it."""
        self.kept = True
        self._dev = [p for p in self._dev if p != self.dring]
        self._host = [p for p in self._host if p != self.ring_ptr]

    def leak(self) -> None:
        """A kernel may still run on our memory and the peers' (queued behind work): close frees and unmaps none."""
        self._opened, self._dev, self._host, self.kept = [], [], [], True

    def close(self) -> None:
        # an abort in flight (watchdog thread) finishes its writes first; bounded: it only enqueues copies
        locked = self._ctrl_lock.acquire(timeout=5.0)
        try:
            self._close(locked)
        finally:
            if locked:
                self._ctrl_lock.release()

    def _close(self, locked: bool) -> None:
        rt = self._rt
        for p in self._opened:
            try:
                rt.ipcCloseMemHandle(p)
            except Exception:
                pass
        self._opened = []
        for p in self._dev:
            try:
                rt.free(p)
            except Exception:
                pass
        self._dev = []
        self.rings = None
        self.ring_mem = self.ctrl = self.words = self.probe = None
        if not locked:                      # an abort still writes the control words: leak them, not crash
            self._host = [p for p in self._host if p != getattr(self, "ctrl_ptr", None)]
        for p in self._host:
            try:
                rt.freeHost(p)
            except Exception:
                pass
        self._host = []


def _spans(chans: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, a = [], chans[0]
    for x, y in zip(chans, chans[1:] + [None]):
        if y != x + 1:
            out.append(f"{a}-{x}" if x > a else f"{a}")
            a = y
    return ",".join(out)
