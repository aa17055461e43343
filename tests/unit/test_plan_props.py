"""Plans under random geometry (hypothesis): every rank's plans of a sequence of collectives run together over
bounded 8-step FIFOs, as the cpu ring loop runs them (steps rounded up to a chunk at each program's start, credit
and data counters), with each element tracked by its identity and the ranks it holds: every element lands in its
place holding each rank's contribution exactly once and through exactly one final (avg) write, both ends of
every connection agree on each slice's step and size and on the slices a sample rate keeps, slices fit their FIFO
steps, and traffic.py's counts are what moved. Then the p2p pieces and their connections across groups."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import given, settings, strategies as st

from slicetrace.plan.groups import group_layout
from slicetrace.plan.schedule import COLLECTIVES, plan_collective, plan_p2p, split_p2p
from slicetrace.plan.traffic import bytes_per_direction, expected_slices, stamp_records

NSTEPS = 8
NONE = np.uint64(2 ** 64 - 1)          # id of an element never written
PRIMES = [2, 3, 5, 7, 11, 13, 127, 1021, 4099, 65537, 131071]


def _inputs(func, n, count):
    """Per rank: (id, contribution, final writes) rows; a contribution has 8 bits per rank, so a sum counts each
    rank's share; a final write (avg divides there) counts on the value, which is what travels on from it."""
    cin = count * n if func == "reduce_scatter" else count
    lo = [r * count if func == "all_gather" else 0 for r in range(n)]
    return [_rows(np.arange(lo[r], lo[r] + cin, dtype=np.uint64), 1 << (8 * r)) for r in range(n)]


def _rows(ids, contrib, fin=0):
    return np.stack([ids, np.broadcast_to(np.asarray(contrib, np.uint64), ids.shape),
                     np.full(len(ids), fin, np.uint64)], axis=1)


