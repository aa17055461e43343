"""Correct programs that mix point-to-point and collectives never raise the cpu backend's order MismatchError
(transport.Backoff.check_order: a p2p wait on a peer inside a collective this rank has not started).

Each case is a random program every rank derives from one seed: groups of sends and receives with random peers
and sizes around a small FIFO (32 KiB: 8 steps of 4 KiB, so larger messages take several rounds), all_to_alls
with empty parts, eager sends that cross a collective (sent before it, received after it), and collectives,
with random delays before each rank's ops so that a rank that finished its part with us enters the next
collective while we still wait on it or on another peer. Checks run every millisecond of a wait (not 50 ms)
so that a check lands between a peer's last post and our next poll far more often than it would in a real run
(counted once with a spy on Guard.ahead_of_p2p: 10-20 such checks in each test's programs; a rule that raised at
the first of them failed every run).
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from tests.helpers.procs import RankPool

WORLD = 3
KW = dict(backend="cpu", buffsize=32 << 10, nchannels=1, timeout_s=20.0)
FIFO = (32 << 10) // 4                          # float32 elements of one FIFO
SIZES = (0, 1, 1000, 1024, FIFO - 1, FIFO, FIFO + 1, 3 * FIFO + 7)


def _comms(ctx, nch: int, profile: str | None):
    import slicetrace
    from slicetrace.backend.cpu import transport
    st = ctx["state"]
    key = ("order", nch, profile)
    if key not in st:
        assert hasattr(transport, "CHECK_EVERY_S")     # else the line below would patch nothing
        transport.CHECK_EVERY_S = 0.001         # check at (nearly) every pause: see the module docstring
        kw = dict(KW, nchannels=nch)
        if profile:
            kw.update(profiler_plugin="example", profile_dump_file=f"{profile}/t{nch}_{ctx['rank']}",
                      sample_rate=3, op_sample_rate=2)
        cs = [slicetrace.init(rank=ctx["rank"], world_size=ctx["world"], store=ctx["store"],
                              job=f"{ctx['job']}o{len(st)}{i}", **kw) for i in range(2)]
        st[key] = cs
        prev = st.get("close")
        st["close"] = lambda: ([prev() if prev else None], [c.close() for c in cs])
    return st[key]


def _program(seed: int) -> list:
    """Phases every rank agrees on: ('coll', comm, count), ('cross', comm_p2p, comm_coll, src, dst, count, coll
    count): src sends before the collective, dst receives after it, ('group', comm, messages), ('a2a', comm,
    counts matrix); each with per-rank delays."""
    rng = random.Random(seed)
    out = []
    for _ in range(rng.randint(3, 7)):
        delays = [rng.choice((0, 0, 0.002, 0.02, 0.06)) for _ in range(WORLD)]
        kind, comm = rng.choice(("coll", "cross", "group", "group", "a2a", "late", "late", "many")), rng.randrange(2)
        if kind == "late":                      # one rank sends to another that already waits, then a collective
            src, dst = rng.sample(range(WORLD), 2)
            delays[src], delays[dst] = rng.choice((0.004, 0.01, 0.03)), 0
            msgs = [(src, dst, rng.choice(SIZES))]
            if rng.random() < 0.5:              # and the receiver waits on the third rank too
                msgs.append((3 - src - dst, dst, rng.choice(SIZES)))
            out += [("group", comm, msgs, delays), ("coll", rng.randrange(2), rng.choice(SIZES), [0] * WORLD)]
            continue
        if kind == "many":                      # more messages than header slots (16): the sender's lane is held
            src, dst = rng.sample(range(WORLD), 2)
            delays[dst] = rng.choice((0.004, 0.02))
            out.append(("group", comm, [(src, dst, rng.choice((0, 1, 100))) for _ in range(rng.randint(17, 24))],
                        delays))
        elif kind == "coll":
            out.append(("coll", comm, rng.choice(SIZES), delays))
        elif kind == "cross":                   # fits in the FIFO: the send returns before the collective
            src, dst = rng.sample(range(WORLD), 2)
            out.append(("cross", comm, rng.randrange(2), src, dst, rng.choice((0, 1, 1000, FIFO // 2)),
                        rng.choice(SIZES), delays))
        elif kind == "group":
            msgs = [(s, d, rng.choice(SIZES)) for s in range(WORLD) for d in range(WORLD)
                    if s != d for _ in range(rng.choice((0, 1, 1, 2)))]
            rng.shuffle(msgs)
            out.append(("group", comm, msgs, delays))
        else:
            out.append(("a2a", comm, [[rng.choice((0, 1, 700, FIFO + 3)) for _ in range(WORLD)]
                                      for _ in range(WORLD)], delays))
        if rng.random() < 0.7:                  # a collective right after: early finishers enter it first
            out.append(("coll", rng.randrange(2), rng.choice(SIZES), [0] * WORLD))
    return out


def _val(seed: int, src: int, dst: int, k: int, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32) + (seed % 97) * 1000 + src * 100 + dst * 10 + k


def _run(ctx, seeds: list, nch: int, profile: str | None) -> str:
    import time
    cs = _comms(ctx, nch, profile)
    r = ctx["rank"]
    for seed in seeds:
        for ph in _program(seed):
            time.sleep(ph[-1][r])
            if ph[0] == "coll":
                _, c, n, _ = ph
                x = cs[c].all_reduce(np.full(n, r + 1, np.float32))
                assert (x == WORLD * (WORLD + 1) // 2).all(), (seed, ph)
            elif ph[0] == "cross":
                _, cp, cc, src, dst, n, m, _ = ph
                y = np.full(m, r + 1, np.float32)
                if r == src:
                    cs[cp].send(_val(seed, src, dst, 0, n), dst)
                assert (cs[cc].all_reduce(y) == WORLD * (WORLD + 1) // 2).all(), (seed, ph)
                if r == dst:
                    got = np.zeros(n, np.float32)
                    cs[cp].recv(got, src)
                    np.testing.assert_array_equal(got, _val(seed, src, dst, 0, n))
            elif ph[0] == "group":
                _, c, msgs, _ = ph
                outs = []
                with cs[c].group():
                    for k, (s, d, n) in enumerate(msgs):
                        if s == r:
                            cs[c].send(_val(seed, s, d, k, n), d)
                        elif d == r:
                            outs.append((np.zeros(n, np.float32), _val(seed, s, d, k, n)))
                            cs[c].recv(outs[-1][0], s)
                for got, want in outs:
                    np.testing.assert_array_equal(got, want)
            else:
                _, c, m, _ = ph
                send = np.concatenate([_val(seed, r, d, 0, m[r][d]) for d in range(WORLD)])
                out = cs[c].all_to_all(send, send_counts=m[r], recv_counts=[m[s][r] for s in range(WORLD)])
                want = np.concatenate([_val(seed, s, r, 0, m[s][r]) for s in range(WORLD)])
                np.testing.assert_array_equal(out, want)
    return "ok"


@pytest.fixture(scope="module")
def pool():
    p = RankPool(WORLD, timeout=120)
    yield p
    p.close()


@pytest.mark.parametrize("nch,profiled", [(1, False), (2, True)])
def test_correct_mixed_programs_never_raise_the_order_mismatch(pool, tmp_path, nch, profiled):
    seeds = list(range(nch * 1000, nch * 1000 + 12))
    assert pool.run(_run, seeds, nch, str(tmp_path) if profiled else None) == ["ok"] * WORLD
