"""The collective-signature table the cuda backend shares between its ranks (backend/opsig.py), run here on
the host: two ranks' tables over one segment, as two rank processes would see it."""
from __future__ import annotations

import os
import secrets

import pytest

from slicetrace.backend.opsig import NSIG, SigTable, describe_sig, encode_sig
from slicetrace.plan.schedule import plan_collective
from slicetrace.rendezvous import DictStore


@pytest.fixture
def pair():
    store = DictStore({})
    job = f"test{secrets.token_hex(3)}"
    t0 = SigTable.open(store, "p", job, 0, 2, 1.0)
    t1 = SigTable.open(store, "p", job, 1, 2, 1.0)
    name = t0.seg.name
    assert os.path.exists(f"/dev/shm/{name}")
    t0.attached()
    t1.attached()
    yield t0, t1
    t0.close()
    t1.close()
    assert not os.path.exists(f"/dev/shm/{name}")


def plan(func="all_reduce", rank=0, count=1000, itemsize=4, root=0):
    return plan_collective(func, 2, rank, count, itemsize, root, 1, 1 << 19)


def test_rank_0_names_the_segment_and_unlinks_it_once_attached(pair):
    t0, t1 = pair
    assert not os.path.exists(f"/dev/shm/{t0.seg.name}")    # the mappings live on
    t0.publish((1, 5, 6, 7))
    assert t1.mv[(0 * NSIG + 1) * 4: (0 * NSIG + 1) * 4 + 4].tolist() == [1, 5, 6, 7]


def test_the_same_collective_on_both_ranks_agrees(pair):
    t0, t1 = pair
    for _ in range(40):                        # past NSIG: entries are reused
        a = t0.number(plan(rank=0), "float32", "sum", 1 << 19)
        b = t1.number(plan(rank=1), "float32", "sum", 1 << 19)
        assert a == b
        assert t0.differs(a) is None and t1.differs(b) is None
    assert t0.first_difference() is None and t1.first_difference() is None


@pytest.mark.parametrize("theirs, said", [
    ((plan(count=999), "float32", "sum"), "rank 1 runs all_reduce(count=999, dtype=float32, op=sum)"),
    ((plan(itemsize=8), "float64", "sum"), "rank 1 runs all_reduce(count=1000, dtype=float64, op=sum)"),
    ((plan(), "float32", "max"), "rank 1 runs all_reduce(count=1000, dtype=float32, op=max)"),
    ((plan("broadcast", root=1), "float32", "sum"), "rank 1 runs broadcast(count=1000, dtype=float32, root=1)"),
])
def test_a_difference_is_found_from_both_sides_and_named(pair, theirs, said):
    t0, t1 = pair
    a = t0.number(plan(), "float32", "sum", 1 << 19)
    assert t0.differs(a) is None                  # rank 1 has not said yet
    b = t1.number(*theirs, 1 << 19)
    why = t0.differs(a)
    assert why is not None and why.startswith("collective #1 differs across ranks: rank 0 runs all_reduce("
                                              "count=1000, dtype=float32, op=sum)"), why
    assert said in why, why
    assert t1.differs(b) is not None and t0.first_difference() == why


def test_the_oldest_difference_is_reported_first(pair):
    t0, t1 = pair
    for count in (10, 20, 30):
        t0.number(plan(count=count), "float32", "sum", 1 << 19)
    for count in (10, 21, 31):
        t1.number(plan(count=count), "float32", "sum", 1 << 19)
    assert t0.first_difference().startswith("collective #2 differs")


def test_a_peer_more_than_nsig_ahead_is_not_compared_with_a_stale_entry(pair):
    t0, t1 = pair
    a = t0.number(plan(), "float32", "sum", 1 << 19)
    for _ in range(NSIG + 1):
        t1.number(plan(count=7), "float32", "sum", 1 << 19)      # its #1 entry now holds #17
    assert t0.differs(a) is None and t0.first_difference() is None


def test_encoding_round_trips():
    for func, root in (("all_reduce", 0), ("reduce", 3), ("all_gather", 0)):
        enc = encode_sig(func, 17, "bfloat16", "min", root, 5, 1 << 19)
        d = describe_sig(*enc)
        assert d.startswith(f"{func}(count=17, dtype=bfloat16") and d.endswith("[nchannels=5, step_bytes=524288]")
        assert (", op=min" in d) == (func != "all_gather") and (f"root={root}" in d) == (func == "reduce")




def _entry(seq: int) -> tuple:
    """What 'rank 1' says collective #seq is, and what rank 0 expects: words that change with seq."""
    count, packed, cfg = encode_sig("all_reduce", 3 * seq, "float32", "sum", 0, 1 + seq % 64, 1 << 19)
    return seq, count, packed, cfg


def _rewrite(name: str, rounds: int) -> None:
    """Rank 1 in another process: publishes collectives #1, #17, #33, ... into one slot as fast as it can (each
    entry overwrites the last one NSIG back), `rounds` times at least and until the reader raises a word past the
    table (a loaded host may run it before the reader looks), then raises the done word."""
    import time

    from slicetrace.backend.segment import Segment
    seg = Segment(name)
    t1 = SigTable(seg, 1, 2)
    words, k, until = seg.words(2048, 16), 0, time.monotonic() + 60
    while (k < rounds or not words[1]) and time.monotonic() < until:
        t1.publish(_entry(1 + NSIG * k))
        k += 1
    words[0] = 1
    seg.close()


def test_a_reader_never_sees_a_torn_entry_of_a_writer_in_another_process():
    """Without the seqlock (seq 0 written first, seq re-read after the words) the reader takes the next entry's
    words for the one it compares, and reports a difference that is not there."""
    import multiprocessing as mp
    store = DictStore({})
    t0 = SigTable.open(store, "p", f"test{secrets.token_hex(3)}", 0, 2, 1.0)
    done, slot = t0.seg.words(2048, 16), (1 * NSIG + 1) * 4
    p = mp.get_context("spawn").Process(target=_rewrite, args=(t0.seg.name, 300_000))
    p.start()
    seen = false = 0
    try:
        while not done[0] and p.is_alive() and seen < 20_000_000:
            s = t0.mv[slot]                  # the collective rank 1's slot holds now: rank 0 runs the same one
            if s:
                false += t0.differs(_entry(s)) is not None
                seen += 1
                if seen == 20_000:           # enough compares against a busy writer: let it stop
                    done[1] = 1
    finally:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join(10)
        t0.close()
    assert p.exitcode == 0
    print(f"\n{seen} compares while rank 1 rewrote the slot, {false} false")
    assert seen > 1000 and false == 0, (seen, false)
