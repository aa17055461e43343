"""The cuda backend's p2p-order rule (backend/cuda/order.py) on the host, no GPU: every rank's P2pOrder over one
segment, as the rank processes see it, fed the messages and collectives each rank issues (real plans and pieces).
The rule must name an order that can never finish on both ranks alike, and never a program that can: random
programs are run through a model of the cuda backend's waits to tell which is which."""
from __future__ import annotations

import os
import random
import secrets
import time

import numpy as np
import pytest

from slicetrace.backend.base import DTYPES, Work
from slicetrace.backend.cuda.args import auto_channels
from slicetrace.backend.cuda.completion import Completion
from slicetrace.backend.cuda.order import P2pOrder
from slicetrace.backend.cuda.tokens import Pending, Token
from slicetrace.backend.cuda.watchdog import Watchdog
from slicetrace.backend.opsig import NSIG, SigTable
from slicetrace.errors import MismatchError, PeerError
from slicetrace.plan.groups import group_layout
from slicetrace.plan.schedule import plan_collective, split_p2p
from slicetrace.rendezvous import DictStore

STEP = 4096                 # buffsize 32 KiB: 8 FIFO steps of 4 KiB, p2p chunks of 4 KiB (1024 float32)
FITS, LONG = 8 * 1024, 8 * 1024 + 1     # float32 sends of 8 steps (complete alone) and of 9 (need the receiver)
TAIL = " first (point-to-point: the ranks called their ops in different orders)"


class Ranks:
    """world ranks' tables over one segment; issue ops as each rank's submit would."""

    def __init__(self, world: int):
        store, job = DictStore({}), f"test{secrets.token_hex(3)}"
        self.world = world
        self.sigs = [SigTable.open(store, "p", job, r, world, 1.0, extra=P2pOrder.nbytes(world)) for r in range(world)]
        self.name = self.sigs[0].seg.name
        for t in self.sigs:
            t.attached()
        self.order = [P2pOrder(t, r, world) for r, t in enumerate(self.sigs)]

    def coll(self, r: int, func: str = "all_reduce", count: int = 1000, root: int = 0) -> None:
        plan = plan_collective(func, self.world, r, count, 4, root, 1, STEP)
        self.order[r].numbered(self.sigs[r].number(plan, "float32", "sum", STEP)[0])

    def p2p(self, r: int, msgs: list, dtypes: tuple = ()) -> None:
        """A group of (peer, is_send, count) float32 messages; dtypes: one per message (float32 or int64), moved
        as bytes, as the API moves a group of mixed dtypes."""
        its = [4 if d == "float32" else 8 for d in dtypes]
        shape = tuple((p, s, n * (its[i] if dtypes else 1), 0) for i, (p, s, n) in enumerate(msgs))
        caller = tuple((its[i], DTYPES.index(d)) for i, d in enumerate(dtypes))
        pieces, plan, _, _, _ = group_layout(1 if dtypes else 4, shape, (), caller, r, self.world,
                                             lambda nb: auto_channels(nb, 64), 64, STEP, STEP)
        work = Work(1, plan, "uint8" if dtypes else "float32", "sum", parts=[(p, None) for p, _ in pieces])
        self.order[r].count(work)

    def found(self) -> list:
        return [o.find() for o in self.order]

    def close(self) -> None:
        for t in self.sigs:
            t.close()


@pytest.fixture
def ranks():
    made = []

    def make(world: int = 2) -> Ranks:
        made.append(Ranks(world))
        return made[-1]
    yield make
    for r in made:
        r.close()
        assert not os.path.exists(f"/dev/shm/{r.name}")


def said(s: int, after: int, coll: str, before: int, mine: str) -> str:
    return f"collective #{s} differs across ranks: rank {after} runs {coll} [nchannels=1, step_bytes={STEP}], " \
           f"rank {before} runs {mine}{TAIL}"


AR = "all_reduce(count=1000, dtype=float32, op=sum)"


@pytest.mark.parametrize("first", ["collective", "receive"])
def test_a_receive_before_the_collective_its_sender_runs_first_is_named_alike_on_both(ranks, first):
    """Rank 0 runs all_reduce then sends; rank 1 receives then runs all_reduce (the task's example). Found as soon
    as both have issued the two ops that wait on each other, whichever rank issued first, before rank 1 numbers
    its collective (its live counts) and after (its entry)."""
    t = ranks()
    want = said(1, 0, AR, 1, "a receive of 1000 x float32 from rank 0")
    steps = [lambda: t.coll(0), lambda: t.p2p(1, [(0, False, 1000)])]
    for step in steps if first == "collective" else steps[::-1]:
        assert t.found() == [None, None]
        step()
    assert t.found() == [want, want]
    t.coll(1)
    t.p2p(0, [(1, True, 1000)])
    assert t.found() == [want, want]


