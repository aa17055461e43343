"""The drain's sequence protocol: pairing, order, and exact loss accounting (DESIGN section 3)."""
from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings, strategies as st

from slicetrace.stamps.drain import LOST_LAG, Drain
from slicetrace.stamps.layout import (FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP, STAMP_DTYPE, RingViews,
                                      RingWriter, provisional_word, ring_bytes)


class Recorder:
    """A consumer that keeps what the drain hands over."""

    def __init__(self):
        self.step_calls, self.channels, self.ended, self.drops = [], [], [], Counter()

    def channel(self, tag, recs):
        self.channels.append((tag, recs.copy()))

    def steps(self, tag, recs):
        self.step_calls.append((tag, recs.copy()))

    def end_op(self, tag, ts):
        self.ended.append(tag)

    def drop(self, reason, n=1):
        self.drops[reason] += n


def setup(nch=1, slots=64, expect=None):
    """Rings, a recording consumer, a drain over them and a writer on channel 0."""
    v = rings(nch, slots)
    sink = Recorder()
    d = Drain(v, sink)
    if expect is not None:
        d.expect(expect)
    return v, sink, d, RingWriter(v, 0)


def rings(nch=2, slots=64):
    return RingViews(bytearray(ring_bytes(nch, slots)), nch, slots)


def write_op(w: RingWriter, tag: int, nslices: int, t0: int = 1000, peer: int = 1):
    """A KernelCh start, nslices send steps, then the KernelCh stop, as a backend writes them."""
    w.channel(False, 0, tag, 0, t0)
    for i in range(nslices):
        s = w.start(KIND_STEP, FLAG_SEND, tag, i * 2, 4096, peer, t0 + 10 * i, t0 + 10 * i + 3)
        w.complete(s, KIND_STEP, FLAG_SEND, tag, i * 2, 4096, peer, t0 + 10 * i + 7)
    w.channel(True, 0, tag, 0, t0 + 10 * nslices)


def write_ops(d: Drain, ops) -> int:
    """Ops 1, 2, ... as (writer, slices, poll after it); a final poll; returns the records written."""
    written = 0
    for tag, (w, n, poll) in enumerate(ops, start=1):
        d.op_submitted(tag, lambda: True)
        write_op(w, tag, n)
        written += n + 2
        if poll:
            d.poll_once()
    d.poll_once()
    return written


def test_pairs_arrive_in_order_grouped_by_op_then_end_op():
    v, sink, d, w = setup(2)
    for tag in (1, 2):
        d.op_submitted(tag, lambda: True)
        write_op(w, tag, 5, t0=tag * 1000)
    d.poll_once()
    assert [t for t, _ in sink.step_calls] == [1, 2]
    assert [len(r) for _, r in sink.step_calls] == [5, 5]
    r = sink.step_calls[0][1]
    assert list(r["step"]) == [0, 2, 4, 6, 8] and (r["ready"] - r["wait"] == 3).all() and (r["done"] > r["ready"]).all()
    assert [t for t, _ in sink.channels] == [1, 2]
    ch = sink.channels[0][1][0]
    assert (ch["ready"], ch["done"]) == (1000, 1050)
    assert sink.ended == [1, 2] and not sink.drops


def test_clock_offset_maps_device_clock_to_host_timeline():
    v, sink, d, w = setup(2)
    d.offset_ns = 5_000
    d.op_submitted(7, lambda: True)
    write_op(RingWriter(v, 1), 7, 1)
    d.poll_once()
    rec = sink.step_calls[0][1][0]
    assert rec["channel"] == 1 and rec["ready_ns"] == rec["ready"] + 5000


def test_flags_reach_the_host_as_flag_send_alone():
    """PAIRED_DTYPE's flags byte is KERNEL_STEP_DTYPE's is_send: stray bits from a writer never leak into it,
    with or without KernelCh records in the poll."""
    for with_ch in (True, False):
        v, sink, d, w = setup(1)
        d.op_submitted(1, lambda: True)
        if with_ch:
            w.channel(False, 0, 1, 0, 100)
        for i, fl in enumerate((FLAG_SEND | 0x80, 0x40, FLAG_SEND)):
            s = w.start(KIND_STEP, fl, 1, i * 2, 4096, 1, 200 + i, 201 + i)
            w.complete(s, KIND_STEP, fl, 1, i * 2, 4096, 1, 205 + i)
        if with_ch:
            w.channel(True, 0, 1, 0, 300)
        d.poll_once()
        steps = np.concatenate([r for _, r in sink.step_calls])
        assert list(steps["flags"]) == [1, 0, 1], with_ch
        if with_ch:
            assert list(sink.channels[0][1]["flags"]) == [0]       # the stop bit is gone once paired


