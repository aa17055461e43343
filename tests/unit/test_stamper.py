"""The cpu backend's fast stamp writer leaves exactly the bytes of the reference RingWriter (stamps.layout)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from slicetrace.backend.cpu.stamper import FastRingWriter, tail
from slicetrace.stamps.layout import FLAG_SEND, KIND_STEP, RingViews, RingWriter, ring_bytes

M32 = 0xFFFFFFFF
rec = st.tuples(st.integers(0, M32), st.integers(0, 2**40), st.integers(0, M32), st.integers(0, 7),
                st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62), st.booleans())


def pair_of_rings(nch: int = 2, slots: int = 64) -> tuple[RingViews, RingViews]:
    return tuple(RingViews(bytearray(ring_bytes(nch, slots)), nch, slots) for _ in range(2))


def ref_step(w: RingWriter, flags, op, step, size, peer, wait, ready, done) -> None:
    s = w.start(KIND_STEP, flags, op, step, size, peer, wait, ready)
    w.complete(s, KIND_STEP, flags, op, step, size, peer, done)


def same(a: RingViews, b: RingViews) -> bool:
    return (a.header.tobytes() == b.header.tobytes() and a.started.tobytes() == b.started.tobytes()
            and a.completed.tobytes() == b.completed.tobytes())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["pend", "pend", "pend", "flush", "one", "ch"]), rec), min_size=1,
                max_size=200), st.integers(0, 1))
def test_fast_writer_bytes_equal_the_reference_writer_across_ring_wraps(ops, channel):
    """Pending records, flushed in batches of any size (64 slots: batches straddle the ring's end), records
    written at once, and KernelCh pairs, in any mix: after each flush the rings hold the reference's bytes."""
    fast_v, ref_v = pair_of_rings()
    f, r = FastRingWriter(fast_v, channel), RingWriter(ref_v, channel)
    for what, (op, step, size, peer, wait, ready, done, send) in ops:
        flags = FLAG_SEND if send else 0
        w4, w5 = op | (step & M32) << 32, size | tail(peer, KIND_STEP, flags)
        if what == "pend":
            f.pend(w4, w5, wait, ready, done)
        elif what == "one":
            f.one(w4, w5, wait, ready, done)             # flushes what is pending first: seq order kept
        elif what == "ch":
            f.channel_start(op, peer, 1, wait)
            f.channel_stop(op, peer, 1, done)
        else:
            f.flush()
        if what == "ch":
            r.channel(False, 1, op, peer, wait)
            r.channel(True, 1, op, peer, done)
        elif what != "flush":
            ref_step(r, flags, op, step, size, peer, wait, ready, done)
        if not f.ps:
            assert same(fast_v, ref_v)
    f.flush()
    assert same(fast_v, ref_v)
    assert not fast_v.header["reserved"][1 - channel]


def test_a_flush_reserves_first_and_publishes_every_seq_after_every_payload():
    v, _ = pair_of_rings(1)
    f = FastRingWriter(v, 0)
    for i in range(60):                                   # slot 61.. next: the batch below wraps
        f.one(i, 7, 1, 2, 3)
    seen = []

    class Spy:                                            # what the rings hold when each seq store happens
        def __init__(self, q):
            self.q = q

        def __setitem__(self, k, val):
            seen.append((int(v.header["reserved"][0]), v.started["seq"][0].tolist(), v.completed["done"][0].tolist(),
                         v.started["ready"][0].tolist()))
            self.q[k] = val
    f.stq, f.coq = Spy(f.stq), Spy(f.coq)
    for i in range(8):
        f.pend(100 + i, 9, 10, 20 + i, 30 + i)
    f.flush()
    slots = [(61 + i) % 64 for i in range(8)]
    reserved, seqs, done, ready = seen[0]
    assert reserved == 68                                 # all eight reserved before the first seq store
    assert all(seqs[s] == 0 for s in slots)               # none published yet (old seqs packed over with 0)
    assert [done[s] for s in slots] == [30 + i for i in range(8)]      # every payload already there
    assert [ready[s] for s in slots] == [20 + i for i in range(8)]
    assert [v.started["seq"][0][s] for s in slots] == list(range(61, 69))
    assert np.array_equal(v.completed["seq"][0][slots], v.started["seq"][0][slots])
