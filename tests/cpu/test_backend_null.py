"""backend='null': no processes, but the stamps of every plan as the cpu backend writes them."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from slicetrace.backend.base import Work, create
from slicetrace.config import Settings
from slicetrace.events.abi import CollDescr
from slicetrace.plan.schedule import P2pPart, plan_collective, plan_p2p
from slicetrace.plan.traffic import expected_slices, stamp_records
from slicetrace.rendezvous import DictStore
from tests.cpu.test_backend import FUNCS, read_stamps
from tests.helpers.plugins import NoopPlugin


def make(world: int = 3, rank: int = 1, **kw):
    return create(Settings(backend="null", buffsize=64 * 1024, p2p_chunksize=4096, **kw), rank, world,
                  DictStore({}), "nulltest")


@pytest.mark.parametrize("func", FUNCS)
def test_stamps_follow_the_plan(func):
    be = make(nchannels=2)
    plan = plan_collective(func, 3, 1, 30011, 4, 2, 2, be.settings.step_bytes)
    x = np.ones(30011 * (3 if func == "reduce_scatter" else 1), np.float32)
    y = np.empty(30011 * (3 if func == "all_gather" else 1), np.float32)
    for tag in (1, 2):                                   # steps persist across ops
        before = be.rings.header["reserved"].copy()
        be.submit(Work(tag, plan, "float32", "sum", x, y, stamp_steps=True, stamp_channels=True))
        recs = read_stamps(be, before)
        steps = [r for r in recs if r[0] == 0]
        assert sum(r[0] == 1 for r in recs) == 2 * len(plan.programs)     # KernelCh start + stop
        assert sorted((ch, bool(f), p, sz) for _, ch, f, p, _, sz, *_ in steps) == \
            sorted((ch, s, p, b) for ch, s, p, _, b in expected_slices(plan))
        assert all(w <= rd <= d for *_, w, rd, d in steps)
        assert all(op == tag for *_, op, _, _, _ in recs)
    be.close()


def test_world1_copies_and_p2p_self():
    be = make(world=1, rank=0)
    x = np.arange(10, dtype=np.int32)
    y = np.zeros(10, np.int32)
    be.submit(Work(1, plan_collective("all_reduce", 1, 0, 10, 4, 0, 1, be.settings.step_bytes), "int32", "sum", x, y))
    assert (y == x).all()
    z = np.zeros(10, np.int32)
    parts = [(P2pPart(0, True, 10, 0), x), (P2pPart(0, False, 10, 1), z)]
    plan = plan_p2p([p for p, _ in parts], 1, 0, 4, 4096, be.settings.step_bytes)
    be.submit(Work(2, plan, "int32", "sum", parts=parts))
    assert (z == x).all()


def test_sampling_and_off():
    be = make()
    plan = plan_collective("all_reduce", 3, 1, 50000, 4, 0, 1, be.settings.step_bytes)
    x = np.ones(50000, np.float32)
    be.submit(Work(1, plan, "float32", "sum", x, x.copy()))
    assert int(be.rings.header["reserved"].sum()) == 0
    be.submit(Work(2, plan, "float32", "sum", x, x.copy(), stamp_steps=True, sample_rate=4))
    n = int(be.rings.header["reserved"].sum())
    assert 0 < n and n + int(be.rings.header["sampled_out"].sum()) == len(expected_slices(plan))
    # exactly as plan.traffic.stamp_records counts them, per program
    assert n == sum(stamp_records(p, 4, True, False)[0] for p in plan.programs)
    assert int(be.rings.header["sampled_out"].sum()) == sum(stamp_records(p, 4, True, False)[1] for p in plan.programs)
    # and the kept ones are the slices whose index in their direction is a multiple of 4
    steps = read_stamps(be, np.zeros_like(be.rings.header["reserved"]))
    ss = plan.proto.slice_steps
    for prog in plan.programs:
        for is_send in (False, True):
            sizes = [m * 4 for prim in prog.prims for _, m in prim.slices
                     if (prim.send_to if is_send else prim.recv_from) is not None]
            want = [(i, b) for i, b in enumerate(sizes) if i % 4 == 0 and b > 0]
            got = sorted((stp, sz) for _, ch, f, _, stp, sz, *_ in steps if ch == prog.channel and bool(f) == is_send)
            assert want and len(got) == len(want), (is_send, got, want)
            assert [((stp - got[0][0]) // ss, sz) for stp, sz in got] == want, is_send


class SeqRecorder(NoopPlugin):
    """A plugin that records the SeqNum of every Coll it is shown."""
    name, version = "seqrec", 8
    seen: list[int] = []

    def __init__(self, settings=None):
        pass

    def init(self, comm, mask):
        mask.value = 2          # Coll
        return None

    def start_event(self, ctx, descr):
        if isinstance(descr, CollDescr):            # parents (API, Group) come too, without a SeqNum
            SeqRecorder.seen.append(descr.seq_number)
        return object()


def test_coll_seq_number_counts_unprofiled_ops_too():
    """NCCL's seqNumber counts every collective of a communicator; pausing the profiler must not shift it."""
    import slicetrace
    SeqRecorder.seen = []
    comm = slicetrace.init(backend="null", profiler_plugin="tests.cpu.test_backend_null:SeqRecorder")
    x = np.ones(8, np.float32)
    comm.all_reduce(x)
    with comm.profiling(False):
        comm.all_reduce(x)
        comm.all_reduce(x)
    comm.all_reduce(x)
    comm.all_gather(x)
    comm.close()
    assert SeqRecorder.seen == [0, 3, 0]


def test_several_ranks_are_told_that_no_data_moves(caplog):
    """A user who picked SLICETRACE_BACKEND=null for a job of several ranks got unchanged outputs and no word."""
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        make(world=2, rank=0)
    assert any("backend='null' moves no data between its 2 ranks" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        make(world=1, rank=0)                 # alone, a collective is a local copy: it does compute
    assert not caplog.records
