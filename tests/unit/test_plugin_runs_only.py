"""A plugin with a *_runs method and no *_batch gets every batch through its runs method (before, has_runs needed
the batch method too: such a plugin silently got start/state/stop per record and its runs method was never
called)."""
from __future__ import annotations

import numpy as np

from slicetrace.events.abi import EventType as T
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.stamps.layout import KIND_CHANNEL, KIND_STEP
from tests.unit.test_host import COMM, chrec, coll_op, p2p_op, recs
from tests.unit.test_plugin import RecPlugin

KS, CH = int(T.KERNEL_STEP), int(T.KERNEL_CH)


class StepRunsOnly(RecPlugin):
    """Version 8, kernel_step_runs but no kernel_step_batch (nor any KernelCh batch method)."""

    def __init__(self, **kw):
        super().__init__(batch=False, **kw)

    def kernel_step_runs(self, ctx, parents, recs, starts, stops):
        self.calls.append(("runs", list(parents), recs.copy(), list(starts), list(stops)))
        return sum(stops) - sum(starts)


class ChRunsOnly(RecPlugin):
    """Version 8, kernel_ch_runs but no kernel_ch_batch."""

    def kernel_ch_runs(self, ctx, parents, recs, starts, stops):
        self.calls.append(("ch_runs", list(parents), recs.copy(), list(starts), list(stops)))
        return sum(stops) - sum(starts)


def _host(p, *ops) -> EventHost:
    """A host over plugin p with `ops` begun."""
    h = EventHost([LoadedPlugin(p)], COMM)
    for op in ops:
        h.begin_op(op)
    return h


def _rows(p, kind="runs"):
    """(parent, row) for every row the plugin's runs calls were handed."""
    return [(ps[k], r) for _, ps, got, st, sp in p.of(kind) for k in range(len(ps)) for r in got[st[k]:sp[k]]]


def test_kernel_step_runs_alone_gets_every_kernel_step_per_op_and_per_poll():
    p = StepRunsOnly(mask=KS)
    h = _host(p, coll_op(tag=1), p2p_op(tag=2), coll_op(tag=3), coll_op(tag=4))
    h.steps(1, recs(1, 4))                                   # one op's records: kernel_step_batch's path
    h.steps(2, np.concatenate([recs(2, 2, send=1, peer=2), recs(2, 3, peer=0)]))
    h.batch(np.concatenate([recs(3, 3), recs(4, 2)]), [(3, KIND_STEP, 0, 3), (4, KIND_STEP, 3, 5)])
    assert len(p.starts(T.KERNEL_STEP)) == 0 and p.of("state") == []     # no start/state/stop per step
    rows = _rows(p)
    assert len(rows) == 4 + 5 + 5 == h.counters()["delivered_kernel_step"]
    colls = [d for d in p.starts() if d.type == T.COLL]
    assert [len(c[1]) for c in p.of("runs")] == [1, 1, 1, 2]  # a batch as one run; a poll in one call
    handles = {("h", i + 1, d.type): d for i, d in enumerate(p.starts())}
    by_parent = [(handles[q].type, getattr(handles[q], "func", None)) for q, _ in rows]
    assert by_parent == [(T.COLL, "AllReduce")] * 4 + [(T.P2P, "Send")] * 2 + [(T.P2P, "Recv")] * 3 + \
        [(T.COLL, "AllReduce")] * 5 and len(colls) == 3
    h.close()


def test_kernel_ch_runs_alone_gets_every_kernel_ch_and_no_per_record_calls():
    p = ChRunsOnly(mask=CH)
    h = _host(p, coll_op(tag=1), p2p_op(tag=2), coll_op(tag=3))
    h.channel(1, chrec(1))                                  # one op's KernelCh: kernel_ch_batch's path
    h.channel(2, np.concatenate([chrec(2, send=1, peer=2), chrec(2, peer=0)]))     # p2p: always per op
    h.batch(chrec(3), [(3, KIND_CHANNEL, 0, 1)])
    assert len(p.starts(T.KERNEL_CH)) == 0 and len(_rows(p, "ch_runs")) == 4 == h.counters()["delivered_kernel_ch"]
    assert [c[0] for c in p.calls if c[0] == "stop" and c[1][2] in (T.COLL, T.P2P)] == ["stop"] * 4   # all done
    h.close()


def test_kernel_ch_runs_alone_below_version_8_is_not_called():
    """KernelCh batch calls are the native version's: an older plugin keeps the per-record calls."""
    p = ChRunsOnly(version=7, mask=CH)
    lp = LoadedPlugin(p)
    assert not lp.has_ch_runs
    h = EventHost([lp], COMM)
    h.begin_op(coll_op(tag=1))
    h.channel(1, chrec(1))
    assert p.of("ch_runs") == [] and len(p.starts(T.KERNEL_CH)) == 1
    h.close()