def test_entry_visible_out_of_order_waits_for_its_predecessor():
    v, sink, d, w = setup(2)
    d.op_submitted(1, lambda: False)
    s1 = w.start(KIND_STEP, 0, 1, 0, 8, 1, 1, 2)
    s2 = w.start(KIND_STEP, 0, 1, 1, 8, 1, 3, 4)
    w.complete(s2, KIND_STEP, 0, 1, 1, 8, 1, 5)        # seq 2 complete, seq 1 still in flight
    d.poll_once()
    assert sink.step_calls == [] and d.cursor[0] == 0
    w.complete(s1, KIND_STEP, 0, 1, 0, 8, 1, 6)
    d.poll_once()
    assert [list(r["step"]) for _, r in sink.step_calls] == [[0, 1]]


def test_overrun_counts_exactly_what_was_lapped():
    v, sink, d, w = setup(1, 64)
    d.op_submitted(1, lambda: True)
    for i in range(200):
        s = w.start(KIND_STEP, FLAG_SEND, 1, i, 8, 1, i, i)
        w.complete(s, KIND_STEP, FLAG_SEND, 1, i, 8, 1, i)
    d.poll_once()
    got = sum(len(r) for _, r in sink.step_calls)
    assert sink.drops["overrun"] == 200 - 64 and got == 64
    assert list(sink.step_calls[-1][1]["step"])[-1] == 199


def test_slot_being_reused_is_not_trusted():
    v, sink, d, w = setup(1, 64)
    d.op_submitted(1, lambda: False)
    s = w.start(KIND_STEP, 0, 1, 0, 8, 1, 1, 2)
    w.complete(s, KIND_STEP, 0, 1, 0, 8, 1, 3)
    v.header["reserved"][0] = 65          # a writer reserved seq 65 (same slot) but has not written it yet
    d._drain_many(np.array([0]), [], False)
    # seq 1 is lapped by seq 65 (counted once, as overrun); 2..64 were never written and 65 is not yet: the read
    # stops before them, undecided while an op runs
    assert sink.step_calls == [] and sink.drops == Counter({"overrun": 1}) and int(d.cursor[0]) == 1


def test_started_without_completion_is_unpaired_once_the_op_ended():
    v, sink, d, w = setup(2)
    d.op_submitted(3, lambda: True)
    w.start(KIND_STEP, 0, 3, 0, 8, 1, 1, 2)             # never completed (writer died)
    s = w.start(KIND_STEP, 0, 3, 1, 8, 1, 3, 4)
    w.complete(s, KIND_STEP, 0, 3, 1, 8, 1, 5)
    d.poll_once()
    assert sink.drops["unpaired"] == 1 and sum(len(r) for _, r in sink.step_calls) == 1
    assert sink.ended == [3]


def test_stamps_of_unknown_ops_are_counted_as_no_parent_and_sampling_is_counted():
    v, sink, d, w = setup(2)
    write_op(w, 99, 2)                                   # nobody submitted op 99
    w.sampled_out(5)
    d.poll_once()
    assert sink.drops["no_parent"] == 3 and sink.drops["sampled_out"] == 5


@settings(max_examples=60, deadline=None)
@given(slots=st.sampled_from([64, 128]), plan=st.lists(st.integers(0, 40), min_size=1, max_size=12),
       polls=st.lists(st.booleans(), min_size=12, max_size=12))
def test_every_record_is_delivered_once_or_counted_lost(slots, plan, polls):
    v, sink, d, w = setup(1, slots)
    written = write_ops(d, [(w, n, poll) for n, poll in zip(plan, polls)])
    got = sum(len(r) for _, r in sink.step_calls) + 2 * sum(len(r) for _, r in sink.channels)
    assert got + sink.drops["overrun"] + sink.drops["unpaired"] == written
    steps = [(t, int(s)) for t, r in sink.step_calls for s in r["step"]]
    assert len(steps) == len(set(steps))                     # never twice
    assert [t for t, _ in steps] == sorted(t for t, _ in steps)
    assert d.idle()


def test_dtype_is_the_documented_48_bytes():
    assert STAMP_DTYPE.itemsize == 48 and [STAMP_DTYPE.fields[f][1] for f in ("seq", "op", "kind")] == [0, 32, 46]