def _wanted(func, n, count, root, r):
    full = sum(1 << (8 * q) for q in range(n))
    ids = np.arange(count * n if func == "all_gather" else count, dtype=np.uint64)
    if func == "all_gather":
        return _rows(ids, np.uint64(1) << (np.uint64(8) * (ids // np.uint64(max(count, 1)))))
    if func == "reduce_scatter":
        return _rows(ids + np.uint64(r * count), full, 1)
    if func == "broadcast":
        return _rows(ids, 1 << (8 * root))
    if func == "reduce" and r != root:
        return _rows(np.full(count, NONE), 0)          # NCCL leaves a non-root's receive buffer alone
    return _rows(ids, full, 1)


class Ring:
    """Every rank's (rank, channel) program runs as an actor over persistent connections (src, dst, channel)."""

    def __init__(self, n):
        self.n = n
        self.step = defaultdict(int)         # (src, dst, ch, end): the connection's persistent step at that end
        self.tail = defaultdict(int)         # (src, dst, ch): steps posted by the sender
        self.head = defaultdict(int)         # (src, dst, ch): credit returned by the receiver
        self.fifo = {}                       # (src, dst, ch, step) -> slice data in flight
        self.seen = defaultdict(list)        # (src, dst, ch, end) -> (step, bytes) of every slice
        self.kept = defaultdict(list)        # (src, dst, ch, end, rate) -> steps whose records a rate keeps
        self.moved = defaultdict(lambda: [0, 0])    # rank -> [bytes sent, bytes received] (non-empty slices)

    def actor(self, plan, prog, ins, outs, rates):
        r, ch, ss, spc = plan.rank, prog.channel, plan.proto.slice_steps, plan.proto.chunk_steps
        it, se = plan.itemsize, plan.proto.step_bytes // plan.itemsize
        nxt, prv = (r + 1) % self.n, (r - 1) % self.n
        rk, sk = (prv, r, ch), (r, nxt, ch)
        for key, end in ((rk, "r"), (sk, "s")):      # NCCL rounds conn->step up to a chunk as a primitive starts
            self.step[key + (end,)] = -(-self.step[key + (end,)] // spc) * spc
        self.head[rk] = max(self.head[rk], self.step[rk + ("r",)])
        first = {"r": self.step[rk + ("r",)], "s": self.step[sk + ("s",)]}
        bufs = {"in": ins, "out": outs}
        for prim in prog.prims:
            hr, hs = prim.recv_from is not None, prim.send_to is not None
            assert prim.recv_from in (None, prv) and prim.send_to in (None, nxt), (prim, r)
            for off, m in prim.slices:
                assert m * it <= ss * plan.proto.step_bytes and m <= ss * se, (prim, m)      # fits its steps
                rstep, sstep = self.step[rk + ("r",)], self.step[sk + ("s",)]
                while hr and self.tail[rk] < rstep + ss:
                    yield False
                while hs and self.head[sk] < sstep + ss - NSTEPS:
                    yield False
                val = bufs[prim.src][prim.src_off + off:prim.src_off + off + m].copy() if prim.src else None
                if hr:
                    assert rstep % NSTEPS + ss <= NSTEPS          # one contiguous stretch of the FIFO
                    got = self.fifo.pop(rk + (rstep,))
                    assert len(got) == m, (prim, len(got), m)
                    if prim.reduce:
                        assert np.array_equal(got[:, 0], val[:, 0]), "a reduction combined different elements"
                        val[:, 1] += got[:, 1]
                    else:
                        val = got
                    self._note(rk, "r", rstep, m, it, first["r"], ss, rates)
                    self.moved[r][1] += m * it if m else 0
                if prim.final:
                    val[:, 2] += np.uint64(1)
                if prim.dst:
                    outs[prim.dst_off + off:prim.dst_off + off + m] = val
                if hs:
                    assert sstep % NSTEPS + ss <= NSTEPS
                    assert all(k[3] >= sstep + ss - NSTEPS for k in self.fifo if k[:3] == sk), "a slot in use reused"
                    self.fifo[sk + (sstep,)] = val
                    self.tail[sk] = sstep + ss
                    self.step[sk + ("s",)] = sstep + ss
                    self._note(sk, "s", sstep, m, it, first["s"], ss, rates)
                    self.moved[r][0] += m * it
                if hr:
                    self.head[rk] = rstep + ss
                    self.step[rk + ("r",)] = rstep + ss
                yield True

    def _note(self, key, end, step, m, it, first, ss, rates):
        self.seen[key + (end,)].append((step, m * it))
        for rate in rates:              # the cpu ring loop's sampling: the k-th slice of a direction, k % rate
            if m and (step - first) // ss % rate == 0:
                self.kept[key + (end, rate)].append(step)

    def run(self, actors):
        live = list(actors)
        while live:
            progressed, still = False, []
            for a in live:
                for moved in a:
                    if not moved:
                        still.append(a)
                        break
                    progressed = True
            assert progressed or not still, "the plans deadlock over 8-step FIFOs"
            live = still
        assert not self.fifo, "a slice was sent and never received"


def _op(draw, n):
    func = draw(st.sampled_from(COLLECTIVES))
    it = draw(st.sampled_from([1, 2, 4, 8]))
    cap = 300_000 // (n if func in ("all_gather", "reduce_scatter") else 1) // max(1, it // 2)
    count = draw(st.one_of(st.integers(0, 40), st.sampled_from([p for p in PRIMES if p <= cap]),
                           st.integers(cap // 8, cap)))        # many chunks, loops and channels
    return func, count, it, draw(st.integers(0, n - 1)), draw(st.integers(1, 8)), draw(st.integers(8, 24)) * 512


@settings(max_examples=80, deadline=None)
@given(n=st.integers(2, 8), data=st.data())
def test_every_element_lands_once_in_its_place_and_both_ends_agree_on_every_slice(n, data):
    ops = [_op(data.draw, n) for _ in range(data.draw(st.integers(1, 3)))]
    ring, rates = Ring(n), (1, 2, 3)
    for func, count, it, root, nch, step in ops:
        assert plan_collective(func, 1, 0, count, it, 0, nch, step).programs == ()      # one rank: a copy
        plans = [plan_collective(func, n, r, count, it, root, nch, step) for r in range(n)]
        assert len({tuple((p.channel, p.params["lo"], p.params["count"]) for p in q.programs) for q in plans}) == 1
        ins = _inputs(func, n, count)
        outs = [_rows(np.full(len(_wanted(func, n, count, root, r)), NONE), 0) for r in range(n)]
        before = {k: list(v) for k, v in ring.kept.items()}
        ring.moved.clear()
        ring.run([ring.actor(plans[r], prog, ins[r], outs[r], rates)
                  for r in range(n) for prog in plans[r].programs])
        for r in range(n):
            assert np.array_equal(outs[r], _wanted(func, n, count, root, r)), (func, n, count, it, nch, step, r)
            assert bytes_per_direction(plans[r]) == tuple(ring.moved[r]), (func, r)
            for prog in plans[r].programs:
                for rate in rates:
                    mine = sum(len(v) - len(before.get(k, [])) for k, v in ring.kept.items()
                               if k[4] == rate and k[2] == prog.channel and r in k[:2] and
                               (k[0] == r) == (k[3] == "s"))
                    assert stamp_records(prog, rate, True, True) == (mine + 2, sum(
                        1 for p in prog.prims for _, m in p.slices if m for _ in range(
                            (p.recv_from is not None) + (p.send_to is not None))) - mine)
        total = sum(s for s, _ in ring.moved.values())
        assert total == sum(v for _, v in ring.moved.values())
        per = {"all_reduce": 2 * (n - 1), "all_gather": n * (n - 1), "reduce_scatter": n * (n - 1)}.get(func, n - 1)
        assert total == per * count * it, (func, n, count, total)
        ex = sorted(s for r in range(n) for s in ((r,) + e for e in expected_slices(plans[r])))
        assert all(e[3] == ((e[0] + 1) % n if e[2] else (e[0] - 1) % n) for e in ex)
    for (src, dst, ch, end), slices in ring.seen.items():
        if end == "s":
            assert slices == ring.seen[(src, dst, ch, "r")], (src, dst, ch)       # every slice's step and size
    for (src, dst, ch, end, rate), steps in ring.kept.items():
        if end == "s":
            assert steps == ring.kept[(src, dst, ch, "r", rate)], (src, dst, ch, rate)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 8), it=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_p2p_pieces_cover_each_message_once_and_a_byte_end_cuts_what_a_typed_end_cuts(n, it, data):
    """A group's pieces cover each message's elements once, in order, 16-byte aligned; its programs' slices fit
    one FIFO step; and a group of mixed dtypes, moved as bytes (groups.group_layout), makes the same pieces and
    slices, in bytes, as a peer that sends the message in its own dtype."""
    rank = data.draw(st.integers(0, n - 1))
    shape, base = [], 0
    for d, snd, count in data.draw(st.lists(st.tuples(st.integers(1, n - 1), st.booleans(), st.one_of(
            st.integers(0, 50), st.sampled_from([3 << 17, 5 << 19, (1 << 21) + 7]))), max_size=6)):
        shape.append(((rank + d) % n, snd, count, base))      # to self: a copy, tested in test_plan.py
        base += count
    chans = lambda nbytes: max(1, min(64, nbytes // (32 << 10)))      # noqa: E731 (the cuda backend's rule)
    step = data.draw(st.integers(64, 1024)) * 512
    chunk = min(data.draw(st.integers(64, 2048)) * 512, step)          # Settings.p2p_chunk_bytes
    pieces, nprog = split_p2p(tuple(shape), rank, n, it, chans)
    for ei, (peer, snd, count, b) in enumerate(shape):
        mine = [p for p, e in pieces if e == ei]
        assert [(p.peer, p.is_send, p.total) for p in mine] == [(peer, snd, count)] * len(mine)
        assert [p.offset for p in mine] == list(np.cumsum([b] + [p.count for p in mine[:-1]]))
        assert sum(p.count for p in mine) == count and all((p.offset - b) * it % 16 == 0 for p in mine)
        assert nprog[ei] == (0 if peer == rank else len(mine))
    plan = plan_p2p([p for p, _ in pieces], n, rank, it, chunk, step, 64)
    for prog in plan.programs:
        part = pieces[prog.params["part"]][0]
        assert [(pr.src_off, pr.nelem) for pr in prog.prims] == [
            (o, min(chunk // it, part.count - o)) for o in range(0, part.count, chunk // it)]
        assert all(m * it <= step for pr in prog.prims for _, m in pr.slices)
    as_bytes = tuple((peer, snd, count * it, b * it) for peer, snd, count, b in shape)
    bpieces, bnprog = split_p2p(as_bytes, rank, n, 1, chans)
    assert bnprog == nprog
    assert [(p.offset, p.count, p.total) for p, _ in bpieces] == [
        (p.offset * it, p.count * it, p.total * it) for p, _ in pieces]
    bplan = plan_p2p([p for p, _ in bpieces], n, rank, 1, chunk, step, 64)
    assert [(q.channel, [(pr.src_off, pr.nelem) for pr in q.prims]) for q in bplan.programs] == [
        (q.channel, [(pr.src_off * it, pr.nelem * it) for pr in q.prims]) for q in plan.programs]


@settings(max_examples=120, deadline=None)
@given(n=st.integers(2, 6), nconn=st.sampled_from([1, 2, 5, 8, 64]), data=st.data())
def test_the_kth_piece_of_a_pair_runs_on_one_channel_at_both_ends_across_groups_however_each_groups(n, nconn, data):
    """groups.group_layout over a sequence of groups, each rank cutting its own messages into groups its own way
    (NCCL does not ask the ends to group alike), the pair's connections moved on by the pieces before each group
    as api_p2p.run_group keeps them: the k-th piece a rank sends to a peer is the k-th that peer receives from it,
    with the same count and on the same channel."""
    msgs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, n - 1),
                                        st.sampled_from([0, 10, 3 << 18, 5 << 20])), max_size=10))
    chans = lambda nbytes: max(1, min(64, nbytes // (32 << 10)))      # noqa: E731
    mine = [[] for _ in range(n)]
    for src, d, count in msgs:
        mine[src].append(((src + d) % n, True, count))
        mine[(src + d) % n].append((src, False, count))
    pieces = {}                                        # (src, dst, end) -> [(count, channel)] in order
    for r in range(n):
        pos: dict = {}
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(mine[r]) - 1)), max_size=4)))
        for lo, hi in zip([0] + cuts, cuts + [len(mine[r])]):
            group = mine[r][lo:hi]
            if not group:
                continue
            shape, off = [], 0
            for peer, snd, count in group:
                shape.append((peer, snd, count, off))
                off += count
            start = tuple(pos.get((p, s), 0) for p, s, _, _ in shape) if pos else ()
            _, plan, _, moves, _ = group_layout(4, tuple(shape), start, (), r, n, chans, nconn, 1 << 19, 1 << 19)
            for prog in plan.programs:
                pr = prog.params
                assert 0 <= prog.channel < nconn
                key = (r, pr["peer"], "s") if pr["is_send"] else (pr["peer"], r, "r")
                pieces.setdefault(key, []).append((pr["conn"], pr["count"], prog.channel))
            for k, m in moves:
                pos[k] = (pos.get(k, 0) + m) % nconn
    for (src, dst, end), sent in pieces.items():
        if end == "s":
            got = pieces.get((src, dst, "r"), [])
            assert [c[1:] for c in sent] == [c[1:] for c in got], (src, dst)
            assert [c[0] % nconn for c in sent] == [k % nconn for k in range(len(sent))]
