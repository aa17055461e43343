"""The event host: activation masks, parent links, completion, drop accounting and fan-out to plugins.

Per op and plugin, the host snapshots the plugin's effective mask (parents included, limited to what the
plugin's version knows and to the op's mask) in `begin_op`, emits API/Group/Coll/P2p starts, then turns drained
records into KernelCh events and KernelStep batches. A Coll/P2p stops when its last KernelCh record arrived
(ts = the latest done_ns of its KernelCh records), or at `end_op` (short of some: counted missing_kernel_ch, told
to plugins with event_unfinished). Children of a None (dropped) parent handle are dropped and counted. A plugin
that raises never breaks communication: the error is logged once, counted, and the plugin is disabled after
`max_failures` exceptions (each event it would have got from then on is counted plugin_disabled).

Threads: begin_op runs on the user thread; channel/steps/batch/end_op(s)/drop on the drain thread (the user's on
the inline cpu drain, inside flush and close, and at exit). One lock serialises them, so plugins are called by one
thread at a time; note() takes only a small lock of its own (the user's op calls it).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from ..errors import CommTimeoutError, ConfigError
from .abi import CommInfo, EventType, effective_mask
from .accounts import Accounts
from .emit import _B, _DELIVERED, Emitter
from .ops import OFF as _OFF, SKIP as _SKIP
from .ops import OpInfo, TaskInfo, _Op, _Slot, _Task, convert, to_kernel_ch, to_kernel_steps
from .plugin import LoadedPlugin
from .proxy import ProxyCtrls
from .runs import PollRuns, task_keys

__all__ = ["EventHost", "OpInfo", "TaskInfo", "DROP_REASONS"]

log = logging.getLogger("slicetrace")
T = EventType
DROP_REASONS = ("overrun", "unpaired", "unwritten", "no_parent", "parent_dropped", "pool_full", "consumer_behind",
                "sampled_out", "plugin_error", "plugin_disabled", "masked_out", "declined", "missing_kernel_ch",
                "plugin_init_failed")
BEHIND_WAIT_S = 1.0     # a plugin callback holding the host this long is stuck: the user's op runs unprofiled
_KCH, _KS = _B.KERNEL_CH, _B.KERNEL_STEP
_DKCH = _DELIVERED[T.KERNEL_CH]


class EventHost(Emitter, PollRuns, Accounts, ProxyCtrls):
    def __init__(self, plugins: list[LoadedPlugin], comm: CommInfo, max_failures: int = 16, extra: Any = dict):
        self.comm, self._extra = comm, extra        # extra() -> counts of the caller's own, in every read of them
        self.max_failures = max(1, int(max_failures))
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._ops: dict[int, _Op] = {}
        self._proxy: list[list[Any]] = []       # per plugin: its Idle/Active ProxyCtrl event, its Sleep/Append one
        self._skip_counts: dict[tuple, list[tuple[str, int]]] = {}
        self._pms: dict[tuple, tuple[int, ...]] = {}     # (op mask, live masks) -> the plugins' masks of an op
        self._closed = False
        self._behind, self._n_behind, self._behind_lock = False, 0, threading.Lock()
        self._notes: dict[str, int] = {}
        self._slots: list[_Slot] = []
        try:
            for lp in plugins:
                slot = _Slot(lp)
                try:
                    lp.init(comm, 0, lambda s=slot: self._live(s))      # a reader of its counters (plugin.py)
                except ConfigError:
                    raise               # a setting the user must fix (a dump path that cannot be written), not a bug
                except Exception:
                    # NCCL unloads a plugin whose init fails; communication goes on without it.
                    log.exception("slicetrace: profiler plugin %r failed in init and is unloaded", lp.name)
                    self._counts["plugin_init_failed"] += 1
                    continue
                lp.error_budget = self.max_failures
                self._slots.append(slot)
        except BaseException:
            # The plugins initialised before it may hold open files (a trace): finalize them, then refuse.
            self._proxy = [[_OFF, _OFF] for _ in self._slots]
            self.close()
            raise
        self._proxy = [[_OFF, _OFF] for _ in self._slots]
        self._unfin = [f if callable(f := getattr(s.lp.plugin, "event_unfinished", None)) else None  # an extension
                       for s in self._slots]

    plugins = property(lambda self: [s.lp for s in self._slots])

    def disabled(self) -> list[str]:
        return [s.lp.name for s in self._slots if s.disabled]

    # ---- masks ----
    def _pmask(self, s: _Slot) -> int:
        return effective_mask(s.lp.mask) & s.lp.known_types

    def op_mask(self) -> int:
        """Mask snapshot for a new op: union of the plugins' live masks, parents included. A disabled plugin's
        mask stays in: its ops' records are still made, so that each one it misses is counted plugin_disabled."""
        m = 0
        for s in self._slots:
            m |= self._pmask(s)
        return m

    # ---- ops ----
    def begin_op(self, info: OpInfo) -> bool:
        """Open the op's events; False (the op is to run unprofiled, counted consumer_behind) when a plugin
        callback in the drain thread holds the host over BEHIND_WAIT_S: the engine never waits on a stuck plugin.
        While it stays stuck, later ops wait 10 ms at most."""
        if not self._lock.acquire(False) and not self._lock.acquire(    # untimed first: a timed one costs ~2k more
                True, min(0.01, BEHIND_WAIT_S) if self._behind else BEHIND_WAIT_S):
            self._behind = True
            with self._behind_lock:
                self._n_behind += 1
            return False
        self._behind = False
        try:
            self._begin_op(info)
        finally:
            self._lock.release()
        return True

    def _begin_op(self, info: OpInfo) -> None:
        if self._closed:
            return
        if info.mask is None:
            info.mask = self.op_mask()
        slots, tag = self._slots, info.tag
        lives = [slots[0].lp.mask] if len(slots) == 1 else [s.lp.mask for s in slots]   # one plugin: no comprehension
        pms = self._pms.get(key := (info.mask, *lives))        # the same few masks op after op
        if pms is None:
            pms = tuple(effective_mask(m) & s.lp.known_types & info.mask if m else 0 for s, m in zip(slots, lives))
            if not info.mask & _KS and any(m & _KS for m in lives):     # profiling(mask=...) left out what a plugin
                c = self._counts                                        # wants: counted per op, so never cached
                c["ops_masked_kernel_step"] = c.get("ops_masked_kernel_step", 0) + 1
            elif len(self._pms) < 1024:
                self._pms[key] = pms
        op = _Op(info, pms)
        old = self._ops.pop(tag, None)
        if old is not None:           # a tag reused before its end_op: close the old op first
            self._finish(old, info.ts_ns)
        self._ops[tag] = op           # first: a Ctrl-C in a plugin's start leaves what started to end_op or close
        for i, pm in enumerate(pms):
            if pm:
                s = slots[i]
                real = pm if s.lp.passthrough is None else pm & lives[i]
                if s.disabled:      # its KernelCh/KernelSteps are counted where they arrive (handles stay _OFF)
                    self._count_disabled(s, op, real)
                else:
                    self._emit_begin(i, op, real, lives[i])

    def _route(self, op: _Op, recs: np.ndarray) -> list[tuple[_Task, Any]]:
        """(task, row selection or None = all rows) per task that has records. Each record goes to one task:
        the first whose peer, direction (and channels, when known) match."""
        tasks = op.tasks
        if len(tasks) == 1 and not tasks[0].p2p:
            return [(tasks[0], None)]
        key = task_keys(recs)
        matched, out, taken = 0, [], None
        for t in tasks:                      # each record goes to one task: the first that claims it
            if op.shared and t.mates is not None and t is not t.mates[0]:
                continue                     # its records are its lead's (ops._Op._share)
            sel = key == t.key
            if op.shared:                    # (else keys are unique: the key alone decides)
                if t.chans is not None:
                    sel &= np.isin(recs["channel"], t.chans)
                if taken is not None:
                    sel &= ~taken
            n = int(sel.sum())
            if n:
                matched += n
                out.append((t, None if n == len(recs) else sel))
                if op.shared:
                    taken = sel if taken is None else taken | sel
        if matched < len(recs):
            self._counts["no_parent"] += len(recs) - matched
        return out

    def channel(self, tag: int, recs: np.ndarray) -> None:
        """KernelCh records (PAIRED_DTYPE, kind == KIND_CHANNEL) of op `tag`."""
        if len(recs):
            with self._lock:
                self._channel(tag, recs, None)

    def _channel(self, tag: int, recs: np.ndarray, whole: Any) -> None:
        op = self._ops.get(tag)
        c = self._counts
        if op is None:
            c["no_parent"] += len(recs)
            return
        for t, sel in self._route(op, recs):
            done = recs["done_ns"] if sel is None else recs["done_ns"][sel]
            n = len(done)
            if t.done:
                c["no_parent"] += n
                continue
            if not op.pm_any & _KCH:        # stamped for the op's ends (KernelStep on), taken by no plugin
                c["masked_out"] += n
            kc = None
            for i, pm in enumerate(op.pmasks):
                if not pm & _KCH:
                    continue
                parent = self._kch_parent(i, t, n)
                if parent is _SKIP:
                    continue
                if kc is None:
                    kc = convert(to_kernel_ch, recs, whole, sel)
                self._kch_deliver(self._slots[i], n, lambda lp: lp.kernel_ch_batch(parent, kc))
            self._kch_arrived(op, t, n, int(done[0]) if n == 1 else int(done.max()))
        if op.open == 0:
            self._finish(op, max(t.last_done for t in op.tasks))
            self._ops.pop(tag, None)

    def _kch_parent(self, i: int, t: _Task, n: int) -> Any:
        """Plugin i's parent handle for n KernelCh records of task t (None: no parent), or _SKIP with the n
        records counted: a dropped parent, a disabled plugin. Whether plugin i takes KernelCh is the op's mask
        snapshot (callers check op.pmasks[i]), never its live mask: a change applies from the next op."""
        s, parent = self._slots[i], t.handles[i]
        c = s.counts
        if parent is None:
            c["parent_dropped"] += n
        elif s.disabled:
            c["plugin_disabled"] += n
        else:
            return None if parent is _OFF else parent
        return _SKIP

    def _kch_deliver(self, s: _Slot, n: int, call: Any) -> None:
        """call(loaded plugin) hands it n KernelCh events; count what it kept and declined, or its failure."""
        c = s.counts
        try:
            kept = min(max(int(call(s.lp)), 0), n)
        except Exception as e:
            self._failed_batch(s, "kernel_ch_batch", n, e, _DKCH, "declined")
            return
        c[_DKCH] = c.get(_DKCH, 0) + kept
        c["declined"] += n - kept

    def _kch_arrived(self, op: _Op, t: _Task, n: int, last: int) -> None:
        """n KernelCh records of task t arrived, the latest done at `last`: the task (and the parts that share
        its records, ops._Op) completes with its last one."""
        if last > t.last_done:
            t.last_done = last
        t.left -= n
        if t.left <= 0 and (t.info.n_programs > 0 or t.mates):
            for m in t.mates or (t,):
                if not m.done:
                    self._complete(op, m, t.last_done)

    def steps(self, tag: int, recs: np.ndarray) -> None:
        """KernelStep records (PAIRED_DTYPE, kind == KIND_STEP) of op `tag`, one batch per call."""
        if len(recs):
            with self._lock:
                self._steps(tag, recs, None)

    def _steps_op(self, tag: int, n: int) -> _Op | None:
        """The op that n KernelSteps of `tag` belong to, if a plugin takes them; else they are counted."""
        op = self._ops.get(tag)
        if op is None:
            self._counts["no_parent"] += n
        elif not op.pm_any & _KS:           # also when every plugin dropped KernelStep after the op's mask snapshot
            self._counts["masked_out"] += n
            return None
        return op

    def _steps(self, tag: int, recs: np.ndarray, whole: Any) -> None:
        n_all = len(recs)
        op = self._steps_op(tag, n_all)
        if op is None:
            return
        c = self._counts
        for t, sel in self._route(op, recs):
            n = n_all if sel is None else int(sel.sum())
            if t.done:
                c["no_parent"] += n
                continue
            ks = None
            for i, pm in enumerate(op.pmasks):
                if not pm & _KS:
                    continue
                s, parent = self._slots[i], t.handles[i]
                if parent is None:
                    s.counts["parent_dropped"] += n
                    continue
                if s.disabled:
                    s.counts["plugin_disabled"] += n
                    continue
                if ks is None:
                    ks = convert(to_kernel_steps, recs, whole, sel)
                try:
                    kept = min(max(int(s.lp.kernel_step_batch(None if parent is _OFF else parent, ks)), 0), n)
                except Exception as e:
                    self._failed_batch(s, "kernel_step_batch", n, e, "delivered_kernel_step", "pool_full")
                    continue
                sc = s.counts
                sc["delivered_kernel_step"] = sc.get("delivered_kernel_step", 0) + kept
                sc["pool_full"] += n - kept

    def _complete(self, op: _Op, t: _Task, ts_ns: int) -> None:
        t.done = True
        op.open -= 1
        for i in range(len(self._slots)):
            self._stop(i, t.handles[i], ts_ns)

    def _finish(self, op: _Op, ts_ns: int) -> None:
        """Complete every open task of op (counting missing KernelCh records) and stop its Group."""
        expected = op.info.mask & (_KCH | _KS)    # KernelCh records are stamped only for these (session.run)
        for t in op.tasks:
            if not t.done:
                if expected and t.left > 0:
                    self._counts["missing_kernel_ch"] += t.left
                    self._unfinished(t)
                self._complete(op, t, max(ts_ns, t.last_done))
        for i in range(len(self._slots)):
            self._stop(i, op.groups[i], ts_ns)

    def _unfinished(self, t: _Task) -> None:
        """Before its stop: t's Coll/P2p lacks t.left KernelCh, to each plugin with event_unfinished (disabled too)."""
        for i, fn in enumerate(self._unfin):
            s, h = self._slots[i], t.handles[i]
            if fn is not None and h is not None and h is not _OFF and h is not s.lp.passthrough:
                try:
                    fn(h, t.left)
                except Exception:
                    self._fail(s, "event_unfinished", 1)

    def end_op(self, tag: int, ts_ns: int) -> None:
        """Every record of op `tag` was delivered or counted lost; completes whatever is still open."""
        self.end_ops((tag,), ts_ns)

    def end_ops(self, tags: Any, ts_ns: int) -> None:
        """end_op for each tag, in order, under one lock."""
        with self._lock:
            for tag in tags:
                op = self._ops.pop(tag, None)
                if op is not None:
                    self._finish(op, ts_ns)

    def _unlocked(self, read: Any, wait_s: float | None = None) -> Any:
        """read() under the lock, or, while a callback holds it past wait_s (BEHIND_WAIT_S: stuck, it mutates
        nothing meanwhile), without it."""
        if self._lock.acquire(timeout=BEHIND_WAIT_S if wait_s is None else wait_s):
            try:
                return read()
            finally:
                self._lock.release()
        for _ in range(100):
            try:
                return read()
            except RuntimeError:            # a dict changed size under us: the callback returned after all
                time.sleep(0.001)
        return read()

    def close(self, ts_ns: int | None = None, notes: dict[str, int] | None = None, timeout_s: float = -1) -> None:
        """Complete open ops, then hand counters (with `notes`, as note() would) to and finalize every plugin.
        Idempotent. Waits at most timeout_s (-1: no limit) for a plugin callback in another thread to return."""
        if not self._lock.acquire(timeout=timeout_s):
            raise CommTimeoutError(
                f"slicetrace: profiler plugins {[s.lp.name for s in self._slots]} not finalized (their output is "
                f"incomplete): a callback of theirs in the drain thread did not return within {timeout_s}s")
        try:
            if self._closed:
                return
            for k, v in (notes or {}).items():
                self.note(k, v)
            self._closed = True
            ts = time.monotonic_ns() if ts_ns is None else ts_ns
            for op in list(self._ops.values()):
                self._finish(op, ts)
            self._ops.clear()
            for i in range(len(self._slots)):
                for h in reversed(self._proxy[i]):
                    self._stop(i, h, ts)
            for s in self._slots:                  # each its own copy: a plugin may change what it is handed
                for what, fn in (("report_counters", lambda: s.lp.report_counters(self._with_plugins((s,)))),
                                 ("finalize", s.lp.finalize)):
                    try:
                        fn()
                    except Exception:
                        log.exception("slicetrace: profiler plugin %r failed in %s", s.lp.name, what)
        finally:
            self._lock.release()