def test_steps_stream_out_while_the_channel_program_is_still_running():
    v, sink, d, w = setup(expect=1)
    w.channel(False, 0, 1, 0, 100)
    for i in range(300):                       # far more than the ring holds: no overrun if drained as we go
        s = w.start(KIND_STEP, FLAG_SEND, 1, i, 8, 1, 100 + i, 101 + i)
        w.complete(s, KIND_STEP, FLAG_SEND, 1, i, 8, 1, 102 + i)
        if i % 20 == 19:
            d.poll_once()
    assert sum(len(r) for _, r in sink.step_calls) == 300 and not sink.drops and sink.channels == []
    w.channel(True, 0, 1, 0, 999)
    d.op_submitted(1, lambda: True)
    d.poll_once()
    assert len(sink.channels) == 1 and (sink.channels[0][1]["ready"][0], sink.channels[0][1]["done"][0]) == (100, 999)
    assert sink.ended == [1]


def test_kernel_ch_waits_for_steps_that_became_visible_late():
    v, sink, d, w = setup(expect=1)
    w.channel(False, 0, 1, 0, 100)
    s = w.start(KIND_STEP, 0, 1, 0, 8, 1, 1, 2)
    w.channel(True, 0, 1, 0, 200)                        # the channel stop is visible before the step's completion
    d.poll_once()
    assert sink.channels == []
    w.complete(s, KIND_STEP, 0, 1, 0, 8, 1, 3)
    d.poll_once()
    assert len(sink.step_calls) == 1 and len(sink.channels) == 1


def test_next_op_in_flight_is_not_mistaken_for_lost_when_the_previous_op_ends():
    v, sink, d, w = setup(1, 64)
    d.expect(1)
    write_op(w, 1, 3)
    d.expect(2)
    s = w.start(KIND_STEP, 0, 2, 0, 8, 1, 1, 2)         # op 2 has begun; op 1's done is only noticed now
    d.op_submitted(1, lambda: True)
    d.op_submitted(2, lambda: False)
    d.poll_once()
    # op 1 is read whole (its KernelCh and 3 steps, seqs 1-5) and op 2's started slice (seq 6) waits, not lost. Op 1
    # has no exact snapshot: the one taken when its done is seen holds seq 6, so op 1 ends only once the cursor
    # passes seq 6 (an op-1 stamp could be reserved there as far as the drain knows)
    assert sink.ended == [] and not sink.drops and int(d.cursor[0]) == 5
    assert [t for t, _ in sink.step_calls] == [1] and len(sink.channels) == 1
    w.complete(s, KIND_STEP, 0, 2, 0, 8, 1, 3)
    d.op_submitted(2, lambda: True)
    d.poll_once()
    assert sink.ended == [1, 2] and not sink.drops
    assert [t for t, _ in sink.step_calls] == [1, 2]


def test_stop_settles_everything_and_counts_what_never_completed():
    v, sink, d, w = setup(1, 64)
    d.expect(4)
    w.channel(False, 0, 4, 0, 1)                         # the program never stopped
    w.start(KIND_STEP, 0, 4, 0, 8, 1, 1, 2)              # nor did this slice
    d.stop()
    assert sink.drops["unpaired"] == 2 and sink.ended == [4]


def test_many_channels_drain_in_one_pass_each_cut_at_its_own_gap():
    v, sink, d, w = setup(4, 64)
    ws = [RingWriter(v, c) for c in range(4)]
    d.expect(1)
    for c in (0, 2, 3):
        write_op(ws[c], 1, 3 + c, t0=100 * c)
    ws[1].channel(False, 0, 1, 0, 5)
    held = ws[1].start(KIND_STEP, 0, 1, 0, 8, 1, 1, 2)      # channel 1 stuck at its first slice
    later = ws[1].start(KIND_STEP, 0, 1, 1, 8, 1, 3, 4)
    ws[1].complete(later, KIND_STEP, 0, 1, 1, 8, 1, 5)
    d.poll_once()
    steps = np.concatenate([r for _, r in sink.step_calls])
    assert sorted(Counter(steps["channel"].tolist()).items()) == [(0, 3), (2, 5), (3, 6)]
    for c in (0, 2, 3):
        assert list(steps[steps["channel"] == c]["step"]) == [2 * i for i in range(3 + c)]
    assert list(d.cursor) == [5, 1, 7, 8]
    chans = np.concatenate([r for _, r in sink.channels])       # one run per op and kind, across channels
    assert len(sink.channels) == 1 and sorted(chans["channel"].tolist()) == [0, 2, 3]
    ws[1].complete(held, KIND_STEP, 0, 1, 0, 8, 1, 6)
    ws[1].channel(True, 0, 1, 0, 9)
    d.op_submitted(1, lambda: True)
    d.poll_once()
    last = sink.step_calls[-1][1]
    assert list(last["channel"]) == [1, 1] and list(last["step"]) == [0, 1]
    ch1 = [r for _, rs in sink.channels for r in rs if r["channel"] == 1]
    assert len(ch1) == 1 and (ch1[0]["ready"], ch1[0]["done"]) == (5, 9)
    assert sink.ended == [1] and not sink.drops


