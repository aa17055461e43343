"""Drain thread: stamp rings -> paired KernelStep/KernelCh record batches, with every loss counted.

Reads each channel in seq order (one cursor per channel, the same rule the writers use to reserve), so host
and device can never disagree on which op a stamp belongs to: every stamp carries its op tag.
KernelCh start and stop are separate records (stamps.layout); the drain keeps open starts aside and delivers
one paired KernelCh record at the stop, which in seq order comes after every KernelStep of its program.
Imports errors, stamps.layout, .batches, .ctrl, .pairing, .scratch, .waits; its consumer has channel/steps/end_op/
drop (the event host), and may have proxy_ctrl/proxy_ctrl_on (.ctrl: the drain's ProxyCtrl states).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

import numpy as np

from ..errors import CommTimeoutError
from .batches import op_runs
from .ctrl import Ctrl
from .layout import KIND_CHANNEL, SEQ_PROVISIONAL, RingViews, member, published
from .pairing import after_lap
from .scratch import Scratch
from .waits import MAX_INTERVAL_S, flush, stuck_in

LOST_LAG = 4096        # an entry this far behind the newest reservation, still incomplete once no op runs, is lost
_PROV, _LO32, _LO31 = np.uint64(SEQ_PROVISIONAL), np.uint64(0xFFFFFFFF), np.uint64(0x7FFFFFFF)


class Consumer(Protocol):
    def channel(self, tag: int, recs: np.ndarray) -> None: ...
    def steps(self, tag: int, recs: np.ndarray) -> None: ...
    def end_op(self, tag: int, ts_ns: int) -> None: ...
    def drop(self, reason: str, n: int = 1) -> None: ...


class _Op:
    __slots__ = ("tag", "done_fn", "snapshot", "done", "exact", "ch", "uniq")

    def __init__(self, tag: int, ch: bool = False, uniq: bool = False):
        self.tag, self.done_fn, self.snapshot, self.done, self.exact, self.ch, self.uniq = tag, None, None, False, \
            False, ch, uniq


class Drain:
    def __init__(self, views: RingViews, consumer: Consumer, interval_us: int = 500,
                 clock: Callable[[], int] = time.monotonic_ns,
                 fetch: Callable[[np.ndarray, np.ndarray], None] | None = None,
                 thread_init: Callable[[], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None):
        """fetch(lo, hi): for rings written in device memory, bring seqs lo[c]+1..hi[c] (all of completed ops)
        into `views` before they are read; the session passes it for such backends (with exact snapshots)."""
        self.views, self.consumer = views, consumer
        self.nch, self.slots = views.nchannels, views.slots
        self.cursor = np.zeros(self.nch, dtype=np.uint64)       # last consumed seq per channel
        self._cut = np.zeros(self.nch, dtype=bool)      # cursor moved past lapped entries (pairing.after_lap)
        self._any_cut = False                           # _cut.any(), without a numpy call per read
        self._fetch, self._sampled = fetch, 0
        self._thread_init = thread_init       # run first in the drain thread (cuda: select this rank's device)
        self._on_error = on_error or (lambda e: None)     # in the drain thread when an error ends it
        self._fetched = np.zeros(self.nch, dtype=np.int64)      # seqs up to here are in views (fetch only)
        self._hdr = views.header.view(np.uint64).reshape(self.nch, 8)          # [reserved, sampled_out, pad]
        self._st = views.started.view(np.uint64).reshape(self.nch, self.slots, 6)
        self._co = views.completed.view(np.uint64).reshape(self.nch, self.slots, 6)
        self._merged = views.completed is views.started         # one ring read as both: gather and check once
        self.offset_ns = 0                                      # host_ns = device_ns + offset_ns
        self.interval, self._clock = interval_us / 1e6, clock
        self._ops: dict[int, _Op] = {}                          # op low 32 bits -> op, in submit order
        self._open: dict[tuple[int, int, int, int], int] = {}   # (ch, op, peer, send) -> KernelCh start clock
        self._lock = threading.Lock()          # guards _ops (user thread vs drain thread)
        self._poll_lock = threading.Lock()     # one poller at a time (drain thread, or a flushing caller)
        self._wake, self._stop = threading.Event(), False
        self._thread: threading.Thread | None = None      # kept after stop: `alive` tells whether it still runs
        self.error: BaseException | None = None
        self.settled = False                    # stop's final poll ran: every record delivered or counted
        self.delivered, self.rows_read = 0, 0   # rows_read: ring entries gathered (the drain's own cost)
        self._scratch = Scratch()
        self._ctl = Ctrl(consumer, clock)
        self._end_ops = getattr(consumer, "end_ops", None) or (lambda tags, ts: [consumer.end_op(t, ts) for t in tags])

    # ---- called by the session (user thread) ----
    def expect(self, tag: int, channels: bool = False, unique_keys: bool = False) -> None:
        """Before submit: stamps of `tag` may appear from now on; channels: its programs stamp KernelCh records;
        unique_keys: no two of its programs on one channel share a KernelCh key (peer, direction), so a stop read
        after a lap is the held start's own (pairing.after_lap; else that program is dropped, counted)."""
        with self._lock:
            self._ops[tag & 0xFFFFFFFF] = _Op(tag, channels, unique_keys)

    def op_submitted(self, tag: int, done_fn: Callable[[], bool], snapshot: np.ndarray | None = None) -> None:
        """After submit: done_fn() tells when the op finished; snapshot = header.reserved once every seq of the
        op is reserved and none of a later op is, when the backend knows it (then an entry at or below it that
        is still not published once the op is done never will be)."""
        op = self._ops.get(tag & 0xFFFFFFFF)        # expect()'s, read without the lock (one dict read)
        if op is None:                              # no expect() (or stop ended it meanwhile): made here
            with self._lock:
                op = self._ops.setdefault(tag & 0xFFFFFFFF, _Op(tag))
        op.snapshot, op.exact = snapshot, snapshot is not None
        op.done_fn = done_fn                        # last: a poll that sees it sees the snapshot

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slicetrace-drain", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        with self._lock:
            return not self._ops

    def pending(self) -> dict[int, _Op]:
        """The ops not yet ended, as now (a copy: what a flush waits for, see still_pending)."""
        with self._lock:
            return dict(self._ops)

    def still_pending(self, ops: dict[int, _Op]) -> bool:
        """Some op of `ops` (pending()'s) has not ended yet."""
        with self._lock:
            return any(self._ops.get(k) is op for k, op in ops.items())

    @property
    def alive(self) -> bool:
        """The drain thread still runs (after stop: stuck in a consumer or fetch call, see `error`)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def open_records(self) -> int:
        """KernelCh starts read and held for a stop: neither delivered nor counted (len(): no lock, a poll may hang)."""
        return len(self._open)

    def flush(self, timeout_s: float) -> bool:
        """Drain until every op submitted before the call has ended (not those another thread submits meanwhile);
        False if that took longer than timeout_s."""
        return flush(self, timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, then settle everything: what is still incomplete now is lost and counted. Returns
        within timeout_s even if a poll hangs: then `error` says where, nothing is settled, `alive` tells."""
        self._stop, stuck, t, deadline = True, None, self._thread, time.monotonic() + timeout_s
        self._wake.set()
        if t is not None:
            t.join(timeout_s)
            if t.is_alive():              # stuck in a poll: name the call that does not return
                stuck = "the drain thread is still running, in " + stuck_in(t)
        try:
            if stuck is None:
                self.settled = self.poll_once(True, max(0.0, deadline - time.monotonic())) is not None
                if not self.settled:
                    stuck = "another poller holds the poll lock (a flush stuck in a consumer or fetch)"
        except BaseException as e:        # e.g. a device that is gone: reported at close, the rest still closes
            self.error = self.error or e
        if stuck is not None:
            self.error = self.error or CommTimeoutError(
                f"slicetrace drain: stop(timeout_s={timeout_s}) gave up, the rings are not settled: {stuck}")

    def release(self) -> None:
        """Stopped and fenced: let go of the rings' memory and of the error callback (a cycle through the session)."""
        self.views = self._hdr = self._st = self._co = self._on_error = None

    def fence(self, timeout_s: float) -> bool:
        """After stop: hold the poll lock for good (no later poll reads the rings); False if a poll still runs."""
        self._stop = True
        return self._poll_lock.acquire(timeout=max(0.0, timeout_s))

    # ---- drain thread ----
    def _run(self) -> None:
        # Poll rarely when little arrives (the engine shares the CPU with us), often when the rings fill.
        iv, busy = self.interval, self.slots // 8
        try:
            if self._thread_init is not None:
                self._thread_init()
            while not self._stop:
                n = self.poll_once(False, 1.0) or 0      # bounded: a fence holds the lock for good
                if not self._ops and not self._ctl.asleep:  # nothing to track: NCCL's proxy sleeps on its cond here
                    self._ctl.nap(self._poll_lock, lambda: not self._ops and not self._stop)
                iv = max(self.interval, iv / 4) if n > busy else min(MAX_INTERVAL_S, iv * 2)
                if self._wake.wait(iv):
                    self._wake.clear()
                    iv = self.interval
        except BaseException as e:        # never kill the process from the drain thread; report at close
            self.error = e
            self._on_error(e)

    def poll_once(self, force: bool = False, timeout_s: float = -1) -> int | None:
        """One poll; None if another poller held the lock for timeout_s (default: wait for it)."""
        if not self._poll_lock.acquire(timeout=timeout_s):
            return None
        try:
            return self._poll(force)
        finally:
            self._poll_lock.release()

    def _poll(self, force: bool) -> int:
        ops = self._ctl.take_ops(self._ops, self._lock, force)      # with ProxyCtrl's Wakeup and Append (.ctrl)
        reserved = self._hdr[:, 0]
        for op in ops:          # in submit order: stop at the first op still running (one query, not one per
            if op.done:         # op in flight; a later op found done on another stream is seen next poll)
                continue
            if op.done_fn is None or not op.done_fn():
                break
            if op.snapshot is None:
                op.snapshot = reserved.copy()
            op.done = True
        done = [o for o in ops if o.done]
        done_lows = [o.tag & 0xFFFFFFFF for o in done]
        running = len(done) < len(ops)
        settled = next((o.snapshot for o in reversed(done) if o.exact), None)   # every seq up to it is final
        if self._fetch is not None and settled is not None:
            hi = settled.astype(np.int64)
            lo = np.maximum(self._fetched, self.cursor.astype(np.int64))
            if (hi > lo).any():
                self._fetch(lo, hi)
                np.maximum(self._fetched, hi, out=self._fetched)
        # Device rings: the mirror holds nothing newer than the last fetch, so reading further (the ops still
        # queued on the GPU, possibly thousands) would only find stale entries, again at every poll.
        cap = None if self._fetch is None or force else self._fetched
        top = reserved if cap is None else np.minimum(reserved, cap.astype(np.uint64))
        chs = np.flatnonzero(top > self.cursor)
        n = self._drain_many(chs, done_lows, force, running, settled, cap) if len(chs) else 0
        if force and self._open:
            self.consumer.drop("unpaired", len(self._open))
            self._open.clear()
        sampled = int(self._hdr[:, 1].sum())
        if sampled != self._sampled:
            self.consumer.drop("sampled_out", sampled - self._sampled)
            self._sampled = sampled
        now = self._clock()
        if self._open:      # an open start of an op read through to its exact end never gets its stop (it failed)
            gone = {o.tag & 0xFFFFFFFF for o in done if o.exact and not (self.cursor < o.snapshot).any()}
            for k in [k for k in self._open if k[1] in gone]:
                del self._open[k]
                self.consumer.drop("unpaired", 1)
        open_ch = {k[1] for k in self._open}
        ended = []
        if (done and len(done) == len(ops) and not force and not open_ch
                and not (self.cursor < done[-1].snapshot).any()):
            ended = [op.tag for op in done]     # snapshots never decrease: the newest read through reads all
        else:
            cursor = self.cursor.tolist() if self.nch <= 8 else None
            for op in ops:      # in submit order: an op ends only after the ones before it
                low = op.tag & 0xFFFFFFFF
                if not (op.done or force):
                    break
                if not force and (low in open_ch or (
                        any(c < s for c, s in zip(cursor, op.snapshot.tolist())) if cursor is not None
                        else bool((self.cursor < op.snapshot).any()))):
                    break
                ended.append(op.tag)
        if ended:
            self._end_ops(ended, now)
            with self._lock:                # after end_op: flush() returning means the events reached plugins
                for tag in ended:
                    self._ops.pop(tag & 0xFFFFFFFF, None)
            n += len(ended)
        self._ctl.polled(len(ops) - len(ended), n, now)
        return n

    def _drain_many(self, chs: np.ndarray, done_lows, force: bool, running: bool = True,
                    settled: np.ndarray | None = None, cap: np.ndarray | None = None) -> int:
        """Every channel in `chs` at once: one gather, a per-channel in-order cut, one delivery.

        done_lows: low 32 bits of the ops known complete before the rings were read (their provisional seq
        words are trusted); running: some op has not completed, so an entry may still be published late;
        settled: per channel, the last seq of a completed op with an exact snapshot (an entry up to it that is
        still not published was lost); cap: per channel, read no further than this seq (default: reserved)."""
        N = self.slots
        if len(chs) == 1:                            # the common cpu case: scalar bookkeeping is cheaper
            c = int(chs[0])
            c0, t0 = int(self.cursor[c]), int(self._hdr[c, 0])
            if t0 - c0 > N:                          # lapped: the oldest entries are gone; count them once
                self.consumer.drop("overrun", t0 - c0 - N)
                c0 = t0 - N
                self.cursor[c] = c0                  # even if nothing past them is fetched yet (return 0 below)
                self._cut[c] = self._any_cut = True
            t1 = t0 if cap is None else min(t0, int(cap[c]))
            if t1 <= c0:
                return 0
            cur, cnt = np.array([c0]), np.array([t1 - c0])
        else:
            lim = None if cap is None else cap[chs]
            cur = self.cursor[chs].astype(np.int64)
            top = self._hdr[chs, 0].astype(np.int64)
            lap = top - cur - N
            if (lap > 0).any():                      # lapped: the oldest entries are gone
                self.consumer.drop("overrun", int(lap[lap > 0].sum()))
                cur = np.maximum(cur, top - N)
                self.cursor[chs] = cur.astype(np.uint64)     # counted once, even for channels cut below
                self._cut[chs[lap > 0]] = self._any_cut = True
            cnt = (top if lim is None else np.minimum(top, lim)) - cur
            keep_ch = cnt > 0
            if not keep_ch.all():
                chs, cur, cnt = chs[keep_ch], cur[keep_ch], cnt[keep_ch]
                if not len(chs):
                    return 0
        if len(chs) == 1:
            c0, n0 = int(cur[0]), int(cnt[0])
            seqs = np.arange(c0 + 1, c0 + n0 + 1, dtype=np.int64)
            chan = None
            i0 = (c0 + 1) & (N - 1)
            st = self._scratch.take_run(self._st[int(chs[0])], i0, n0, "st")
            co = st if self._merged else self._scratch.take_run(self._co[int(chs[0])], i0, n0, "co")
            top2 = np.int64(self._hdr[int(chs[0]), 0])     # read after the copy: is any slot being reused?
        else:
            offs = np.cumsum(cnt) - cnt
            seqs = np.arange(int(cnt.sum()), dtype=np.int64) + np.repeat(cur + 1 - offs, cnt)
            chan = np.repeat(chs, cnt)
            idx = seqs & (N - 1)
            flat = chan * N + idx
            st = self._scratch.take(self._st.reshape(-1, 6), flat, "st")
            co = st if self._merged else self._scratch.take(self._co.reshape(-1, 6), flat, "co")
            top2 = np.repeat(self._hdr[chs, 0].astype(np.int64), cnt)   # read after the copy
        self.rows_read += len(seqs)
        useq = seqs.view(np.uint64)
        intact = seqs + N > top2
        sw, cw = st[:, 0], co[:, 0]
        st_vis = (sw == useq) & intact
        merged = self._merged
        co_vis = st_vis if merged else cw == useq
        ok = st_vis & co_vis
        if not ok.all():
            dl = np.array(done_lows, dtype=np.uint64)               # the completed ops, for both checks below
            if done_lows and ((sw | cw) >= _PROV).any():
                done31 = dl & _LO31
                st_vis = published(sw, useq, done31) & intact
                co_vis = st_vis if merged else published(cw, useq, done31)
                ok = st_vis & co_vis
        if ok.all():
            end = cnt
        else:
            lost = (st_vis & ~ok & member(st[:, 4] & _LO32, dl)) | ((top2 - seqs > LOST_LAG) & (not running))
            if settled is not None:
                lost |= seqs <= settled[chs if chan is None else chan].astype(np.int64)
            undecided = ~(ok | ~intact | lost | force)
            if len(chs) == 1:
                end = cnt if not undecided.any() else np.array([int(np.argmax(undecided))])
                keep = np.arange(len(seqs)) < end[0]
            else:                                    # each channel stops at its first undecided entry
                offs = np.cumsum(cnt) - cnt
                pos = np.arange(len(seqs)) - np.repeat(offs, cnt)
                end = np.minimum(np.minimum.reduceat(np.where(undecided, pos, cnt.max()), offs), cnt)
                keep = pos < np.repeat(end, cnt)
            lapped = keep & ~intact                  # a prefix of its channel's rows, like a cursor jump
            if lapped.any():
                self.consumer.drop("overrun", int(lapped.sum()))
                self._cut[chs if chan is None else chan[lapped]] = self._any_cut = True
            bad = keep & intact & ~ok
            never = int((bad & ~st_vis & ~co_vis).sum())        # neither half written: the kernel never got there
            if never:
                self.consumer.drop("unwritten", never)
            unpaired = int(bad.sum()) - never
            if unpaired:
                self.consumer.drop("unpaired", unpaired)
            sel = keep & ok
            st = st[sel]
            co = st if merged else co[sel]
            if chan is not None:
                chan = chan[sel]
        if not merged:
            same = (st[:, 4] == co[:, 4]) & (st[:, 5] == co[:, 5])   # identity words: op, step, size, peer, kind
            if not same.all():
                self.consumer.drop("unpaired", int((~same).sum()))
                st, co = st[same], co[same]
                if chan is not None:
                    chan = chan[same]
        if self._any_cut and len(st) and self._cut[chs].any():     # what is left of programs cut by a lap goes
            with self._lock:
                ch_ops = np.array([k for k, o in self._ops.items() if o.ch], np.uint64)
                uniq = {k for k, o in self._ops.items() if o.uniq}
            left = after_lap(st, int(chs[0]) if chan is None else chan, self._cut, ch_ops, uniq, self._open,
                             self.consumer.drop)
            self._any_cut = bool(self._cut.any())
            if left is not None:
                st, co, chan = st[left], (st[left] if merged else co[left]), (None if chan is None else chan[left])
        self.cursor[chs] = (cur + end).astype(np.uint64)
        if len(st):
            self._deliver(int(chs[0]) if chan is None else chan, st, co)
        return int(end.sum())

    def _deliver(self, chan, st: np.ndarray, co: np.ndarray) -> None:
        """chan: the channel of every row (array), or one int when all rows come from one channel."""
        got = op_runs(chan, st, co, self._open, self.consumer.drop, self._scratch, self.offset_ns)
        if got is None:
            return
        out, starts = got
        bounds = starts[1:] + [len(out)]
        lows, kl = out["op"][si := np.array(starts)].tolist(), out["kind"][si].tolist()     # one list conversion
        with self._lock:
            tags = [self._ops.get(low) for low in lows]
        n = len(out)
        if None in tags:                             # records of ops the drain never saw submitted
            for op, a, b in zip(tags, starts, bounds):
                if op is None:
                    self.consumer.drop("no_parent", b - a)
                    n -= b - a
        runs = [(op.tag, kind, a, b) for op, kind, a, b in zip(tags, kl, starts, bounds) if op is not None]
        batch = getattr(self.consumer, "batch", None)
        sent = 0                                     # rows of the runs the consumer returned from
        try:
            if batch is not None and runs:
                batch(out, runs)                     # one call per poll (events.host.EventHost.batch)
            for tag, kind, a, b in runs if batch is None else ():
                (self.consumer.channel if kind == KIND_CHANNEL else self.consumer.steps)(tag, out[a:b])
                sent += b - a
        except BaseException:        # SystemExit from a plugin (not caught by the consumer): the cursor is past it
            self.consumer.drop("plugin_error", n - sent)
            self.delivered += sent
            raise
        self.delivered += n