def test_a_send_that_fits_the_fifo_may_cross_a_collective(ranks):
    """Rank 0 sends (8 FIFO steps: it completes alone), then runs all_reduce; rank 1 runs all_reduce, then
    receives: a correct program, at every point of its issue."""
    t = ranks()
    for step in (lambda: t.p2p(0, [(1, True, FITS)]), lambda: t.coll(1), lambda: t.coll(0),
                 lambda: t.p2p(1, [(0, False, FITS)])):
        step()
        assert t.found() == [None, None]


@pytest.mark.parametrize("count, pieces", [(LONG, 1), (1 << 20, 8)])
def test_a_send_longer_than_the_fifo_crossing_a_collective_is_named(ranks, count, pieces):
    """9 steps of one piece (or 8 pieces of 128 steps) need the receiver's credit, which it gives after all_reduce."""
    assert split_p2p(((1, True, count, 0),), 0, 2, 4, lambda nb: auto_channels(nb, 64))[1] == [pieces]
    t = ranks()
    t.p2p(0, [(1, True, FITS)])                             # an earlier one that fits: not the one named
    t.p2p(0, [(1, True, count)])
    assert t.found() == [None, None]
    t.coll(1)
    want = said(1, 1, AR, 0, f"a send of {count} x float32 to rank 1")
    assert t.found() == [want, want]                        # whatever rank 0 issues next comes after the send
    t.coll(0)
    assert t.found() == [want, want]


@pytest.mark.parametrize("func, root, count, found", [
    ("broadcast", 1, 1000, False),        # rank 1, the root, only sends: it may end alone
    ("broadcast", 0, 1000, True),         # rank 1 needs rank 0's data
    ("reduce", 0, 1000, False),           # rank 1 only sends toward root 0
    ("reduce", 1, 1000, True),            # root 1 needs rank 0's data
    ("all_gather", 0, 1000, True),
    ("reduce_scatter", 0, 1000, True),
    ("all_reduce", 0, 0, False),          # nothing to wait for
])
def test_only_a_collective_that_needs_the_other_rank_closes_the_cycle(ranks, func, root, count, found):
    t = ranks()
    t.coll(1, func, count, root)                            # rank 1: the collective, then the send
    t.p2p(1, [(0, True, 10)])
    t.p2p(0, [(1, False, 10)])                              # rank 0: the receive, then the collective
    t.coll(0, func, count, root)
    got = t.found()
    assert got[0] == got[1] and (got[0] is not None) == found, got
    if found:
        assert got[0].startswith(f"collective #1 differs across ranks: rank 1 runs {func}(count={count}, ")


def test_an_empty_receive_waits_for_nothing(ranks):
    t = ranks()
    t.coll(0)
    t.p2p(0, [(1, True, 0)])
    t.p2p(1, [(0, False, 0)])
    assert t.found() == [None, None]
    t.p2p(1, [(0, False, 5)])                               # the next one needs data rank 0 sends later
    assert t.found() == [said(1, 0, AR, 1, "a receive of 5 x float32 from rank 0")] * 2


def test_a_group_of_mixed_dtypes_is_named_in_the_callers_terms(ranks):
    t = ranks()
    t.coll(0)
    t.p2p(1, [(0, False, 6), (0, False, 7)], ("int64", "float32"))
    assert t.found() == [said(1, 0, AR, 1, "a receive of 6 x int64 from rank 0")] * 2


def test_a_message_out_of_the_kept_sizes_is_named_by_its_peer(ranks):
    t = ranks()
    t.coll(0)
    for n in range(1, 7):                                   # #0 is the one rank 0 sends after its collective
        t.p2p(1, [(0, False, n)])
    assert t.found() == [said(1, 0, AR, 1, "a receive from rank 0")] * 2


def test_the_rule_reads_only_entries_still_kept(ranks):
    """Rank 1 received a second message after its collective #1, then numbered NSIG more: the slot of #1 holds
    #17's counts (two received), which would name rank 0 (one sent before its #1) were the entry's seq not read."""
    t = ranks()
    t.p2p(0, [(1, True, 10)])
    t.coll(0)                                               # rank 0 sends its second message later
    t.p2p(1, [(0, False, 10)])
    t.coll(1)
    t.p2p(1, [(0, False, 10)])
    for _ in range(NSIG):
        t.coll(1)
    assert t.found() == [None, None]