def test_many_channels_overrun_and_unpaired_are_counted_per_channel():
    v, sink, d, w = setup(3, 64)
    d.op_submitted(1, lambda: True)
    ws = [RingWriter(v, c) for c in range(3)]
    for i in range(100):                                   # channel 0 laps its ring by 36
        s = ws[0].start(KIND_STEP, 0, 1, i, 8, 1, i, i)
        ws[0].complete(s, KIND_STEP, 0, 1, i, 8, 1, i)
    ws[1].start(KIND_STEP, 0, 1, 0, 8, 1, 1, 2)           # never completed, op done: unpaired
    s = ws[1].start(KIND_STEP, 0, 1, 1, 8, 1, 1, 2)
    ws[1].complete(s, KIND_STEP, 0, 1, 1, 8, 1, 3)
    write_op(ws[2], 1, 4)
    d.poll_once()
    steps = np.concatenate([r for _, r in sink.step_calls])
    assert sink.drops["overrun"] == 36 and sink.drops["unpaired"] == 1
    assert (steps["channel"] == 0).sum() == 64 and (steps["channel"] == 1).sum() == 1
    assert (steps["channel"] == 2).sum() == 4 and sink.ended == [1]


@settings(max_examples=40, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30), st.booleans()), min_size=1, max_size=15))
def test_many_channels_every_record_delivered_once_or_counted(plan):
    v, sink, d, w = setup(4, 64)
    ws = [RingWriter(v, c) for c in range(4)]
    written = write_ops(d, [(ws[c], n, poll) for c, n, poll in plan])
    got = sum(len(r) for _, r in sink.step_calls) + 2 * sum(len(r) for _, r in sink.channels)
    assert got + sink.drops["overrun"] + sink.drops["unpaired"] == written
    for c in range(4):                                     # per channel: tags and steps in seq order
        rows = [(t, int(s)) for t, r in sink.step_calls for s, ch in zip(r["step"], r["channel"]) if ch == c]
        assert rows == sorted(rows) and len(rows) == len(set(rows))
    assert d.idle()



@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sets(st.integers(0, 3), min_size=1), st.integers(0, 3)), min_size=1, max_size=8),
       polls=st.sets(st.integers(0, 200)))
def test_kernel_ch_start_and_stop_pair_across_channels_ops_and_polls(ops, polls):
    """Starts of every channel, then steps, then stops; the drain polls at arbitrary points in between, so a
    pair may sit in one poll or straddle two: each KernelCh arrives once with its own start and stop clocks."""
    v, sink, d, _ = setup(4, 1024)
    ws = [RingWriter(v, c) for c in range(4)]
    writes, want = [], set()
    for tag, (chans, n) in enumerate(ops, start=1):
        d.expect(tag)
        for c in sorted(chans):
            writes.append(lambda c=c, tag=tag: ws[c].channel(False, 0, tag, 0, tag * 1000 + c))
        for c in sorted(chans):
            for i in range(n):
                def step(c=c, tag=tag, i=i):
                    s = ws[c].start(KIND_STEP, FLAG_SEND, tag, i, 64, 1, 1, 2)
                    ws[c].complete(s, KIND_STEP, FLAG_SEND, tag, i, 64, 1, 3)
                writes.append(step)
        for c in sorted(chans):
            writes.append(lambda c=c, tag=tag: ws[c].channel(True, 0, tag, 0, tag * 1000 + c + 500))
            want.add((tag, c, tag * 1000 + c, tag * 1000 + c + 500))
        writes.append(lambda tag=tag: d.op_submitted(tag, lambda: True))     # the op has returned
    for k, write in enumerate(writes):
        write()
        if k in polls:
            d.poll_once()
    d.poll_once()
    got = [(int(r["op"]), int(r["channel"]), int(r["ready"]), int(r["done"]))
           for _, recs in sink.channels for r in recs]
    assert sorted(got) == sorted(want) and not sink.drops["unpaired"] and not d._open
    assert all(int(r["wait"]) == int(r["ready"]) and not r["flags"] & 2 for _, recs in sink.channels for r in recs)


