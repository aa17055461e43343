"""The cpu backend's stamp writer (immediate and staged records) leaves what the reference RingWriter leaves."""
from __future__ import annotations

import numpy as np
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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["recv", "send", "prog", "ch", "publish"]), rec,
                          st.integers(0, 90)), min_size=1, max_size=60),
       st.integers(0, 1))
def test_fast_writer_equals_the_reference_writer_across_wraps_and_laps(ops, channel):
    """Immediate records, staged programs (some longer than the 64-slot ring: lapped inside one publish) and
    publishes in any order: once published, the ring reads as if the reference had written every record then."""
    fast_v, ref_v = pair_of_rings()
    f, r = FastRingWriter(fast_v, channel), RingWriter(ref_v, channel)
    staged = False
    for what, (op, step, size, peer, wait, ready, done), nrec in ops:
        rt, stl = tail(peer, KIND_STEP, 0), tail(peer + 1, KIND_STEP, FLAG_SEND)
        w4 = op | (step & M32) << 32
        if what == "recv":
            f.one(w4, size | rt, wait, ready, done)
            ref_step(r, 0, op, step, size, peer, wait, ready, done)
        elif what == "send":
            f.step(FLAG_SEND, op, step, size, peer + 1, wait, ready, done)
            ref_step(r, FLAG_SEND, op, step, size, peer + 1, wait, ready, done)
        elif what == "prog":            # a ring program: KernelCh start, nrec slices alternating recv/send, stop
            words = [wait, wait, wait, op, tail(0, KIND_CHANNEL, 0)]
            r.channel(False, 0, op, 0, wait)
            for k in range(nrec):
                send = k % 2
                words += [wait + k, ready + k, done + k, op | ((step + k) & M32) << 32, size | (stl if send else rt)]
                ref_step(r, FLAG_SEND if send else 0, op, step + k, size, peer + send, wait + k, ready + k, done + k)
            words += [done, done, done, op, tail(0, KIND_CHANNEL, FLAG_CH_STOP)]
            r.channel(True, 0, op, 0, done)
            f.stage(words)
            staged = True
        elif what == "ch":
            f.channel_stop(f.channel_start(op, peer, 1, wait), op, peer, 1, done)
            r.channel(False, 1, op, peer, wait)
            r.channel(True, 1, op, peer, done)
        else:
            f.publish()
            staged = False
        if not staged:
            assert same(fast_v, ref_v)
    f.publish()
    assert same(fast_v, ref_v)
    assert int(fast_v.header["reserved"][channel]) == int(ref_v.header["reserved"][channel])
    assert not fast_v.header["reserved"][1 - channel]


def test_staged_records_are_reserved_at_once_and_published_only_by_publish():
    v, _ = pair_of_rings(1)
    f = FastRingWriter(v, 0)
    f.one(5, 7, 1, 2, 3)                                    # seq 1, published at once
    f.stage([10, 11, 12, 5 | 1 << 32, 9, 20, 21, 22, 5 | 2 << 32, 9])
    f.one(6, 7, 4, 5, 6)                                    # seq 4: after the staged block
    assert int(v.header["reserved"][0]) == 4
    assert v.started["seq"][0, :5].tolist() == [0, 1, 0, 0, 4] == v.completed["seq"][0, :5].tolist()
    assert f.publish() == 2 and f.publish() == 0
    assert v.started["seq"][0, 2:4].tolist() == [2, 3] == v.completed["seq"][0, 2:4].tolist()
    assert v.started["wait"][0, 2:4].tolist() == [10, 20] and v.completed["done"][0, 2:4].tolist() == [12, 22]
    assert v.started["step"][0, 2:4].tolist() == [1, 2] and v.completed["op"][0, 2:4].tolist() == [5, 5]
