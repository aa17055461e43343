"""The ring loop keeps each FIFO slot's view (transport.Conn.slot_views) across ops: ops whose sizes and dtypes
change on one connection still read and write the right bytes of each slot."""
from __future__ import annotations

import numpy as np

from slicetrace.backend.base import Work
from slicetrace.backend.cpu import worker
from slicetrace.backend.cpu.shm import PAGE
from slicetrace.backend.cpu.transport import Conn, Guard
from slicetrace.config import Settings
from slicetrace.plan.schedule import plan_collective


def test_views_follow_size_and_dtype_changes_on_one_connection():
    """Rank 0's ring program of 2-rank all_reduces looped back (its halves meet as the two ranks' would), sizes
    and dtypes changing from op to op (a view kept for another size or type would read other bytes): every
    result is exact."""
    s = Settings(cpu_reclaim="off", buffsize=1 << 16)
    ctl, fifo = memoryview(bytearray(PAGE)).cast("Q"), memoryview(bytearray(s.buffsize))
    rconn, sconn = Conn(ctl, fifo, 0, False, "off"), Conn(ctl, fifo, 0, True, "off")
    rconn.base = sconn.base = 0
    guard = Guard(0, memoryview(bytearray(PAGE)).cast("Q"), memoryview(bytearray(256)), 5.0)
    rng = np.random.default_rng(3)
    for tag, (count, dtype) in enumerate([(2048, "float32"), (1000, "float32"), (2048, "int32"), (64, "float64"),
                                          (2048, "float32"), (8192, "int32"), (1000, "float32")], 1):
        dt = np.dtype(dtype)
        plan = plan_collective("all_reduce", 2, 0, count, dt.itemsize, 0, 1, s.step_bytes)
        x = rng.integers(-1000, 1000, count).astype(dt)
        out = np.zeros_like(x)
        work = Work(tag=tag, plan=plan, dtype=dtype, redop="sum", sendbuf=x, recvbuf=out)
        worker.run_ring(plan.programs[0], worker.RingJob(work, rconn, sconn, None, guard, None))
        h = count // 2
        np.testing.assert_array_equal(out, np.tile(x[:h] + x[h:], 2))