def _entry(v, ch, seq, kind, flags, op, step, size, peer, wait, ready, done, word=None):
    """Payload of seq in both rings, published with `word` (None: left unpublished)."""
    i = seq & (v.slots - 1)
    v.started[ch][i] = (0, wait, ready, 0, op, step, size, peer, kind, flags)
    v.completed[ch][i] = (0, 0, 0, done, op, step, size, peer, kind, flags)
    if word is not None:
        v.started[ch]["seq"][i] = v.completed[ch]["seq"][i] = word


def gpu_program(v, tag, nslices, ch=0, t0=100, stop=True):
    """A channel program as the CUDA backend writes it: its seq range reserved by the host first (KernelCh
    start and stop, then the slices), every entry written whole with a provisional seq word; stop=False: the
    kernel is still running, so its entries are not visible yet. Returns (start seq, stop seq)."""
    q = int(v.header["reserved"][ch]) + 1
    v.header["reserved"][ch] = q + 1 + nslices
    word = (lambda s: provisional_word(s, tag)) if stop else (lambda s: None)
    _entry(v, ch, q, KIND_CHANNEL, 0, tag, 0, 0, 1, t0, t0, t0, word(q))
    for i in range(nslices):
        s = q + 2 + i
        _entry(v, ch, s, KIND_STEP, FLAG_SEND, tag, 2 * i, 64, 1, t0 + 10 * i, t0 + 10 * i + 1, t0 + 10 * i + 5,
               word(s))
    if stop:
        _entry(v, ch, q + 1, KIND_CHANNEL, FLAG_CH_STOP, tag, 0, 0, 1, t0 + 999, t0 + 999, t0 + 999, word(q + 1))
    return q, q + 1


def test_gpu_program_is_delivered_whole_once_its_op_completed():
    v, sink, d, w = setup(1, 64)
    done = {"v": False}
    d.op_submitted(1, lambda: done["v"])
    gpu_program(v, 1, 5)
    d.poll_once()                   # provisional words of a running op are not trusted
    assert sink.step_calls == [] and sink.channels == [] and d.cursor[0] == 0 and not sink.drops
    done["v"] = True
    d.poll_once()
    assert [len(r) for _, r in sink.step_calls] == [5] and list(sink.step_calls[0][1]["step"]) == [0, 2, 4, 6, 8]
    ch = sink.channels[0][1][0]
    assert (ch["ready"], ch["done"]) == (100, 1099) and sink.ended == [1] and not sink.drops


def test_provisional_word_of_another_op_or_an_older_lap_is_not_trusted():
    v, sink, d, w = setup(1, 64)
    d.op_submitted(1, lambda: True)
    d.op_submitted(2, lambda: False)
    gpu_program(v, 1, 2)
    q = int(v.header["reserved"][0]) + 1
    v.header["reserved"][0] = q
    _entry(v, 0, q, KIND_STEP, 0, 2, 0, 8, 1, 1, 2, 3, provisional_word(q, 2))      # op 2 is still running
    d.poll_once()
    assert sum(len(r) for _, r in sink.step_calls) == 2 and d.cursor[0] == q - 1   # op 1 ends with op 2's seq
    v.started[0]["seq"][q & 63] = v.completed[0]["seq"][q & 63] = provisional_word(q - 64, 2)   # a lap ago
    d._ops[2].done_fn = lambda: True
    d.poll_once()
    assert d.cursor[0] == q - 1 and sum(len(r) for _, r in sink.step_calls) == 2
    v.started[0]["seq"][q & 63] = v.completed[0]["seq"][q & 63] = provisional_word(q, 2)
    d.poll_once()
    assert sum(len(r) for _, r in sink.step_calls) == 3 and sink.ended == [1, 2] and not sink.drops


