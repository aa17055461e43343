"""Coll/P2p records formatted in blocks (sinks/chrome_ops.py, chrome_text.RowFormat compact): the same bytes as
the per-event templates, in stop order, whatever mix of events the block holds."""
from __future__ import annotations

import random

import numpy as np

from slicetrace.events.host import OpInfo, TaskInfo
from slicetrace.sinks.chrome import _op_pair, _records, _unfinished_pair
from slicetrace.sinks.chrome_text import RowFormat
from tests.unit.test_chrome import make

LINE = '{"a":%d,"ts":%d.%03d,"s":%d,"k":%03d,"p":%d},\n'


def test_compact_blocks_are_what_percent_writes_per_line():
    """Values of every width (a column crossing 9, 99, ... in order or at random), negative ones (a constant -1
    is template text; a varying one goes through `%`), small blocks and %03d fields past 999."""
    fmt, rng = RowFormat(LINE, compact=True), random.Random(7)
    for _ in range(300):
        n = rng.choice([1, 63, 64, 65, 300, 2000])
        pid, k = rng.choice([-1, 7, None]), rng.choice([1234, 5, None])
        ordered = rng.random() < 0.5
        rows = [(10 ** rng.randrange(1, 17) + i if ordered else rng.randrange(10 ** rng.randrange(1, 18)),
                 rng.randrange(10 ** 12), rng.randrange(1000), i if ordered else rng.randrange(-3, 10 ** 5),
                 rng.randrange(1000) if k is None else k, rng.randrange(-2, 3) if pid is None else pid)
                for i in range(n)]
        assert bytes(fmt(np.array(rows, np.int64))) == "".join(LINE % r for r in rows).encode()


def test_coll_and_p2p_lines_in_blocks_equal_the_per_event_ones(tmp_path):
    """300 collectives (SeqNum of 1 to 3 digits, two counts) and p2p groups, with events the block format does not
    take (a float count, a negative start, a '%' in a name) and ops that end unfinished among them: every line as
    _op_pair (or, where it refuses, _records; _unfinished_pair for the op of every 7th tag, whose one channel program
    never ends) writes it at the event's stop, in stop order within its pool."""
    p, host, path = make(tmp_path)
    expected = []
    for tag in range(1, 301):
        odd, progs = tag % 37 == 0, int(tag % 7 == 0)     # 0 programs: complete at end_ops, no KernelCh missing
        if tag % 10 == 0:
            info = OpInfo(tag, "send_recv", [TaskInfo("Send", 2, True, 10, "ncclInt8", n_programs=progs),
                                             TaskInfo("Recv", 0, False, 10.5 if odd else 10, "ncclInt8",
                                                      n_programs=progs)], ts_ns=1000 * tag)
        else:
            info = OpInfo(tag, "all_reduce", [TaskInfo("All%Reduce" if tag % 41 == 0 else "AllReduce", -1, False,
                                                       2.0 if odd else 100 + tag % 2, "ncclFloat32", 0, 1, 2, progs)],
                          seq_number=tag - 1, ts_ns=-5 if tag % 43 == 0 else 1000 * tag)
        host.begin_op(info)
        evs = [h for t in host._ops[tag].tasks for h in t.handles]
        ts1 = 1000 * tag + 777
        host.end_ops((tag,), ts1)
        for ev in evs:
            if progs:
                expected += _unfinished_pair(ev, ts1, 1)
                continue
            try:
                expected += _op_pair(ev, ts1)
            except (TypeError, ValueError):
                expected += _records(ev, ts1)
    host.close()
    with open(path) as f:
        lines = f.readlines()
    for cat, n in (("COLL", 270), ("P2P", 60)):          # a pool each, written at finalize one after the other
        got, want = ([x for x in xs if f'"cat":"{cat}"' in x] for xs in (lines, expected))
        assert got == want and len(got) == 2 * n
    assert sum('"UnfinishedKernelCh":1}' in x for x in lines) == 38 + 2 * 4      # the 7th tags' Colls, p2p parts
