"""Correct point-to-point programs with slow peers never raise the cpu backend's deadlock MismatchError
(backend/cpu/stall.py: a cycle of p2p waits none of the ranks' current ops can break).

Each case is a random program every rank derives from one seed: phases in one global order (so it can always
finish), each a send/recv outside a group, a group of messages, an all_to_all with empty parts or an all_reduce,
on one of two communicators of the 3 ranks or a sub-communicator of ranks 1 and 2; sizes around a 32 KiB FIFO
(sends that fit it return before their receiver arrives, larger ones wait for it) and empty messages. Random
sleeps before each rank's ops make peers slow: a rank waits on one that has not issued its op yet, or that is
still waiting in an earlier op on a third rank. Two shapes are forced often: a message whose receiver stalled on a
late sender, then one back the other way that the first receiver sends late (its stall, ended, stays published
while it sleeps: a rule that trusted it would see a cycle), and a relay (the third rank waits on a rank that waits
on a sleeping one). Checks run every millisecond of a wait (not 50 ms), so that one often lands between a peer's
post and our next poll.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from tests.helpers.procs import RankPool

WORLD = 3
SUB = (1, 2)                                    # the sub-communicator's ranks (its rank = pool rank - 1)
KW = dict(backend="cpu", buffsize=32 << 10, nchannels=1, timeout_s=30.0)
FIFO = (32 << 10) // 4                          # float32 elements of one FIFO
SIZES = (0, 1, 1000, FIFO - 1, FIFO, FIFO + 1, 3 * FIFO + 7)


def _comms(ctx):
    import slicetrace
    from slicetrace.backend.cpu import transport
    st = ctx["state"]
    if "dl" not in st:
        assert hasattr(transport, "CHECK_EVERY_S")     # else the line below would patch nothing
        transport.CHECK_EVERY_S = 0.001
        r, job = ctx["rank"], ctx["job"]
        cs = {c: slicetrace.init(rank=r, world_size=WORLD, store=ctx["store"], job=f"{job}dl{c}", **KW) for c in "ab"}
        if r in SUB:
            cs["s"] = slicetrace.init(rank=r - SUB[0], world_size=len(SUB), store=ctx["store"], job=f"{job}dls", **KW)
        st["dl"] = cs
        prev = st.get("close")
        st["close"] = lambda: ([prev() if prev else None], [c.close() for c in cs.values()])
    return st["dl"]


def _program(seed: int) -> list:
    """Phases in the order every rank runs them: ('p2p', comm, src, dst, n), ('group', comm, [(src, dst, n)]),
    ('a2a', comm, counts), ('coll', comm, n); each with per-rank delays. Ranks are pool ranks."""
    rng = random.Random(seed)
    out = []
    for _ in range(rng.randint(4, 8)):
        delays = [rng.choice((0, 0, 0.002, 0.02, 0.05)) for _ in range(WORLD)]
        c = rng.choice("aabs")
        ranks = SUB if c == "s" else tuple(range(WORLD))
        kind = rng.choice(("p2p", "p2p", "back", "back", "relay", "group", "many", "a2a", "coll"))
        if kind == "relay" and c == "s":
            kind = "p2p"
        if kind == "p2p":
            s, d = rng.sample(ranks, 2)
            out.append(("p2p", c, s, d, rng.choice(SIZES), delays))
        elif kind == "back":                    # d stalls on a late s, then sends back late while s waits on it
            s, d = rng.sample(ranks, 2)
            late = [0.0] * WORLD
            late[s] = rng.choice((0.01, 0.03))
            out.append(("p2p", c, s, d, rng.choice(SIZES), late))
            late = [0.0] * WORLD
            late[d] = rng.choice((0.01, 0.03, 0.06))
            grouped = rng.random() < 0.3
            back = [(d, s, rng.choice(SIZES))]
            out.append(("group", c, back, late) if grouped else ("p2p", c, d, s, back[0][2], late))
        elif kind == "relay":                   # d waits on m, which waits on a late s
            s, m, d = rng.sample(ranks, 3)
            late = [0.0] * WORLD
            late[s] = rng.choice((0.01, 0.04))
            out.append(("p2p", c, s, m, rng.choice(SIZES), late))
            out.append(("p2p", rng.choice("ab"), m, d, rng.choice(SIZES), [0.0] * WORLD))
        elif kind == "group":
            msgs = [(s, d, rng.choice(SIZES)) for s in ranks for d in ranks if s != d
                    for _ in range(rng.choice((0, 1, 1, 2)))]
            rng.shuffle(msgs)
            out.append(("group", c, msgs, delays))
        elif kind == "many":                    # more messages than header slots: the sender's lane is held
            s, d = rng.sample(ranks, 2)
            delays[d] = rng.choice((0.004, 0.02))
            out.append(("group", c, [(s, d, rng.choice((0, 1, 100))) for _ in range(rng.randint(17, 24))], delays))
        elif kind == "a2a":
            out.append(("a2a", c, [[rng.choice((0, 1, 700, FIFO + 3)) for _ in ranks] for _ in ranks], delays))
        else:
            out.append(("coll", c, rng.choice(SIZES), delays))
    return out


def _val(seed: int, i: int, src: int, dst: int, k: int, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32) + (seed % 97) * 1000 + i * 100 + src * 10 + dst + k / 4


def _run(ctx, seeds: list) -> str:
    import time
    cs = _comms(ctx)
    r = ctx["rank"]
    for seed in seeds:
        for i, ph in enumerate(_program(seed)):
            kind, c = ph[0], ph[1]
            if c not in cs:
                continue                        # the sub-communicator, and we are not in it
            comm = cs[c]
            base = SUB[0] if c == "s" else 0    # pool rank -> the communicator's rank
            time.sleep(ph[-1][r])
            if kind == "p2p":
                _, _, s, d, n, _ = ph
                if r == s:
                    comm.send(_val(seed, i, s, d, 0, n), d - base)
                elif r == d:
                    got = comm.recv(np.zeros(n, np.float32), s - base)
                    np.testing.assert_array_equal(got, _val(seed, i, s, d, 0, n), err_msg=str((seed, ph)))
            elif kind == "group":
                outs = []
                with comm.group():
                    for k, (s, d, n) in enumerate(ph[2]):
                        if s == r:
                            comm.send(_val(seed, i, s, d, k, n), d - base)
                        elif d == r:
                            outs.append((np.zeros(n, np.float32), _val(seed, i, s, d, k, n)))
                            comm.recv(outs[-1][0], s - base)
                for got, want in outs:
                    np.testing.assert_array_equal(got, want, err_msg=str((seed, ph)))
            elif kind == "a2a":
                m, me = ph[2], r - base
                send = np.concatenate([_val(seed, i, me, d, 0, m[me][d]) for d in range(len(m))])
                got = comm.all_to_all(send, send_counts=m[me], recv_counts=[m[s][me] for s in range(len(m))])
                want = np.concatenate([_val(seed, i, s, me, 0, m[s][me]) for s in range(len(m))])
                np.testing.assert_array_equal(got, want, err_msg=str((seed, ph)))
            else:
                got = comm.all_reduce(np.full(ph[2], r + 1, np.float32))
                want = sum(q + 1 for q in (SUB if c == "s" else range(WORLD)))
                assert (got == want).all(), (seed, ph)
    return "ok"


@pytest.fixture(scope="module")
def pool():
    p = RankPool(WORLD, timeout=150)
    yield p
    p.close()


@pytest.mark.parametrize("first", [0, 1000])
def test_correct_point_to_point_programs_with_slow_peers_never_raise_the_deadlock(pool, first):
    assert pool.run(_run, list(range(first, first + 14))) == ["ok"] * WORLD