def test_long_program_behind_an_early_stop_is_not_declared_lost_while_it_runs():
    v, sink, d, w = setup(1, 8192)
    done = {"v": False}
    d.op_submitted(1, lambda: done["v"])
    gpu_program(v, 1, LOST_LAG + 100, stop=False)        # more slices than LOST_LAG behind the unpublished stop
    d.poll_once()
    assert not sink.drops and sink.step_calls == []
    v.header["reserved"][0] = 0
    gpu_program(v, 1, LOST_LAG + 100)                 # the same program ends: everything becomes visible
    done["v"] = True
    d.poll_once()
    assert sum(len(r) for _, r in sink.step_calls) == LOST_LAG + 100 and len(sink.channels) == 1
    assert not sink.drops and sink.ended == [1]


def test_entry_of_a_completed_op_with_an_exact_snapshot_that_never_came_is_lost_at_once():
    v, sink, d, w = setup(1, 64)
    gpu_program(v, 1, 4)
    v.started[0]["seq"][4] = v.completed[0]["seq"][4] = 0          # the kernel never wrote its third entry
    snap = v.header["reserved"].copy()
    d.op_submitted(1, lambda: True, snap)
    d.poll_once()
    assert sink.drops == Counter({"unwritten": 1}) and sum(len(r) for _, r in sink.step_calls) == 3
    assert len(sink.channels) == 1 and sink.ended == [1] and d.idle()


def _device_setup(slots=64):
    """Host rings the drain reads, 'device' rings the writer fills, and a fetch that logs its calls."""
    v, dev, sink = rings(1, slots), rings(1, slots), Recorder()
    calls = []

    def fetch(lo, hi):
        calls.append((int(lo[0]), int(hi[0])))
        for s in range(int(lo[0]) + 1, int(hi[0]) + 1):
            i = s & (slots - 1)
            v.started[0][i], v.completed[0][i] = dev.started[0][i], dev.completed[0][i]

    return v, dev, sink, Drain(v, sink, fetch=fetch), calls


def test_device_rings_are_fetched_once_per_completed_range_and_never_for_a_running_op():
    v, dev, sink, d, calls = _device_setup()
    done = {1: False, 2: False}
    for tag in (1, 2):
        gpu_program(dev, tag, 4)                   # the host reserves in `dev`'s header: mirror it
        v.header["reserved"][0] = dev.header["reserved"][0]
        d.op_submitted(tag, lambda t=tag: done[t], v.header["reserved"].copy())
    d.poll_once()
    assert calls == [] and sink.step_calls == []   # nothing done: nothing copied, nothing taken
    done[1] = True
    d.poll_once()
    assert calls == [(0, 6)] and [t for t, _ in sink.step_calls] == [1] and sink.ended == [1]
    d.poll_once()
    assert calls == [(0, 6)]                       # a range is copied once
    done[2] = True
    d.poll_once()
    assert calls == [(0, 6), (6, 12)] and sink.ended == [1, 2] and not sink.drops


def test_a_failing_fetch_at_stop_is_recorded_not_raised():
    v, dev, sink, _, _ = _device_setup()

    def broken(lo, hi):
        raise RuntimeError("device gone")

    d = Drain(v, sink, fetch=broken)
    gpu_program(dev, 1, 3)
    v.header["reserved"][0] = dev.header["reserved"][0]
    d.op_submitted(1, lambda: True, v.header["reserved"].copy())
    d.stop()
    assert isinstance(d.error, RuntimeError)


def test_device_rings_are_read_no_further_than_fetched_while_ops_are_queued():
    """Thousands of ops may be queued on the GPU: a poll reads the completed ops' entries, not theirs."""
    v, dev, sink, d, calls = _device_setup(slots=1024)
    done = {}
    for tag in range(1, 41):
        gpu_program(dev, tag, 4)
        v.header["reserved"][0] = dev.header["reserved"][0]
        done[tag] = tag <= 2
        d.op_submitted(tag, lambda t=tag: done[t], v.header["reserved"].copy())
    for _ in range(3):
        d.poll_once()
    assert calls == [(0, 12)] and sink.ended == [1, 2]
    assert d.rows_read == 12                       # not 3 polls x 240 entries
    for t in done:
        done[t] = True
    d.poll_once()
    assert sink.ended == list(range(1, 41)) and not sink.drops and d.rows_read == 240


def test_thread_init_runs_first_in_the_drain_thread_and_its_failure_is_reported():
    """The cuda backend selects the rank's device there: a new thread's first CUDA call would otherwise make a
    context on GPU 0 in every rank's process."""
    import threading
    seen = []
    v = rings(1, 64)
    d = Drain(v, Recorder(), thread_init=lambda: seen.append(threading.current_thread().name))
    d.start()
    d.stop(5.0)
    assert seen == ["slicetrace-drain"] and d.error is None

    def boom():
        raise RuntimeError("no device")
    d = Drain(v, Recorder(), thread_init=boom)
    d.start()
    d._thread.join(5.0)
    assert not d._thread.is_alive() and isinstance(d.error, RuntimeError)
    d.stop(5.0)


