"""A lap in the middle of a channel program (stamps.pairing.after_lap): what is left of a program whose KernelCh
start was lapped is dropped and counted, in both writers' record orders, so that every delivered KernelStep lies
inside a delivered KernelCh of its op and channel, and every record written is delivered or counted once."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from slicetrace.backend.cpu.stamper import FastRingWriter, tail
from slicetrace.stamps.drain import Drain
from slicetrace.stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP, RingWriter, provisional_word
from tests.unit.test_drain import Recorder, _entry, rings

LAYOUTS = ("cpu", "ref", "gpu")     # cpu stamper (start, steps, stop: one staged block), per-record, gpu writer


class Rings:
    """Channel programs written the way one writer does, clocks apart per program: start t0, steps in between,
    stop t0 + 10 * (steps + 1)."""

    def __init__(self, layout: str, nch: int = 1, slots: int = 64):
        self.layout, self.v, self.sink = layout, rings(nch, slots), Recorder()
        self.d = Drain(self.v, self.sink)
        self.fast = [FastRingWriter(self.v, c) for c in range(nch)]
        self.ref = [RingWriter(self.v, c) for c in range(nch)]
        self.done: set[int] = set()
        self.written = 0
        self.programs: list[tuple[int, int, int, int]] = []     # (op, channel, start clock, stop clock)

    def submit(self, tag: int, unique: bool = True) -> None:
        self.d.expect(tag, channels=True, unique_keys=unique)
        self.d.op_submitted(tag, lambda: tag in self.done)

    def program(self, tag: int, nsteps: int, t0: int, ch: int = 0, peer: int = 1) -> None:
        steps = [(t0 + 10 * i + 10, t0 + 10 * i + 13, t0 + 10 * i + 17, 2 * i) for i in range(nsteps)]
        stop = t0 + 10 * nsteps + 10
        self.written += nsteps + 2
        self.programs.append((tag, ch, t0, stop))
        if self.layout == "cpu":
            words = [t0, t0, t0, tag, 0, tail(peer, KIND_CHANNEL, FLAG_SEND)]
            for wait, ready, done, step in steps:
                words += [wait, ready, done, tag, step, 4096 | tail(peer, KIND_STEP, FLAG_SEND)]
            self.fast[ch].stage(words + [stop, stop, stop, tag, 0, tail(peer, KIND_CHANNEL, FLAG_SEND | FLAG_CH_STOP)])
        elif self.layout == "ref":
            w = self.ref[ch]
            w.channel(False, FLAG_SEND, tag, peer, t0)
            for wait, ready, done, step in steps:
                s = w.start(KIND_STEP, FLAG_SEND, tag, step, 4096, peer, wait, ready)
                w.complete(s, KIND_STEP, FLAG_SEND, tag, step, 4096, peer, done)
            w.channel(True, FLAG_SEND, tag, peer, stop)
        else:                        # the host reserves the range; start and stop take its first two seqs
            q = int(self.v.header["reserved"][ch]) + 1
            self.v.header["reserved"][ch] = q + 1 + nsteps
            word = lambda s: provisional_word(s, tag)              # noqa: E731
            _entry(self.v, ch, q, KIND_CHANNEL, FLAG_SEND, tag, 0, 0, peer, t0, t0, t0, word(q))
            _entry(self.v, ch, q + 1, KIND_CHANNEL, FLAG_SEND | FLAG_CH_STOP, tag, 0, 0, peer, stop, stop, stop,
                   word(q + 1))
            for i, (wait, ready, done, step) in enumerate(steps):
                _entry(self.v, ch, q + 2 + i, KIND_STEP, FLAG_SEND, tag, step, 4096, peer, wait, ready, done,
                       word(q + 2 + i))

    def poll(self, force: bool = False) -> None:
        for w in self.fast:          # the cpu backend's fetch_stamps, before the drain reads
            w.publish()
        self.d.poll_once(force)

    def steps(self):
        return [(t, int(r["channel"]), int(r["wait"]), int(r["done"])) for t, rs in self.sink.step_calls for r in rs]

    def kernel_chs(self):
        return [(t, int(r["channel"]), int(r["ready"]), int(r["done"])) for t, rs in self.sink.channels for r in rs]

    def check(self) -> None:
        """Every delivered KernelCh one program's start and stop; every delivered KernelStep inside a delivered
        KernelCh of its op and channel; each record once."""
        chs = self.kernel_chs()
        assert set(chs) <= set(self.programs), (chs, self.programs)
        outside = [s for s in self.steps() if not any(c[:2] == s[:2] and c[2] <= s[2] and s[3] <= c[3] for c in chs)]
        assert outside == [], (outside, chs)
        drops = self.sink.drops
        assert len(self.steps()) + 2 * len(chs) + drops["overrun"] + drops["unpaired"] == self.written, drops
        assert set(drops) <= {"overrun", "unpaired"}, drops


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_rest_of_a_program_whose_start_was_lapped_is_dropped_and_counted(layout):
    """The reviewer's case on one channel: op 2's program (10 records) is read only after op 3's (60) was
    written, so the ring (64) lost op 2's first 6 records, its KernelCh start among them. Its remaining records
    were delivered (KernelSteps in no KernelCh; its stop unpaired): now all 10 are counted overrun."""
    r = Rings(layout)
    r.submit(1)
    r.program(1, 8, 1000)
    r.done.add(1)
    r.poll()
    for tag, n in ((2, 8), (3, 58)):
        r.submit(tag)
        r.program(tag, n, 1000 * tag)
        r.done.add(tag)
    r.poll()
    r.check()
    assert r.sink.drops == Counter(overrun=10)
    assert Counter(t for t, *_ in r.steps()) == {1: 8, 3: 58}
    assert [c[0] for c in r.kernel_chs()] == [1, 3]
    assert r.sink.ended == [1, 2, 3] and r.d.idle() and not r.d.open_records


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_programs_of_one_op_to_one_peer_the_first_cut(layout):
    """Two parts of one p2p op on one channel share the KernelCh key (channel, op, peer, direction): the first
    part's lapped rest must not be delivered, nor land in the second's KernelCh."""
    r = Rings(layout)
    r.submit(1)
    r.program(1, 80, 1000)          # lapped by itself: 82 records in a 64-slot ring
    r.program(1, 10, 5000)
    r.done.add(1)
    r.poll()
    r.check()
    assert r.sink.drops == Counter(overrun=82) and r.kernel_chs() == [(1, 0, 5000, 5110)]
    assert len(r.steps()) == 10 and r.sink.ended == [1]


def test_a_lap_inside_a_program_whose_start_was_read_keeps_its_kernel_ch():
    """Per-record writer, polled mid-program: the start is held, the lap takes 7 of its steps, its stop
    survives: the program keeps its KernelCh, and only the lapped records are lost."""
    r = Rings("ref")
    r.submit(1)
    w = r.ref[0]
    w.channel(False, FLAG_SEND, 1, 1, 100)
    for i in range(80):
        s = w.start(KIND_STEP, FLAG_SEND, 1, i, 64, 1, 101 + i, 102 + i)
        w.complete(s, KIND_STEP, FLAG_SEND, 1, i, 64, 1, 103 + i)
        if i == 9:
            r.poll()                 # start + 10 steps read, the start held for its stop
    w.channel(True, FLAG_SEND, 1, 1, 999)
    r.written, r.programs = 82, [(1, 0, 100, 999)]
    r.done.add(1)
    r.poll()
    assert r.sink.drops == Counter(overrun=7) and len(r.steps()) == 73 and r.kernel_chs() == [(1, 0, 100, 999)]
    r.check()


def _steps(w, tag: int, n: int, t: int, peer: int = 1) -> None:
    for i in range(n):
        s = w.start(KIND_STEP, FLAG_SEND, tag, i, 64, peer, t + 3 * i, t + 3 * i + 1)
        w.complete(s, KIND_STEP, FLAG_SEND, tag, i, 64, peer, t + 3 * i + 2)


def test_a_lapped_stop_is_not_taken_from_a_later_program_with_the_same_key():
    """Two parts of one op to one peer on one channel, per-record writer: part A's start is held, the lap takes
    its stop and part B's start, and the first KernelCh row read is B's stop, with A's key. They were paired into
    one KernelCh from A's start to B's stop (B's steps inside it). Where the op's keys repeat on a channel, that
    stop cannot be told from A's own: A's start is unpaired and B's rest goes, counted overrun."""
    r = Rings("ref")
    r.submit(1, unique=False)
    w = r.ref[0]
    w.channel(False, FLAG_SEND, 1, 1, 100)          # A
    _steps(w, 1, 10, 101)
    r.poll()                                         # A's start held
    _steps(w, 1, 60, 200)
    w.channel(True, FLAG_SEND, 1, 1, 500)           # A's stop, lapped
    w.channel(False, FLAG_SEND, 1, 1, 600)          # B's start, lapped
    _steps(w, 1, 70, 601)
    w.channel(True, FLAG_SEND, 1, 1, 999)           # B's stop: the newest 64 entries are B's last 63 steps and it
    r.written, r.programs = 144, [(1, 0, 100, 500), (1, 0, 600, 999)]
    r.done.add(1)
    r.poll()
    assert r.kernel_chs() == [] and len(r.steps()) == 10     # A's first steps went out while its start was held
    assert r.sink.drops == Counter(overrun=144 - 10 - 1, unpaired=1)
    assert r.sink.ended == [1] and r.d.idle() and not r.d.open_records


def test_ops_that_stamp_no_kernel_ch_keep_their_newest_steps():
    """expect(channels=False): no KernelCh to lie in, so a lap costs only what it took."""
    v = rings(1, 64)
    sink = Recorder()
    d = Drain(v, sink)
    d.expect(1, channels=False)
    d.op_submitted(1, lambda: True)
    w = RingWriter(v, 0)
    for i in range(100):
        s = w.start(KIND_STEP, FLAG_SEND, 1, i, 8, 1, i, i)
        w.complete(s, KIND_STEP, FLAG_SEND, 1, i, 8, 1, i)
    d.poll_once()
    assert sink.drops == Counter(overrun=36) and sum(len(rs) for _, rs in sink.step_calls) == 64


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), nch=st.sampled_from([1, 2]),
       plan=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 70), st.booleans(), st.booleans()),
                     min_size=1, max_size=12))
def test_every_kernel_step_delivered_lies_in_its_kernel_ch_and_each_record_counts_once(layout, nch, plan):
    """Programs (channel, steps, same op as the previous one, poll after it) in any order of laps and polls."""
    r = Rings(layout, nch)
    tag = 0
    for i, (ch, n, same, poll) in enumerate(plan):
        if not (same and tag):
            r.done.add(tag)
            tag += 1
            r.submit(tag)
        r.program(tag, n, 1000 * (i + 1), ch % nch)
        if poll:
            r.poll()
    r.done.add(tag)
    r.poll()
    r.poll(force=True)
    r.check()
    assert r.d.idle() and not r.d.open_records