def test_a_third_rank_is_not_told_and_tells_nothing(ranks):
    t = ranks(3)
    for r in range(3):
        t.p2p(r, [((r + 1) % 3, True, 10), ((r - 1) % 3, False, 10)])
    t.coll(0)
    t.coll(2)
    t.p2p(2, [(0, True, 10)])
    t.p2p(0, [(2, False, 10)])                              # rank 0 receives after, rank 2 sends after: fine
    t.coll(1)
    t.p2p(1, [(2, False, 10)])                              # rank 1 receives what rank 2 sends after #2
    t.coll(2)
    t.coll(1)
    got = t.found()
    want = said(2, 2, "all_reduce(count=1000, dtype=float32, op=sum)", 1, "a receive of 10 x float32 from rank 2")
    assert got == [None, want, want], got


# ---- random programs against a model of the cuda backend's waits ----
FUNCS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
SIZES = (0, 1, 1000, FITS, LONG)


def _program(rng: random.Random, world: int) -> tuple[list, list]:
    """(collectives every rank runs in one order as (func, count, root), each rank's ops): ('coll', s) or ('p2p',
    [(peer, is_send, count, k)]) with k the message's number in its pair. Each message has an epoch at each end
    (the collectives issued before it there), often the same, kept in order along its pair."""
    colls = [(rng.choice(FUNCS), rng.choice((0, 1000, 1000)), rng.randrange(world)) for _ in range(rng.randint(1, 3))]
    at: list[list[list]] = [[[] for _ in range(len(colls) + 1)] for _ in range(world)]
    for src in range(world):
        for dst in range(world):
            n = 0 if src == dst else rng.choice((0, 1, 1, 2, 3))
            es = sorted(rng.randint(0, len(colls)) for _ in range(n))
            ed = sorted(e if rng.random() < 0.6 else rng.randint(0, len(colls)) for e in es)
            for k in range(n):
                count = rng.choice(SIZES)
                at[src][es[k]].append((dst, True, count, (src, dst, k)))
                at[dst][ed[k]].append((src, False, count, (src, dst, k)))
    progs = []
    for r in range(world):
        ops = []
        for e, msgs in enumerate(at[r]):
            lanes: dict = {}
            for m in msgs:                                  # a random merge that keeps each pair's order
                lanes.setdefault((m[0], m[1]), []).append(m)
            seq = []
            while lanes:
                key = rng.choice(sorted(lanes))
                seq.append(lanes[key].pop(0))
                if not lanes[key]:
                    del lanes[key]
            while seq:
                cut = rng.randint(1, len(seq))
                ops.append(("p2p", seq[:cut]))
                seq = seq[cut:]
            if e < len(colls):
                ops.append(("coll", e + 1))
        progs.append(ops)
    return colls, progs


