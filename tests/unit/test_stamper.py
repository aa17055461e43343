"""The cpu backend's fast stamp writer writes exactly the bytes of the reference RingWriter (stamps.layout)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from slicetrace.backend.cpu.stamper import FastRingWriter, tail
from slicetrace.stamps.layout import FLAG_SEND, KIND_STEP, RingViews, RingWriter, ring_bytes

M32 = 0xFFFFFFFF
rec = st.tuples(st.integers(0, M32), st.integers(0, 2**40), st.integers(0, M32), st.integers(0, 7),
                st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62))


def pair_of_rings(nch: int = 2, slots: int = 64) -> tuple[RingViews, RingViews]:
    return tuple(RingViews(bytearray(ring_bytes(nch, slots)), nch, slots) for _ in range(2))


def ref_step(w: RingWriter, flags, op, step, size, peer, wait, ready, done) -> None:
    s = w.start(KIND_STEP, flags, op, step, size, peer, wait, ready)
    w.complete(s, KIND_STEP, flags, op, step, size, peer, done)


def same(a: RingViews, b: RingViews) -> bool:
    return (a.header.tobytes() == b.header.tobytes() and a.started.tobytes() == b.started.tobytes()
            and a.completed.tobytes() == b.completed.tobytes())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["recv", "send", "both", "ch"]), rec), min_size=1, max_size=150),
       st.integers(0, 1))
def test_fast_writer_bytes_equal_the_reference_writer_across_ring_wraps(ops, channel):
    fast_v, ref_v = pair_of_rings()
    f, r = FastRingWriter(fast_v, channel), RingWriter(ref_v, channel)
    for what, (op, step, size, peer, wait, ready, done) in ops:
        rt, stl = tail(peer, KIND_STEP, 0), tail(peer + 1, KIND_STEP, FLAG_SEND)
        w4 = op | (step & M32) << 32
        if what == "recv":
            f.one(w4, size | rt, wait, ready, done)
            ref_step(r, 0, op, step, size, peer, wait, ready, done)
        elif what == "send":
            f.step(FLAG_SEND, op, step, size, peer + 1, wait, ready, done)
            ref_step(r, FLAG_SEND, op, step, size, peer + 1, wait, ready, done)
        elif what == "both":       # 64 slots and up to 150 records: some pairs straddle the ring's end
            f.two(w4, size | rt, wait, ready, op | ((step + 1) & M32) << 32, size | stl, ready, done, done)
            ref_step(r, 0, op, step, size, peer, wait, ready, done)
            ref_step(r, FLAG_SEND, op, step + 1, size, peer + 1, ready, done, done)
        else:
            f.channel_stop(f.channel_start(op, peer, 1, wait), op, peer, 1, done)
            r.channel(False, 1, op, peer, wait)
            r.channel(True, 1, op, peer, done)
        assert same(fast_v, ref_v)
    assert int(fast_v.header["reserved"][channel]) == int(ref_v.header["reserved"][channel]) > 0
    assert not fast_v.header["reserved"][1 - channel]


def test_pair_publishes_both_seqs_last():
    """Between the pack and the seq stores, neither entry of a pair reads as published (seq word 0)."""
    v, _ = pair_of_rings(1)
    f = FastRingWriter(v, 0)
    f.one(5, 7, 1, 2, 3)                  # seq 1
    stores = []

    class Spy:                            # records each seq store with what the entries hold at that moment
        def __init__(self, q):
            self.q = q

        def __setitem__(self, k, val):
            stores.append((k, val, v.started["seq"][0, 2:4].tolist(), v.completed["done"][0, 2:4].tolist()))
            self.q[k] = val
    f.stq, f.coq = Spy(f.stq), Spy(f.coq)
    f.two(5 | 4 << 32, 9, 10, 11, 5 | 6 << 32, 9 | 1 << 56, 11, 12, 13)
    assert [(k, val) for k, val, _, _ in stores] == [(12, 2), (18, 3), (12, 2), (18, 3)]
    assert stores[0][2] == [0, 0]                           # started payloads written, neither seq yet
    assert stores[2][3] == [13, 13]                         # completed payloads written before their seqs
    assert np.array_equal(v.started["seq"][0, 2:4], [2, 3]) and np.array_equal(v.completed["seq"][0, 2:4], [2, 3])
