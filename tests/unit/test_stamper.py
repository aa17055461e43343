"""The cpu backend's stamp writer (immediate and staged records) leaves what the reference RingWriter leaves."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from slicetrace.backend.cpu.stamper import FastRingWriter, tail
from slicetrace.stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP, RingViews, RingWriter, ring_bytes

M32 = 0xFFFFFFFF
rec = st.tuples(st.integers(0, M32), st.integers(0, 2**40), st.integers(0, M32), st.integers(0, 7),
                st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62))


def pair_of_rings(nch: int = 2, slots: int = 64) -> tuple[RingViews, RingViews]:
    return tuple(RingViews(bytearray(ring_bytes(nch, slots)), nch, slots) for _ in range(2))


def ref_step(w: RingWriter, flags, op, step, size, peer, wait, ready, done) -> None:
    s = w.start(KIND_STEP, flags, op, step, size, peer, wait, ready)
    w.complete(s, KIND_STEP, flags, op, step, size, peer, done)


STARTED = ("seq", "wait", "ready", "op", "step", "size", "peer", "kind", "flags")
COMPLETED = ("seq", "done", "op", "step", "size", "peer", "kind", "flags")


def same(a: RingViews, b: RingViews) -> bool:
    """Equal in every field the reader takes from each ring (a staged entry also carries the other ring's
    clocks, which nothing reads)."""
    return (a.header.tobytes() == b.header.tobytes()
            and all((a.started[f] == b.started[f]).all() for f in STARTED)
            and all((a.completed[f] == b.completed[f]).all() for f in COMPLETED))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ring", "p2p", "publish"]), rec, st.integers(0, 90)), min_size=1,
                max_size=40), st.integers(0, 1))
def test_staged_programs_leave_what_the_reference_writer_leaves_across_wraps_and_laps(ops, channel):
    """Ring programs and p2p parts staged (some longer than the 64-slot ring, several between publishes: lapped
    inside one publish): once published, the ring reads as if the reference had written every record then."""
    fast_v, ref_v = pair_of_rings()
    f, r = FastRingWriter(fast_v, channel), RingWriter(ref_v, channel)
    for what, (op, step, size, peer, wait, ready, done), nrec in ops:
        if what == "publish":
            f.publish()
            assert same(fast_v, ref_v)
            continue
        p2p = what == "p2p"                 # a p2p part: its peer and direction in KernelCh, one direction
        chpeer, chflag = (peer, 1) if p2p else (0, 0)
        words = [wait, wait, wait, op, 0, tail(chpeer, KIND_CHANNEL, chflag)]
        r.channel(False, chflag, op, chpeer, wait)
        for k in range(nrec):
            send = 1 if p2p else k % 2
            words += [wait + k, ready + k, done + k, op, step + k,     # a step past 32 bits keeps its low 32
                      size | tail(peer + send, KIND_STEP, FLAG_SEND if send else 0)]
            ref_step(r, FLAG_SEND if send else 0, op, step + k, size, peer + send, wait + k, ready + k, done + k)
        words += [done, done, done, op, 0, tail(chpeer, KIND_CHANNEL, chflag | FLAG_CH_STOP)]
        r.channel(True, chflag, op, chpeer, done)
        f.stage(words)
        assert int(fast_v.header["reserved"][channel]) == int(ref_v.header["reserved"][channel])
    f.publish()
    assert same(fast_v, ref_v)
    assert not fast_v.header["reserved"][1 - channel]


def test_staged_records_are_reserved_at_once_and_published_only_by_publish():
    v, _ = pair_of_rings(1)
    f = FastRingWriter(v, 0)
    f.stage([1, 2, 3, 5, 0, 7])                             # seq 1
    f.stage([10, 11, 12, 5, 1, 9, 20, 21, 22, 5, 2, 9])    # seqs 2, 3
    assert int(v.header["reserved"][0]) == 3 and not v.started["seq"].any() and not v.completed["seq"].any()
    assert f.publish() == 3 and f.publish() == 0
    assert v.started["seq"][0, :4].tolist() == [0, 1, 2, 3] == v.completed["seq"][0, :4].tolist()
    assert v.started["wait"][0, 2:4].tolist() == [10, 20] and v.completed["done"][0, 2:4].tolist() == [12, 22]
    assert v.started["step"][0, 2:4].tolist() == [1, 2] and v.completed["op"][0, 2:4].tolist() == [5, 5]


def test_a_word_outside_u64_is_refused_before_any_seq_is_reserved():
    """stage() converts a program's words before reserving: a negative or a 65-bit word raises and reserves
    nothing (a later program's seqs follow the last good one), the largest u64 word goes through whole."""
    v, _ = pair_of_rings(1)
    f = FastRingWriter(v, 0)
    for bad in (-1, 1 << 64):
        with pytest.raises(OverflowError):
            f.stage([1, 2, 3, 5, 0, 7, 1, 2, bad, 5, 1, 7])
        assert int(v.header["reserved"][0]) == 0
    f.stage([1, 2, (1 << 64) - 1, 5, 0, 7])
    assert int(v.header["reserved"][0]) == 1 and f.publish() == 1
    assert v.completed["done"][0, 1] == (1 << 64) - 1 and v.started["seq"][0, 1] == 1


def test_a_bad_program_staged_after_others_leaves_theirs_whole():
    """A program with a word outside u64, staged while others wait for publish, raises and leaves the staged
    words and the reservations as they were: the next program's seq follows the last good one."""
    v, _ = pair_of_rings(1)
    f = FastRingWriter(v, 0)
    f.stage([1, 2, 3, 5, 0, 7])                                 # seq 1
    with pytest.raises(OverflowError):
        f.stage([10, 11, 12, 5, 1, 7, 13, 14, -1, 5, 2, 7])
    assert int(v.header["reserved"][0]) == 1 and len(f.staged) == 6
    f.stage([20, 21, 22, 6, 3, 9])                              # seq 2
    assert f.publish() == 2
    assert v.started["seq"][0, 1:3].tolist() == [1, 2] and v.completed["seq"][0, 1:3].tolist() == [1, 2]
    assert v.started["wait"][0, 1:3].tolist() == [1, 20] and v.completed["done"][0, 1:3].tolist() == [3, 22]
    assert v.started["op"][0, 1:3].tolist() == [5, 6] and v.started["step"][0, 1:3].tolist() == [0, 3]


def test_two_publishers_leave_the_newest_records_in_the_ring(monkeypatch):
    """An op's error path publishes from the op's thread while a flush_profiler() may publish from another. The
    first publisher wrote outside the writer's lock: paused there, it laid its older block over the newer one
    the second had published (64 newer records then read as lost). Publishers now go one at a time."""
    import threading
    import numpy as np
    from slicetrace.backend.cpu import stamper
    v, _ = pair_of_rings(1)
    f = FastRingWriter(v, 0)
    f.stage([1, 2, 3, 5, 0, 7] * 64)                       # seqs 1..64: every slot
    paused, go, real = threading.Event(), threading.Event(), np.arange

    def slow_arange(*a, **k):                               # the first publisher stops before its writes
        if threading.current_thread().name == "first" and not go.is_set():
            paused.set()
            go.wait(5)
        return real(*a, **k)
    monkeypatch.setattr(stamper.np, "arange", slow_arange)
    t = threading.Thread(target=f.publish, name="first")
    t.start()
    assert paused.wait(5)
    f.stage([4, 5, 6, 5, 1, 7] * 64)                       # seqs 65..128: the same slots
    second = threading.Thread(target=f.publish, name="second")
    second.start()
    second.join(0.5)
    go.set()
    t.join(5)
    second.join(5)
    assert sorted(v.started["seq"][0].tolist()) == list(range(65, 129)) == sorted(v.completed["seq"][0].tolist())