def _long(count: int, world: int) -> bool:
    """A send one of whose pieces needs more than the FIFO's 8 steps (the plan's real cut)."""
    pieces = split_p2p(((1, True, count, 0),), 0, world, 4, lambda nb: auto_channels(nb, 64))[0]
    return any(-(-p.count // (STEP // 4)) > 8 for p, _ in pieces)


def _finishes(colls: list, progs: list, world: int) -> bool:
    """Run the ranks' ops in issue order, each once what it waits for has started: a collective waits for the
    ranks whose data its output holds (a root that only sends, and a count of 0, for none), a non-empty receive
    for the op holding its send, a send longer than the FIFO for the op holding its receive. Generous (a FIFO
    that earlier sends filled, a ring's middle ranks are not waited for): a program it cannot finish, cuda cannot."""
    where: dict = {}
    for r, ops in enumerate(progs):
        for i, (kind, what) in enumerate(ops):
            if kind == "coll":
                where[(r, "coll", what)] = i
            else:
                for m in what:
                    where[(r, m[3])] = i

    def waits(r: int, op: tuple) -> list:
        if op[0] == "coll":
            func, count, root = colls[op[1] - 1]
            if count == 0 or func == "broadcast" and r == root or func == "reduce" and r != root:
                return []
            return [(o, where[(o, "coll", op[1])]) for o in range(world)
                    if o != r and (func != "broadcast" or o == root)]
        out = []
        for peer, is_send, count, key in op[1]:
            if (not is_send and count) or (is_send and _long(count, world)):
                out.append((peer, where[(peer, key)]))
        return out

    pc = [0] * world
    moved = True
    while moved:
        moved = False
        for r in range(world):
            if pc[r] < len(progs[r]) and all(pc[o] >= i for o, i in waits(r, progs[r][pc[r]])):
                pc[r] += 1
                moved = True
    return all(pc[r] == len(progs[r]) for r in range(world))


@pytest.mark.parametrize("world", [2, 3])
def test_random_programs_are_named_only_when_they_can_never_finish(world):
    """Each program issued in a random interleaving of its ranks; after every op each rank asks the rule. A
    program the rule names must be one the model cannot finish; with 2 ranks both say the same thing. Counted so
    that the test cannot pass empty: programs named, and programs that finish (correct ones, crossings included)."""
    rng = random.Random(1234 + world)
    named = finished = unnamed_stuck = 0
    for case in range(250):
        colls, progs = _program(rng, world)
        left = [list(ops) for ops in progs]
        ever = None
        t = Ranks(world)
        try:
            while any(left):
                r = rng.choice([q for q in range(world) if left[q]])
                kind, what = left[r].pop(0)
                if kind == "coll":
                    t.coll(r, *colls[what - 1])
                else:
                    t.p2p(r, [(p, s, n) for p, s, n, _ in what])
                got = t.found()
                ever = ever or next((g for g in got if g), None)
        finally:
            t.close()
        ok = _finishes(colls, progs, world)
        assert not (ever and ok), (case, ever, colls, progs)
        if world == 2:
            assert got[0] == got[1], (case, got)
        named += bool(ever)
        finished += ok
        unnamed_stuck += not ok and not ever
    print(f"\n{world} ranks: {named} named, {finished} finish, {unnamed_stuck} stuck and not named")
    assert named >= 25 and finished >= 50, (named, finished, unnamed_stuck)


# ---- the rule as the cuda backend's wait() and watchdog use it (completion.py, watchdog.py; no GPU) ----
class _Event:
    done = False


class _Backend(Completion):
    """A rank's Completion over the shared tables; its one op is a kernel that ends only when an abort is raised
    (on every rank: `ranks`), as end() does: this rank's status word, then its event."""

    def __init__(self, t: Ranks, r: int, store: DictStore, ranks: list):
        self.rank, self.sigs, self.order, self.store, self.ranks = r, t.sigs[r], t.order[r], store, ranks
        self.mem = self
        self.words = np.zeros(4, np.uint32)
        self._prefix, self._side, self._broken, self._broken_as, self._told = "p", 0, None, PeerError, False
        self._last = Token(_Event(), 1, (1 - r,), 0, None)
        self._pending = Pending()
        self._pending.add(self._last)

    def raise_abort(self, stream: int) -> bool:
        for be in self.ranks:
            be.words[1], be._last.event.done = 1, True
        return True

    def thread_init(self) -> None:
        pass


def _pair(t: Ranks) -> list:
    store, out = DictStore({}), []
    out += [_Backend(t, r, store, out) for r in range(2)]
    return out


def test_both_waits_raise_the_order_mismatch_and_the_watchdog_aborts_with_it(ranks):
    """Rank 1 finds it at its wait's first check and aborts; rank 0's kernel then exits on the abort, and its wait
    finds the same from the counts (not 'a peer aborted'). A watchdog finds it with nobody waiting."""
    t = ranks()
    t.coll(0)
    t.p2p(0, [(1, True, 1000)])
    t.p2p(1, [(0, False, 1000)])
    t.coll(1)
    want = said(1, 0, AR, 1, "a receive of 1000 x float32 from rank 0")
    errs = []
    for be in _pair(t)[::-1]:
        with pytest.raises(MismatchError) as e:
            be.wait(be._last, 30.0)
        errs.append(str(e.value))
    assert errs == [f"rank 1: {want}", f"rank 0: {want}"]
    be = _pair(t)[0]
    dog = Watchdog(be, 0.05)
    try:
        for _ in range(2000):
            if be.broken is not None:
                break
            time.sleep(0.005)
    finally:
        dog.stop()
    assert (be.broken, be._broken_as) == (want, MismatchError)


def test_a_peer_that_aborts_a_correct_program_is_a_peer_error(ranks):
    t = ranks()
    for r in (0, 1):
        t.coll(r)
        t.p2p(r, [(1 - r, True, 10), (1 - r, False, 10)])
    be = _pair(t)
    be[1].abort("rank 1 gives up")
    with pytest.raises(PeerError) as e:
        be[0].wait(be[0]._last, 30.0)
    assert not isinstance(e.value, MismatchError) and "rank 1 gives up" in str(e.value), e.value
