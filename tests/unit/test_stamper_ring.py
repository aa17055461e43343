"""Ring programs staged as clocks (stage_ring with the program's ring_layout) leave what the reference writer
leaves for the ring loop's records: whole blocks of one layout, mixed layouts, waits that failed, sampling, p2p
parts' stage() in between and publishes anywhere."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings, strategies as st

from slicetrace.backend.cpu.stamper import FastRingWriter, tail
from slicetrace.backend.cpu.worker import ring_layout
from slicetrace.plan.schedule import plan_collective
from slicetrace.plan.traffic import stamp_records
from slicetrace.stamps.layout import FLAG_SEND, KIND_STEP, RingWriter
from tests.unit.test_stamper import pair_of_rings, ref_step, same

prim = st.tuples(st.booleans(), st.booleans(), st.lists(st.integers(0, 3), max_size=4)).filter(lambda p: p[0] or p[1])
shape = st.tuples(st.lists(prim, min_size=1, max_size=4), st.integers(1, 3), st.booleans(), st.booleans())


def fake_prog(prims) -> SimpleNamespace:
    return SimpleNamespace(prims=[SimpleNamespace(recv_from=0 if hr else None, send_to=1 if hs else None,
                                                  slices=[(0, n) for n in ns]) for hr, hs, ns in prims])


@settings(max_examples=120, deadline=None)
@given(st.lists(shape, min_size=1, max_size=3), st.sampled_from([1, 2]), st.sampled_from([1, 4]),
       st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["ring", "ring", "ring", "p2p", "publish"]),
                          st.integers(0, 40)), min_size=1, max_size=24))
def test_ring_programs_staged_as_clocks_leave_what_per_record_writes_leave(shapes, ss, isz, ops):
    """Programs drawn from a few shapes (so one layout object recurs, as a cached program's does: whole blocks
    of one layout take the 2-D path) with `cut` slices before a wait fails; the rings, the reserved seqs and the
    sampled-out count read as if the reference had written every record of the ring loop's rule (a direction
    keeps every rate-th of its slices, empty ones counted; a slice both ways has 4 clocks t0, tr, ts, td and its
    send waits from tr)."""
    fast_v, ref_v = pair_of_rings(1, 64)
    f, r = FastRingWriter(fast_v, 0), RingWriter(ref_v, 0)
    progs = [(fake_prog(p), rate, steps, chans) for p, rate, steps, chans in shapes]
    lays = [ring_layout(p, isz, ss, rate, steps, chans) for p, rate, steps, chans in progs]
    clock = iter(range(1000, 10 ** 9, 7))
    for op, (which, what, cut) in enumerate(ops, 1):
        if what == "publish":
            f.publish()
            assert same(fast_v, ref_v)
            continue
        if what == "p2p":
            t = next(clock)
            f.stage([t, t + 1, t + 2, op, 9, 5 | tail(1, KIND_STEP, FLAG_SEND)])
            ref_step(r, FLAG_SEND, op, 9, 5, 1, t, t + 1, t + 2)
            continue
        prog, rate, steps, chans = progs[which % len(progs)]
        r0, s0, rpeer, speer = 4 * op + (1 << 33), 4 * op + 2, 3, 5      # a step past 32 bits keeps its low 32
        words = [0, op, r0, rpeer, s0, speer]
        if chans:
            words.append(next(clock))
            r.channel(False, 0, op, 0, words[-1])
        kr = ks = 0
        failed = steps and cut < sum(1 for p in prog.prims for _, n in p.slices if n)
        for p in prog.prims if steps else ():
            hr, hs = p.recv_from is not None, p.send_to is not None
            for _, n in p.slices:
                if n and not cut:
                    break
                if n:
                    cut -= 1
                    c = [next(clock) for _ in range(3 + (hr and hs))]
                    words += c
                    if hr and kr % rate == 0:
                        ref_step(r, 0, op, r0 + kr * ss, n * isz, rpeer, c[0], c[1], c[-1])
                    if hs and ks % rate == 0:
                        ref_step(r, FLAG_SEND, op, s0 + ks * ss, n * isz, speer, *c[-3:])
                    r.sampled_out((hr and kr % rate != 0) + (hs and ks % rate != 0))
                kr += hr
                ks += hs
            else:
                continue
            break
        if chans and not failed:
            words.append(next(clock))
            r.channel(True, 0, op, 0, words[-1])
        f.stage_ring(words, lays[which % len(progs)])
        assert fast_v.header.tobytes() == ref_v.header.tobytes()     # seqs reserved, sampled-out counted
    f.publish()
    assert same(fast_v, ref_v)


def test_a_whole_program_makes_the_records_plan_traffic_counts():
    """ring_layout keeps the slices plan.traffic.stamp_records counts (the rule the CUDA kernel and the drain's
    expectations use), for real ring programs of every collective, sampled or not."""
    for func, count in (("all_reduce", 70001), ("all_gather", 1001), ("reduce_scatter", 3), ("all_reduce", 0)):
        for nranks, rank in ((2, 0), (3, 1), (4, 3)):
            plan = plan_collective(func, nranks, rank, count, 4, 0, 2, 1 << 14)
            for prog in plan.programs:
                for rate, steps, chans in ((1, True, True), (3, True, False), (2, False, True), (5, True, True)):
                    lay = ring_layout(prog, 4, plan.proto.slice_steps, rate, steps, chans)
                    assert lay.done_at[lay.w] == stamp_records(prog, rate, steps, chans)