@given(st.lists(st.integers(0, 2**31 - 1), max_size=40, unique=True), st.integers(0, 2**31 - 50),
       st.integers(0, 40), st.lists(st.integers(0, 2**31 - 1), max_size=60))
@settings(max_examples=200, deadline=None)
def test_member_is_isin(vals, start, run, xs):
    """layout.member (two compares when the values are consecutive) == np.isin, consecutive or not."""
    from slicetrace.stamps.layout import member as _member
    for v in (vals, list(range(start, start + run))):
        x = np.array(xs + v + [max(start - 1, 0), start + run], dtype=np.uint64)
        arr = np.array(v, dtype=np.uint64)
        assert (_member(x, arr) == np.isin(x, arr)).all()


class KeepRefs(Recorder):
    """A consumer that keeps the drain's arrays themselves, not copies."""

    def channel(self, tag, recs):
        self.channels.append((tag, recs))

    def steps(self, tag, recs):
        self.step_calls.append((tag, recs))


def test_large_polls_use_reused_buffers_yet_hand_over_arrays_that_stay_intact():
    """Polls above stamps.scratch.MIN_ROWS gather into reused buffers; what consumers keep from an earlier poll
    is unchanged by later ones, on one channel and across two."""
    from slicetrace.stamps.scratch import MIN_ROWS
    v = rings(2, 16384)
    sink = KeepRefs()
    d = Drain(v, sink)
    ws = [RingWriter(v, 0), RingWriter(v, 1)]
    n = MIN_ROWS + 100
    for tag, chans in ((1, (0,)), (2, (0, 1)), (3, (0, 1)), (4, (1,))):
        d.op_submitted(tag, lambda: True)
        for c in chans:
            write_op(ws[c], tag, n // len(chans), t0=tag * 10**6 + c)
        d.poll_once()
    assert not sink.drops
    got = {}
    for tag, r in sink.step_calls:
        got.setdefault(tag, []).append(r)
    for tag, chans in ((1, (0,)), (2, (0, 1)), (3, (0, 1)), (4, (1,))):
        r = np.concatenate(got[tag])
        k = n // len(chans)
        assert len(r) == k * len(chans) and sorted(set(r["channel"].tolist())) == list(chans)
        for c in chans:
            rc = r[r["channel"] == c]
            base = tag * 10**6 + c + 10 * np.arange(k)
            assert (rc["step"] == 2 * np.arange(k)).all() and (rc["wait"] == base).all()
            assert (rc["ready"] == base + 3).all() and (rc["done"] == base + 7).all()
    assert [(t, len(r)) for t, r in sink.channels] == [(1, 1), (2, 2), (3, 2), (4, 1)]


def test_scratch_grows_and_reuses_one_buffer_per_name():
    from slicetrace.stamps.scratch import MIN_ROWS, Scratch
    s = Scratch()
    assert s.rows("a", MIN_ROWS - 1, np.uint64, 6) is None
    a = s.rows("a", MIN_ROWS, np.uint64, 6)
    assert a.shape == (MIN_ROWS, 6) and a.dtype == np.uint64
    b = s.rows("a", MIN_ROWS // 2 + MIN_ROWS // 2, np.uint64, 6)
    assert np.shares_memory(a, b)
    c = s.rows("a", MIN_ROWS + 1, np.uint64, 6)            # grows by half at least
    assert c.shape == (MIN_ROWS + 1, 6) and not np.shares_memory(a, c)
    assert s.rows("a", MIN_ROWS * 3 // 2, np.uint64, 6).base is c.base
    assert not np.shares_memory(s.rows("b", MIN_ROWS, np.uint64, 6), c)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([64, 8192]), st.integers(0, 8191), st.integers(0, 8192))
def test_a_run_of_ring_rows_is_taken_as_the_gather_of_its_slots(slots, first, n):
    """Scratch.take_run (the drain's copy of one channel's consecutive seqs, one or two slices, into a reused
    buffer from MIN_ROWS on) holds what indexing the ring by those seqs' slots holds, wrapped or not."""
    from slicetrace.stamps.scratch import Scratch
    first, n = first % slots, n % (slots + 1)
    ring = np.arange(slots * 6, dtype=np.uint64).reshape(slots, 6)
    s = Scratch()
    for _ in range(2):                      # the second time into the buffer the first one left
        got = s.take_run(ring, first, n, "st")
        assert got.shape == (n, 6) and (got == ring[(first + np.arange(n)) % slots]).all()


def test_slots_a_writer_reserves_again_during_the_copy_are_counted_as_overrun():
    """Reservations that move on while the rows are gathered lap the oldest slots just read: those rows are
    overrun (the writer may have overwritten them), the rest are delivered."""
    v, sink, d, w = setup(1, 64)
    d.op_submitted(1, lambda: False)
    for i in range(10):
        s = w.start(KIND_STEP, FLAG_SEND, 1, i, 8, 1, i, i + 1)
        w.complete(s, KIND_STEP, FLAG_SEND, 1, i, 8, 1, i + 2)
    gather = d._scratch.take_run

    def racing(rows, first, n, name):      # a writer reserves seqs 11..67 while the drain copies
        out = gather(rows, first, n, name)
        v.header["reserved"][0] = 67
        return out
    d._scratch.take_run = racing
    d.poll_once()
    assert sink.drops == Counter({"overrun": 3})           # seqs 1..3 share slots with 65..67
    assert [list(r["step"]) for _, r in sink.step_calls] == [list(range(3, 10))] and d.cursor[0] == 10


def test_an_old_entry_never_written_is_lost_once_no_op_runs():
    """No exact snapshot: an unpublished entry more than LOST_LAG behind the newest reservation is declared lost
    only when every op has completed (before, nothing after it was delivered while it ran)."""
    v, sink, d, w = setup(1, 8192)
    done = {"v": False}
    d.op_submitted(1, lambda: done["v"])
    v.header["reserved"][0] = 1                            # seq 1 reserved, its writer died before writing it
    n = LOST_LAG + 10
    for i in range(n):
        s = w.start(KIND_STEP, FLAG_SEND, 1, i, 8, 1, i, i + 1)
        w.complete(s, KIND_STEP, FLAG_SEND, 1, i, 8, 1, i + 2)
    d.poll_once()
    assert sink.step_calls == [] and not sink.drops and d.cursor[0] == 0
    done["v"] = True
    d.poll_once()
    assert sink.drops == Counter({"unwritten": 1}) and sum(len(r) for _, r in sink.step_calls) == n
    assert sink.ended == [1] and d.idle()


def test_the_last_entry_of_a_completed_op_with_an_exact_snapshot_that_never_came_is_lost_at_once():
    v, sink, d, w = setup(1, 64)
    gpu_program(v, 1, 4)                                   # seqs 1 (start), 2 (stop), 3..6 (slices)
    v.started[0]["seq"][6] = v.completed[0]["seq"][6] = 0  # the snapshot's own seq: the kernel never wrote it
    d.op_submitted(1, lambda: True, v.header["reserved"].copy())
    d.poll_once()
    assert sink.drops == Counter({"unwritten": 1}) and [list(r["step"]) for _, r in sink.step_calls] == [[0, 2, 4]]
    assert len(sink.channels) == 1 and sink.ended == [1] and d.idle() and d.cursor[0] == 6


def test_kernel_steps_of_two_ops_in_one_poll_each_go_to_their_own_op():
    """GPU layout, merged ring of 64: op 1 runs 100-slice programs on channels 0-2, op 2 one on channel 1; the lap
    cuts every KernelCh, so the poll holds KernelSteps only, channel 1's of op 2 between op 1's. Before, the poll
    was taken for one op from its first and last rows: op 2's 63 records went to op 1."""
    v = RingViews(bytearray(ring_bytes(3, 64, merged=True)), 3, 64, merged=True)
    sink = Recorder()
    d = Drain(v, sink)
    d.expect(1)
    d.expect(2)
    for c in range(3):
        gpu_program(v, 1, 100, ch=c)
    gpu_program(v, 2, 100, ch=1)
    snap = v.header["reserved"].copy()
    d.op_submitted(1, lambda: True, snap)
    d.op_submitted(2, lambda: True, snap)
    d.poll_once()
    got = {tag: (len(r), set(r["op"].tolist()), set(r["channel"].tolist())) for tag, r in sink.step_calls}
    assert got == {1: (126, {1}, {0, 2}), 2: (63, {2}, {1})}
