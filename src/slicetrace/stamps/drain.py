"""Drain thread: stamp rings -> paired KernelStep/KernelCh record batches, with every loss counted.

Reads each channel in seq order (one cursor per channel, the same rule the writers use to reserve), so host
and device can never disagree on which op a stamp belongs to: every stamp carries its op tag. Imports only
stamps.layout; the consumer is anything with channel/steps/end_op/drop (the event host).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Protocol

import numpy as np

from .layout import KIND_CHANNEL, KIND_STEP, PAIRED_DTYPE, RingViews

LOST_LAG = 4096        # a start this far behind the newest reservation without its completion is lost


class Consumer(Protocol):
    def channel(self, tag: int, recs: np.ndarray) -> None: ...
    def steps(self, tag: int, recs: np.ndarray) -> None: ...
    def end_op(self, tag: int, ts_ns: int) -> None: ...
    def drop(self, reason: str, n: int = 1) -> None: ...


class Drain:
    def __init__(self, views: RingViews, consumer: Consumer, interval_us: int = 500,
                 clock: Callable[[], int] = time.monotonic_ns):
        self.views, self.consumer = views, consumer
        self.nch, self.slots = views.nchannels, views.slots
        self.cursor = np.zeros(self.nch, dtype=np.uint64)       # last consumed seq per channel
        self._sampled = np.zeros(self.nch, dtype=np.uint64)
        self.offset_ns = 0                                      # host_ns = device_ns + offset_ns
        self.interval = interval_us / 1e6
        self._clock = clock
        self._tags: dict[int, int] = {}                         # op low 32 bits -> full tag
        self._pending: deque = deque()                          # (tag, done_fn) in submit order
        self._ending: deque = deque()                           # (tag, reserved snapshot)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.delivered = 0

    # ---- called by the session (user thread) ----
    def op_submitted(self, tag: int, done_fn: Callable[[], bool]) -> None:
        with self._lock:
            self._tags[tag & 0xFFFFFFFF] = tag
            self._pending.append((tag, done_fn))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slicetrace-drain", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        with self._lock:
            return not self._pending and not self._ending

    def flush(self, timeout_s: float) -> bool:
        """Drain until every submitted op has ended; False if that took longer than timeout_s."""
        deadline = time.monotonic() + timeout_s
        while not self.idle():
            if self._thread is None or not self._thread.is_alive():
                self.poll_once()
            else:
                self._wake.set()
                time.sleep(self.interval / 4)
            if time.monotonic() > deadline:
                return False
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.poll_once()

    # ---- drain thread ----
    def _run(self) -> None:
        while not self._stop:
            try:
                n = self.poll_once()
            except BaseException as e:    # never kill the process from the drain thread; report at close
                self.error = e
                return
            if n == 0:
                self._wake.wait(self.interval)
                self._wake.clear()

    def poll_once(self) -> int:
        with self._lock:
            while self._pending and self._pending[0][1]():
                tag, _ = self._pending.popleft()
                self._ending.append((tag, self.views.header["reserved"].copy()))
            ending = list(self._ending)
        n = 0
        final = ending[-1][1] if ending else None
        for ch in range(self.nch):
            n += self._drain_channel(ch, None if final is None else int(final[ch]))
        sampled = self.views.header["sampled_out"].copy()
        d = int((sampled - self._sampled).sum())
        if d:
            self._sampled = sampled
            self.consumer.drop("sampled_out", d)
        now = self._clock()
        while ending and bool(np.all(self.cursor >= ending[0][1])):
            tag, _ = ending.pop(0)
            with self._lock:
                self._ending.popleft()
                self._tags.pop(tag & 0xFFFFFFFF, None)
            self.consumer.end_op(tag, now)
            n += 1
        return n

    def _drain_channel(self, ch: int, finished_upto: int | None) -> int:
        N = self.slots
        hdr = self.views.header
        cur = int(self.cursor[ch])
        top = int(hdr["reserved"][ch])
        if top <= cur:
            return 0
        if top - cur > N:                           # lapped: the oldest entries are gone
            lost = top - cur - N
            self.consumer.drop("overrun", lost)
            cur += lost
        seqs = np.arange(cur + 1, top + 1, dtype=np.uint64)
        idx = (seqs & np.uint64(N - 1)).astype(np.intp)
        st = self.views.started[ch][idx]            # fancy indexing copies
        co = self.views.completed[ch][idx]
        top2 = int(hdr["reserved"][ch])             # read after the copy: is any slot being reused?
        intact = seqs + np.uint64(N) > np.uint64(top2)
        ok = (st["seq"] == seqs) & (co["seq"] == seqs) & intact
        lapped = ~intact
        # consume in order up to the first entry that is neither complete nor lost
        stuck = ~(ok | lapped)
        if stuck.any():
            k = int(np.argmax(stuck))
            # lost for good: its op has ended (everything is visible by then) or far behind the writer
            limit = k
            while limit < len(seqs) and stuck[limit] and (
                    (finished_upto is not None and int(seqs[limit]) <= finished_upto)
                    or top2 - int(seqs[limit]) > LOST_LAG):
                limit += 1
            unpaired = int(stuck[k:limit].sum())
            if unpaired:
                self.consumer.drop("unpaired", unpaired)
            # everything before `limit` is decided; stop at the next undecided entry
            rest = stuck[limit:]
            end = limit + (int(np.argmax(rest)) if rest.any() else len(rest))
        else:
            end = len(seqs)
        if end == 0:
            return 0
        take = ok[:end]
        n_lapped = int(lapped[:end].sum())
        if n_lapped:
            self.consumer.drop("overrun", n_lapped)
        st, co = st[:end][take], co[:end][take]
        same = ((st["op"] == co["op"]) & (st["step"] == co["step"]) & (st["kind"] == co["kind"])
                & (st["flags"] == co["flags"]))
        if not same.all():
            self.consumer.drop("unpaired", int((~same).sum()))
            st, co = st[same], co[same]
        self.cursor[ch] = seqs[end - 1]
        if len(st):
            self._deliver(ch, st, co)
        return end

    def _deliver(self, ch: int, st: np.ndarray, co: np.ndarray) -> None:
        out = np.empty(len(st), dtype=PAIRED_DTYPE)
        for f in ("op", "kind", "flags", "peer", "step", "size", "wait", "ready"):
            out[f] = st[f]
        out["channel"] = ch
        out["done"] = co["done"]
        off = np.int64(self.offset_ns)
        for f in ("wait", "ready", "done"):
            out[f + "_ns"] = out[f].astype(np.int64) + off
        # runs of equal op (and kind) keep per-channel seq order
        key = out["op"].astype(np.int64) * 2 + out["kind"]
        cuts = np.flatnonzero(np.diff(key)) + 1
        for run in np.split(out, cuts):
            low = int(run["op"][0])
            with self._lock:
                tag = self._tags.get(low)
            if tag is None:
                self.consumer.drop("no_parent", len(run))
                continue
            self.delivered += len(run)
            if run["kind"][0] == KIND_CHANNEL:
                self.consumer.channel(tag, run)
            elif run["kind"][0] == KIND_STEP:
                self.consumer.steps(tag, run)
            else:
                self.consumer.drop("unpaired", len(run))
