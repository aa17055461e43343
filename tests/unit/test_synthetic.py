"""events.synthetic: deterministic, NCCL-shaped streams (ring all-reduce pattern, steps, clock order)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, drive
from slicetrace.stamps.layout import FLAG_SEND, KIND_CHANNEL, KIND_STEP
from tests.unit.test_plugin import RecPlugin


def test_same_seed_same_stream_other_seed_other_clocks():
    a = [op.steps for op in SyntheticSource(seed=5).ops(3)]
    b = [op.steps for op in SyntheticSource(seed=5).ops(3)]
    c = [op.steps for op in SyntheticSource(seed=6).ops(3)]
    assert all((x == y).all() for x, y in zip(a, b))
    assert not all((x["done_ns"] == y["done_ns"]).all() for x, y in zip(a, c))


@pytest.mark.parametrize("k", [2, 3, 8])
def test_ring_all_reduce_slice_pattern(k):
    spc, loops = 2, 3
    op = SyntheticSource(nranks=k, rank=1, nchannels=2, loops=loops, slices_per_chunk=spc).next_op()
    for ch, steps, chrec in op.programs:
        d = steps["flags"] & FLAG_SEND
        # per loop: send, (2k-3) x recv+send, recv -> 2k-2 sends and 2k-2 recvs per slice of the chunk
        assert (d == 1).sum() == (d == 0).sum() == (2 * k - 2) * spc * loops
        per_loop = len(d) // loops
        assert list(d[:spc]) == [1] * spc and list(d[per_loop - spc:per_loop]) == [0] * spc
        assert set(steps["peer"][d == 1]) == {2 % k} and set(steps["peer"][d == 0]) == {0}
        assert set(steps["kind"]) == {KIND_STEP} and chrec["kind"][0] == KIND_CHANNEL
        assert set(steps["channel"]) == {ch} and set(steps["op"]) == {op.info.tag}


def test_clocks_are_ordered_and_inside_the_kernel_ch():
    src = SyntheticSource(nranks=4, nchannels=3, loops=2, clock_offset_ns=12345, seed=9)
    for op in src.ops(4):
        for _, s, c in op.programs:
            assert (s["wait_ns"] <= s["ready_ns"]).all() and (s["ready_ns"] <= s["done_ns"]).all()
            assert (s["done_ns"][:-1] <= s["wait_ns"][1:]).all()          # one program's slices are sequential
            assert c["ready_ns"][0] < s["wait_ns"].min() and s["done_ns"].max() < c["done_ns"][0]
            assert (s["wait_ns"] - s["wait"] == 12345).all() and (c["done_ns"] - c["done"] == 12345).all()
            assert op.info.ts_ns < c["ready_ns"][0] and c["done_ns"][0] < op.end_ns


def test_steps_grow_per_connection_across_ops():
    src = SyntheticSource(nranks=3, nchannels=1, loops=1, slice_steps=2, funcs=("all_reduce", "send_recv"))
    seen: dict = {}
    for op in src.ops(6):
        s = op.steps
        for key in set(zip(s["channel"].tolist(), (s["flags"] & 1).tolist(), s["peer"].tolist())):
            sel = (s["channel"] == key[0]) & ((s["flags"] & 1) == key[1]) & (s["peer"] == key[2])
            st_ = s["step"][sel].astype(np.int64)
            assert (np.diff(st_) == 2).all()
            if key in seen:
                assert st_[0] == seen[key] + 2
            seen[key] = int(st_[-1])


def test_send_recv_ops_have_two_routed_tasks():
    op = SyntheticSource(nranks=4, rank=0, nchannels=2, funcs=("send_recv",)).next_op()
    assert [(t.func, t.peer, t.is_send, t.n_programs) for t in op.info.tasks] == [("Send", 1, True, 2),
                                                                                   ("Recv", 3, False, 2)]
    ch = op.channels
    assert sorted(zip(ch["peer"].tolist(), (ch["flags"] & 1).tolist())) == [(1, 1), (1, 1), (3, 0), (3, 0)]


@settings(max_examples=15, deadline=None)
@given(nranks=st.integers(2, 6), nchannels=st.integers(1, 3), loops=st.integers(1, 3), batch=st.integers(0, 9),
       funcs=st.sampled_from([("all_reduce",), ("send_recv",), ("all_reduce", "send_recv")]))
def test_driving_a_host_delivers_every_record(nranks, nchannels, loops, batch, funcs):
    p = RecPlugin(mask=int(abi.EventType.KERNEL_STEP | abi.EventType.KERNEL_CH))
    host = EventHost([LoadedPlugin(p)], abi.CommInfo(1, "s", 1, nranks, 0))
    src = SyntheticSource(nranks=nranks, nchannels=nchannels, loops=loops, funcs=funcs, seed=nranks)
    fed = drive(host, src, 3, batch=batch)
    c = host.counters()
    assert c["delivered_kernel_step"] == fed and c["no_parent"] == 0 and c["missing_kernel_ch"] == 0
    assert sum(len(b[2]) for b in p.of("batch")) == fed


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"nranks=1, rank=0"):
        SyntheticSource(nranks=1)
    with pytest.raises(ValueError, match=r"funcs=\('bcast',\)"):
        SyntheticSource(funcs=("bcast",))
