"""A drain poll's records at once (EventHost.batch): one plugin call per record type and plugin for all of a
poll's collectives, then their completions in submit order; what channel()/steps() do per op, with fewer calls.

Mixed into EventHost (host.py), whose lock, ops, slots and counters these use.
"""
from __future__ import annotations

import bisect
from operator import itemgetter
from typing import Any

import numpy as np

from ..stamps.layout import FLAG_SEND, KIND_CHANNEL
from .emit import _B
from .ops import OFF as _OFF
from .ops import _Op, _Slot, _Task, to_kernel_ch, to_kernel_steps

_KCH, _KS = _B.KERNEL_CH, _B.KERNEL_STEP
_STOP = itemgetter(3)           # a run's stop row


def task_keys(recs: np.ndarray) -> np.ndarray:
    """Each record's p2p task key, as ops._Task.key: peer * 2 + is_send."""
    return recs["peer"].astype(np.int64) * 2 + (recs["flags"] & FLAG_SEND)


class PollRuns:
    """Mixed into EventHost: expects its _lock, _ops, _slots, _counts, _channel, _steps, _finish, _failed_batch
    and the KernelCh helpers _kch_parent, _kch_deliver, _kch_arrived."""
    _slots: list[_Slot]
    _counts: dict[str, int]
    _ops: dict[int, _Op]

    def batch(self, recs: np.ndarray, runs: list[tuple[int, int, int, int]]) -> None:
        """One drain poll at once: runs of (tag, kind, start, stop) rows of `recs`; the same as channel()/steps()
        per run, with one lock and one KernelStep conversion for the whole poll. Every KernelStep run goes out
        before any KernelCh run (a KernelCh run may complete its op and stop the parent)."""
        ks: list[Any] = [None]
        kc: list[Any] = [None]
        with self._lock:
            steps = [r for r in runs if r[1] != KIND_CHANNEL]
            if steps:
                self._steps_runs(recs, steps, ks)
            chans = [r for r in runs if r[1] == KIND_CHANNEL]
            if chans:
                self._channel_runs(recs, chans, kc)

    def _channel_runs(self, recs: np.ndarray, runs: list[tuple[int, int, int, int]], box: list[Any]) -> None:
        """The KernelCh runs of one poll: a collective's go to each plugin in one kernel_ch_runs call, then
        complete their ops in order (what _channel does per run); p2p groups go through _channel."""
        c = self._counts
        pend: list[tuple[list, list, list]] = [([], [], []) for _ in self._slots]    # parents, starts, stops
        get, slots = self._ops.get, self._slots
        fast = []
        for tag, _, a, b in runs:
            op = get(tag)
            if op is None or len(op.tasks) != 1 or op.tasks[0].p2p:
                self._channel(tag, recs[a:b], (box, recs, a, b))
                continue
            t = op.tasks[0]
            if t.done:                              # as _channel: late records counted, the op ends
                c["no_parent"] += b - a
                self._finish(op, t.last_done)
                self._ops.pop(tag, None)
                continue
            if not op.pm_any & _KCH:                # as _channel: stamped, taken by no plugin
                c["masked_out"] += b - a
            for i, pm in enumerate(op.pmasks):
                if not pm & _KCH:
                    continue
                parent = t.handles[i]
                if parent is None or slots[i].disabled:     # counted by _kch_parent; else its answer, inline
                    self._kch_parent(i, t, b - a)
                    continue
                ps, st, sp = pend[i]
                ps.append(None if parent is _OFF else parent)
                st.append(a)
                sp.append(b)
            fast.append((op, t, a, b))
        if not fast:
            return
        lo = fast[0][2]
        kc = None
        for s, (ps, st, sp) in zip(self._slots, pend):
            if not ps:
                continue
            n = sum(sp) - sum(st)
            if s.disabled:
                s.counts["plugin_disabled"] += n
                continue
            if kc is None:
                kc = to_kernel_ch(recs[lo:fast[-1][3]])
            a0, b0 = [a - lo for a in st], [b - lo for b in sp]
            self._kch_deliver(s, n, lambda lp: lp.kernel_ch_runs(ps, kc, a0, b0))
        starts = [f[2] for f in fast]
        hi = fast[-1][3]
        if hi - lo == len(fast):                    # a row per run (1-channel collectives): those rows' dones
            lasts = recs["done_ns"][lo:hi].tolist()
        elif all(f[3] == g for f, g in zip(fast, starts[1:])):   # contiguous runs: every run's last done at once
            lasts = np.maximum.reduceat(recs["done_ns"][lo:hi], [a - lo for a in starts]).tolist()
        else:
            done = recs["done_ns"]
            lasts = [int(done[a:b].max()) for _, _, a, b in fast]
        for (op, t, a, b), last in zip(fast, lasts):    # collectives: one task, no mates (_kch_arrived's case)
            if last > t.last_done:
                t.last_done = last
            t.left -= b - a
            if t.left > 0 or t.info.n_programs <= 0 or t.done:     # done: an earlier run of this poll ended it
                continue
            self._complete(op, t, t.last_done)
            if op.open == 0:
                self._finish(op, t.last_done)       # its one task done: the Group's stops
                self._ops.pop(op.info.tag, None)

    def _steps_runs(self, recs: np.ndarray, runs: list[tuple[int, int, int, int]], box: list[Any]) -> None:
        """The KernelStep runs of one poll go to each plugin in one kernel_step_runs call: a collective's run
        whole, a p2p group's cut where (peer, direction) changes, each piece under its part; groups with two
        parts of one key (routed by channel, ops._Op._share) one run at a time (_steps)."""
        c = self._counts
        pend: list[tuple[list, list, list]] = [([], [], []) for _ in self._slots]    # parents, starts, stops
        box[0] = to_kernel_steps(recs[:max(map(_STOP, runs))])
        get = self._ops.get
        keys = cuts = None
        pieces: list[tuple[_Op, _Task, int, int]] = []     # (op, task, rows a..b) for _take, in run order
        for tag, _, a, b in runs:
            op = get(tag)
            if op is None or op.shared or not op.pm_any & _KS:
                self._steps(tag, recs[a:b], (box, recs, a, b))    # counts no_parent / masked_out; routes by channel
                continue
            tasks = op.tasks
            if len(tasks) == 1 and not tasks[0].p2p:
                pieces.append((op, tasks[0], a, b))
                continue
            if cuts is None:                     # once per poll: where (peer, direction) changes
                keys = task_keys(recs)
                cuts = (np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist()
            by_key = {t.key: t for t in tasks}
            edges = [a] + cuts[bisect.bisect_right(cuts, a):bisect.bisect_left(cuts, b)] + [b]
            for x, y in zip(edges, edges[1:]):
                t = by_key.get(int(keys[x]))
                if t is None:
                    c["no_parent"] += y - x
                else:
                    pieces.append((op, t, x, y))
        self._take(pieces, pend)
        for s, (ps, st, sp) in zip(self._slots, pend):
            if not ps:
                continue
            n = sum(sp) - sum(st)
            if s.disabled:                      # by a failure in one of this poll's p2p runs
                s.counts["plugin_disabled"] += n
                continue
            try:
                kept = min(max(int(s.lp.kernel_step_runs(ps, box[0], st, sp)), 0), n)
            except Exception as e:
                self._failed_batch(s, "kernel_step_batch", n, e, "delivered_kernel_step", "pool_full")
                continue
            sc = s.counts
            sc["delivered_kernel_step"] = sc.get("delivered_kernel_step", 0) + kept
            sc["pool_full"] += n - kept

    def _take(self, pieces: list[tuple[_Op, _Task, int, int]], pend: list[tuple[list, list, list]]) -> None:
        """Per (op, task t, a, b) of pieces: rows a..b of this poll's KernelSteps, all of task t, queued for each
        plugin that takes them (one call per poll: a call per run cost more than its work)."""
        slots = self._slots
        for op, t, a, b in pieces:
            if t.done:
                self._counts["no_parent"] += b - a
                continue
            for i, pm in enumerate(op.pmasks):
                if not pm & _KS:
                    continue
                parent = t.handles[i]
                if parent is None:
                    slots[i].counts["parent_dropped"] += b - a
                elif slots[i].disabled:
                    slots[i].counts["plugin_disabled"] += b - a
                else:
                    ps, st, sp = pend[i]
                    ps.append(None if parent is _OFF else parent)     # _OFF: a parent the plugin left untracked
                    st.append(a)
                    sp.append(b)
