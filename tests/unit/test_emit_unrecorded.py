"""Parents the host skips through a plugin's unrecorded_handle are counted unrecorded_<type>, not delivered_<type>
(before, e.g. delivered_group_api grew by one per op for a plugin that never saw a GroupApi event), and the
report's loss line does not call them losses."""
from __future__ import annotations

import pytest

from slicetrace.events.abi import EventType as T
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from tests.unit.test_host import COMM, coll_op, p2p_op
from tests.unit.test_plugin import RecPlugin

PARENTS = (T.GROUP_API, T.COLL_API, T.P2P_API, T.KERNEL_LAUNCH, T.GROUP, T.COLL, T.P2P)
KS = int(T.KERNEL_STEP)


class Unrecorded(RecPlugin):
    """RecPlugin that declares unrecorded_handle (it would return that handle for types outside its mask)."""
    PT = ("unrecorded",)

    def unrecorded_handle(self, ctx):
        return self.PT


def _run(p, ops=3):
    h = EventHost([LoadedPlugin(p)], COMM)
    for tag in range(1, ops + 1):            # several ops: _emit_fast caches its per-op additions
        h.begin_op(p2p_op(tag) if tag % 2 else coll_op(tag))
    c = h.counters()
    h.close()
    return c


@pytest.mark.parametrize("mask", [KS, int(T.COLL) | KS, int(T.P2P | T.GROUP) | KS, int(T.COLL_API | T.COLL) | KS,
                                  int(T.GROUP_API | T.KERNEL_LAUNCH) | KS])
def test_skipped_parents_are_counted_unrecorded_and_delivered_counts_what_the_plugin_saw(mask):
    p = Unrecorded(mask=mask)
    c = _run(p)
    ref = _run(RecPlugin(mask=mask))         # no unrecorded_handle: every parent is started
    for t in PARENTS:
        key = t.name.lower()
        started = len(p.starts(t))
        assert c.get(f"delivered_{key}", 0) == started, (key, c)
        want = ref.get(f"delivered_{key}", 0)            # what NCCL would start, the plugin's own types or not
        assert c.get(f"unrecorded_{key}", 0) == (0 if mask & t else want), (key, c)
        assert started == (want if mask & t else 0), key
    assert c["declined"] == 0 and c["parent_dropped"] == 0
    assert any(c.get(f"unrecorded_{t.name.lower()}") for t in PARENTS)       # every mask here skips some


def test_the_reports_loss_line_does_not_count_unrecorded_parents():
    import numpy as np
    from rich.console import Console

    from slicetrace.analyze.report import build, render
    from slicetrace.analyze.trace import KERNEL_STEP_TABLE
    ks = np.array([(0, 0, 1, 1, 0, 1_000_000, 0, 10, 10_010, 0, 0)], dtype=KERNEL_STEP_TABLE)
    rep = build(ks, counters={0: {"unrecorded_group_api": 140, "unrecorded_coll_api": 140, "delivered_coll": 140}})
    con = Console(record=True, width=200)
    render(rep, console=con)
    assert "loss counters: none, every record delivered" in con.export_text()
