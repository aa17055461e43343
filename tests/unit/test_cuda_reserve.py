"""Stamp seq ranges the cuda backend reserves per program at submit (stamps.layout, GPU writer rules); no GPU:
the reservation is host code, checked against plan.traffic.stamp_records."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from slicetrace.backend.base import Work
from slicetrace.backend.cuda.layout import ARGS_DTYPE
from slicetrace.backend.cuda.seqs import SeqRanges, copy_regions, copy_windows
from slicetrace.plan.schedule import P2pPart, plan_collective, plan_p2p
from slicetrace.plan.traffic import stamp_records
from slicetrace.stamps.layout import STAMP_DTYPE, RingViews, ring_bytes


def rings(nch=8):
    return RingViews(bytearray(ring_bytes(nch, 64)), nch, 64)


def ranges(rec, progs):
    m = len(progs)
    return [(p.channel, int(b), int(b) + int(n)) for p, b, n in zip(progs, rec["seq_base"][0, :m], rec["seq_n"][0, :m])]


@pytest.mark.parametrize("rate", [1, 3])
@pytest.mark.parametrize("nranks, count", [(3, 1_000_003), (2, 100_000)])    # the second: slice index != per direction
def test_ring_ranges_follow_each_other_and_match_the_plan(rate, nranks, count):
    v, rec = rings(), np.zeros(1, ARGS_DTYPE)
    sr = SeqRanges(v)
    plan = plan_collective("all_reduce", nranks, 1, count, 4, 0, 4, 1 << 19)
    work = Work(1, plan, "float32", "sum", stamp_steps=True, stamp_channels=True, sample_rate=rate)
    seen = []
    for _ in range(3):
        sr.reserve(work, rec)
        seen.append(ranges(rec, plan.programs))
    want = [stamp_records(p, rate, True, True)[0] for p in plan.programs]
    for ch in range(4):
        rs = [r[ch] for r in seen]
        assert rs[0][1] == 1 and all(b - a == want[ch] for _, a, b in rs)
        assert all(rs[i][2] == rs[i + 1][1] for i in range(2))            # back to back, never overlapping
        assert v.header["reserved"][ch] == rs[-1][2] - 1                  # header.reserved = last seq
    # per direction, as the writers sample: 40 a call at 3 ranks, 16 at 2 (20 counting by slice index); 3 calls
    skipped = {(3, 3): 40 * 3, (2, 3): 16 * 3}.get((nranks, rate), 0)
    assert int(v.header["sampled_out"].sum()) == skipped == sum(stamp_records(p, rate, True, True)[1]
                                                                 for p in plan.programs) * 3


def test_p2p_programs_sharing_a_channel_get_disjoint_ranges_in_kernel_order():
    v, rec = rings(), np.zeros(1, ARGS_DTYPE)
    parts = [P2pPart(1, True, 300_000, 0), P2pPart(1, False, 300_000, 1), P2pPart(1, True, 100_000, 2),
             P2pPart(1, False, 5_000, 3)]
    plan = plan_p2p(parts, 2, 0, 4, 1 << 19, 1 << 19, 2)
    work = Work(5, plan, "float32", "sum", parts=[(p, None) for p in parts], stamp_steps=True, stamp_channels=True)
    SeqRanges(v).reserve(work, rec)
    progs = sorted(plan.programs, key=lambda q: (q.channel, q.params["part"]))
    got = ranges(rec, progs)
    for ch in {p.channel for p in progs}:
        rs = sorted((a, b) for c, a, b in got if c == ch)
        assert rs[0][0] == 1 and all(rs[i][1] == rs[i + 1][0] for i in range(len(rs) - 1))
        assert v.header["reserved"][ch] == rs[-1][1] - 1
    assert [b - a for _, a, b in got] == [stamp_records(p, 1, True, True)[0] for p in progs]


def test_kernel_ch_only_reserves_two_per_program_and_nothing_when_off():
    plan = plan_collective("broadcast", 2, 0, 1 << 20, 4, 0, 2, 1 << 19)
    assert len(plan.programs) == 2
    assert [stamp_records(p, 1, False, True) for p in plan.programs] == [(2, 0), (2, 0)]
    assert [stamp_records(p, 1, False, False) for p in plan.programs] == [(0, 0), (0, 0)]


def test_programs_sharing_a_channel_that_one_op_would_lap_write_nothing_a_lone_program_keeps_its_newest():
    v, rec = RingViews(bytearray(ring_bytes(2, 64)), 2, 64), np.zeros(1, ARGS_DTYPE)
    parts = [P2pPart(1, True, 20_000_000, 0), P2pPart(1, False, 20_000_000, 1)]
    shared = plan_p2p(parts, 2, 0, 4, 1 << 19, 1 << 19, 1)            # both programs on channel 0
    work = Work(1, shared, "float32", "sum", parts=[(p, None) for p in parts], stamp_steps=True, stamp_channels=True)
    SeqRanges(v).reserve(work, rec)
    want = [stamp_records(p, 1, True, True)[0] for p in sorted(shared.programs, key=lambda q: q.params["part"])]
    assert min(want) > 64 and list(rec["seq_n"][0, :2]) == [0, 0]
    assert v.header["reserved"][0] == sum(want)                       # the range is still reserved: counted lost
    lone = plan_collective("all_reduce", 2, 0, 20_000_000, 4, 0, 1, 1 << 19)
    rec = np.zeros(1, ARGS_DTYPE)
    SeqRanges(v).reserve(Work(2, lone, "float32", "sum", stamp_steps=True, stamp_channels=True), rec)
    assert rec["seq_n"][0, 0] == stamp_records(lone.programs[0], 1, True, True)[0] > 64


def apply_regions(regions, src: np.ndarray, dst: np.ndarray) -> None:
    """What memcpy2DAsync does with each region (both buffers: a row per channel)."""
    for off, pitch, width, height in regions:
        for r in range(height):
            a = off + r * pitch
            dst[a:a + width] = src[a:a + width]


@settings(max_examples=300, deadline=None)
@given(nch=st.integers(1, 6), slots_log=st.integers(6, 7), data=st.data())
def test_copy_windows_bring_every_wanted_seq_and_stay_few(nch, slots_log, data):
    slots = 1 << slots_log
    lo = np.array(data.draw(st.lists(st.integers(0, 1000), min_size=nch, max_size=nch)), dtype=np.int64)
    grow = data.draw(st.lists(st.integers(0, 3 * slots), min_size=nch, max_size=nch))
    hi = lo + np.array(grow, dtype=np.int64)
    e = STAMP_DTYPE.itemsize
    dev = np.random.default_rng(nch).integers(1, 255, nch * slots * e, dtype=np.uint8)
    host = np.zeros_like(dev)
    win = copy_windows(lo, hi, slots)
    apply_regions(copy_regions(win, slots), dev, host)
    for c in range(nch):
        for q in range(max(int(lo[c]) + 1, int(hi[c]) - slots + 1), int(hi[c]) + 1):
            a = (c * slots + q % slots) * e
            assert (host[a:a + e] == dev[a:a + e]).all(), (c, q)
    if not (hi > lo).any():
        assert win == []
    assert len(win) <= 2 * max(1, int((hi > lo).sum()))   # at most two pieces (a wrap) per window


def test_channels_that_moved_alike_share_one_copy():
    lo, hi = np.full(8, 130, np.int64), np.full(8, 170, np.int64)
    regions = copy_regions(copy_windows(lo, hi, 64), 64)
    assert regions == [(3 * 48, 64 * 48, 40 * 48, 8)]         # slots 3..42 (seqs 131..170) of 8 rows, one call
    lo[3] = hi[3] = 170                                        # a channel with nothing new inside the span
    assert copy_windows(lo, hi, 64) == [(0, 8, 3, 40)]
    lo[:] = 120
    assert copy_windows(lo, hi, 64) == [(0, 8, 57, 7), (0, 8, 0, 43)]      # 121..170 wraps at slot 64
    lo[5], hi[5] = 5000, 5010                                  # a channel far ahead: one window per channel
    w = copy_windows(lo, hi, 64)
    assert all(c1 - c0 == 1 for c0, c1, _, _ in w) and {c0 for c0, _, _, _ in w} == set(range(8))


class FakeRuntime:
    """The cupy runtime calls CommMemory.fetch makes, on host memory (memcpy2DAsync through real addresses)."""

    def __init__(self, ready=True):
        self.device, self.calls, self.ready = 0, [], ready

    def getDevice(self):
        return self.device

    def setDevice(self, d):
        self.calls.append(d)
        self.device = d

    def memcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        import ctypes
        assert kind == 2 and self.device == 1             # device to host, on the rank's device
        for r in range(height):
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)

    def streamQuery(self, stream):
        return 0 if self.ready else 600                   # cudaErrorNotReady


def _fake_mem(nch, slots, rt):
    from slicetrace.backend.cuda.ipc import CommMemory
    from slicetrace.stamps.layout import HEADER_DTYPE
    m = object.__new__(CommMemory)
    host = np.zeros(ring_bytes(nch, slots, merged=True), np.uint8)
    dev = np.random.default_rng(0).integers(1, 255, nch * slots * STAMP_DTYPE.itemsize, dtype=np.uint8)
    m.rank, m.nring, m.slots, m._rt = 0, nch, slots, rt
    m._mirror, m.dring = host.ctypes.data + nch * HEADER_DTYPE.itemsize, dev.ctypes.data
    return m, RingViews(host, nch, slots, merged=True), dev


def test_fetch_copies_on_the_ranks_device_and_puts_the_callers_device_back():
    rt = FakeRuntime()
    m, v, dev = _fake_mem(4, 64, rt)
    m.fetch(np.array([0, 0, 10, 0]), np.array([5, 5, 20, 0]), 1, 0, 1.0)
    assert rt.calls == [1, 0] and rt.device == 0
    d = dev.view(STAMP_DTYPE).reshape(4, 64)
    assert v.started is v.completed                       # merged: one ring, read as both
    assert (v.started[2][11:21].view(np.uint8) == d[2, 11:21].view(np.uint8)).all()
    assert (v.started[0][1:6].view(np.uint8) == d[0, 1:6].view(np.uint8)).all()
    outside = np.r_[0, 21:64]                             # one shared span, seqs 1..20 of channels 0..2
    assert (v.started[2][outside].view(np.uint8) == 0).all() and (v.started[3].view(np.uint8) == 0).all()


def test_a_copy_that_never_finishes_times_out_and_still_restores_the_device():
    from slicetrace.errors import CommTimeoutError
    rt = FakeRuntime(ready=False)
    m, _, _ = _fake_mem(2, 64, rt)
    with pytest.raises(CommTimeoutError, match="timeout_s=0.01"):
        m.fetch(np.array([0, 0]), np.array([3, 3]), 1, 0, 0.01)
    assert rt.device == 0


class CopyRuntime:
    """memcpyAsync/streamQuery on host memory, as CommMemory.progress calls them."""

    def __init__(self):
        self.copies = []

    def memcpyAsync(self, dst, src, n, kind, stream):
        import ctypes
        assert kind == 2 and stream == 7
        self.copies.append(src)
        ctypes.memmove(dst, src, n)

    def streamQuery(self, stream):
        return 0


def _two_ranks(nconn):
    from slicetrace.backend.cuda.ipc import CommMemory
    from slicetrace.backend.cuda.layout import CTRL
    mems = [np.zeros((CTRL + 2 * nconn * 128) // 8, np.uint64) for _ in range(2)]
    m = object.__new__(CommMemory)
    m.rank, m.world, m.nconn, m._rt = 0, 2, nconn, CopyRuntime()
    m.peer_base = [a.ctypes.data for a in mems]
    tail = lambda r, k: (r, (CTRL + k * 128) // 8)                       # noqa: E731
    head = lambda r, k: (r, (CTRL + (nconn + k) * 128) // 8)             # noqa: E731
    return m, mems, tail, head


def test_a_stuck_op_reports_where_each_connection_stands_read_from_both_ends():
    m, mems, tail, head = _two_ranks(4)
    assert m.progress(7) == "no connection of this rank has moved yet"
    for c in range(4):                   # world 2: slot k = channel on both sides
        for (r, i), v in ((tail(0, c), 40), (head(1, c), 40), (tail(1, c), 40), (head(0, c), 38)):
            mems[r][i] = v
    for r, i in (tail(0, 2), head(1, 2)):
        mems[r][i] = 36                  # channel 2: rank 0 consumed all rank 1 posted, and waits for more
    m._rt.copies.clear()
    text = m.progress(7)
    assert text == ("connection steps: channels 0-1,3: from rank 1 posted 40 consumed 40, to rank 1 posted 40 "
                    "consumed 38; channels 2: from rank 1 posted 36 consumed 36, to rank 1 posted 40 consumed 38")
    assert sorted(m._rt.copies) == sorted(m.peer_base)      # both ends read


def test_progress_never_raises():
    m, _, _, _ = _two_ranks(2)
    m._rt.memcpyAsync = lambda *a: (_ for _ in ()).throw(RuntimeError("cudaErrorIllegalAddress"))
    assert m.progress(7) == "(connection progress unavailable: RuntimeError: cudaErrorIllegalAddress)"
    m._rt = FakeRuntime(ready=False)
    m._rt.memcpy2DAsync = None
    m._rt.memcpyAsync = lambda *a: None
    assert "did not finish" in m.progress(7, timeout_s=0.01)


def test_threads_halve_in_whole_warps_under_the_kernels_launch_bounds():
    from slicetrace.backend.cuda.args import threads_for
    assert [threads_for(n, 32, 512, 544) for n in (1 << 20, 1 << 19, 1 << 18, 1 << 10)] == [544, 288, 160, 96]
    assert [threads_for(n, 32, 512) for n in (1 << 20, 1 << 19, 1 << 18, 1 << 10)] == [512, 256, 128, 96]
    for cap in (544, 512):          # 544: 512 workers, the ST_MAX_THREADS=544 measurement variant
        for n in (0, 4096, 1 << 16, 1 << 20, 1 << 30):
            t = threads_for(n, 32, 1024, cap)
            assert t % 32 == 0 and 96 <= t <= cap, (cap, n, t)
    assert threads_for(1 << 30, 64, 1024, 512) == 512
