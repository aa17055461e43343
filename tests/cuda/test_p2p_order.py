"""Ranks that issue point-to-point and collectives in different orders (rank 0 runs all_reduce then sends to rank 1,
rank 1 receives then runs all_reduce): each waits for the other. Before, both ended in CommTimeoutError at
timeout_s; now both raise MismatchError naming the two sides, as the cpu backend does (backend/cuda/order.py), and
programs whose messages cross a collective correctly still run. The rule itself is tested on the host
(test_p2p_order_rule.py)."""
from __future__ import annotations

import pytest

from slicetrace.backend.base import Work
from slicetrace.plan.schedule import P2pPart, plan_collective, plan_p2p
from tests.cuda import ranks
from tests.helpers.procs import RankPool

SMALL_FIFO = {"buffsize": 32768}       # 8 steps of 4 KiB: a send of 8193 float32 (9 steps) needs its receiver
LONG = 8193
TAIL = " first (point-to-point: the ranks called their ops in different orders)"


def issue_then_wait(ctx: dict, ops: list, wait_s: float) -> dict:
    """Issue this rank's ops without waiting (as the API does), then wait for each: ('coll', count) an all_reduce
    of ones, ('send', peer, count) of rank + 1, ('recv', peer, count). Returns the first error ('Type: message'),
    whether every result is right, and a sum the GPU must compute afterwards."""
    import cupy
    be = ctx["state"]["be"]
    r, w = ctx["rank"], ctx["world"]
    checks, err = [], None
    try:
        toks = []
        for op in ops:
            ctx["state"]["tag"] += 1
            if op[0] == "coll":
                x, y = cupy.ones(op[1], cupy.float32), cupy.zeros(op[1], cupy.float32)
                plan = plan_collective("all_reduce", w, r, op[1], 4, 0, be.channels_for(op[1] * 4),
                                       be.settings.step_bytes)
                work = Work(ctx["state"]["tag"], plan, "float32", "sum", sendbuf=x, recvbuf=y)
                checks.append((y, float(w)))
            else:
                kind, peer, n = op
                buf = cupy.full(n, r + 1, cupy.float32) if kind == "send" else cupy.zeros(n, cupy.float32)
                part = P2pPart(peer, kind == "send", n, 0)
                plan = plan_p2p([part], w, r, 4, be.settings.p2p_chunk_bytes, be.settings.step_bytes,
                                be.p2p_channels())
                work = Work(ctx["state"]["tag"], plan, "float32", "sum", parts=[(part, buf)])
                if kind == "recv":
                    checks.append((buf, float(peer + 1)))
            toks.append(be.submit(work))
        for tok in toks:
            be.wait(tok, wait_s)
    except Exception as e:               # noqa: BLE001 - reported to the test
        err = f"{type(e).__name__}: {e}"
    right = err is None and all(bool((b == v).all()) for b, v in checks)
    z = cupy.arange(1000, dtype=cupy.float32).sum()     # the GPU must be free again
    cupy.cuda.runtime.deviceSynchronize()
    return {"err": err, "right": right, "z": float(z)}


def _said(after: int, step: int, before: int, mine: str) -> str:
    return (f"collective #1 differs across ranks: rank {after} runs all_reduce(count=1000, dtype=float32, op=sum) "
            f"[nchannels=1, step_bytes={step}], rank {before} runs {mine}{TAIL}")


ORDERS = {   # (settings, rank 0's ops, rank 1's ops, what both say)
    "receive first": ({}, [("coll", 1000), ("send", 1, 1000)], [("recv", 0, 1000), ("coll", 1000)],
                      _said(0, 524288, 1, "a receive of 1000 x float32 from rank 0")),
    "receive, no collective": ({}, [("coll", 1000), ("send", 1, 1000)], [("recv", 0, 1000)],
                               _said(0, 524288, 1, "a receive of 1000 x float32 from rank 0")),
    "long send first": (SMALL_FIFO, [("send", 1, LONG), ("coll", 1000)], [("coll", 1000), ("recv", 0, LONG)],
                        _said(1, 4096, 0, f"a send of {LONG} x float32 to rank 1")),
}


@pytest.mark.cuda
def test_ranks_that_order_point_to_point_and_a_collective_differently_raise_mismatch_error_on_both(gpu, kcache):
    """Each rank issues all its ops, then waits: the rank that finds the order first aborts, the other finds it
    from the same counts (its kernel exits on the abort words), so both say the same thing; never a timeout."""
    pool = RankPool(2, timeout=300)
    out = {}
    try:
        for what, (kw, ops0, ops1, _) in ORDERS.items():
            pool.run(ranks.setup, {"cache_dir": kcache, "timeout_s": 20.0, **kw})
            out[what] = pool.run_each([(issue_then_wait, (ops0, 10.0)), (issue_then_wait, (ops1, 10.0))])
    finally:
        pool.close()
    for what, res in out.items():
        print(f"\n{what}: {res}")
        for r, x in enumerate(res):
            assert x["err"] is not None and x["err"].startswith(f"MismatchError: rank {r}: "), (what, r, x)
            assert ORDERS[what][3] in x["err"], (what, r, x)
            assert x["z"] == 499500.0


CORRECT = [   # rank 0's ops, rank 1's: messages that cross a collective where that can finish
    ([("send", 1, 1000), ("coll", 1000), ("recv", 1, LONG), ("coll", 4096)],
     [("coll", 1000), ("recv", 0, 1000), ("send", 0, LONG), ("coll", 4096)]),
    ([("send", 1, LONG), ("coll", 1000), ("send", 1, 8192), ("coll", 10), ("recv", 1, 10)],
     [("recv", 0, LONG), ("coll", 1000), ("send", 0, 10), ("coll", 10), ("recv", 0, 8192)]),
]


@pytest.mark.cuda
def test_messages_that_cross_a_collective_where_they_can_still_run(gpu, kcache):
    """A send that fits the FIFO (8 steps at most) may be issued before a collective its receiver runs first, a
    long one only where both ranks issue it on the same side of every collective: no MismatchError, right data."""
    pool = RankPool(2, timeout=300)
    try:
        pool.run(ranks.setup, {"cache_dir": kcache, "timeout_s": 20.0, **SMALL_FIFO})
        res = [pool.run_each([(issue_then_wait, (ops0, 20.0)), (issue_then_wait, (ops1, 20.0))])
               for ops0, ops1 in CORRECT]
    finally:
        pool.close()
    print(f"\n{res}")
    assert res == [[{"err": None, "right": True, "z": 499500.0}] * 2] * len(CORRECT), res


def _collective_then_send(comm):
    import cupy
    with cupy.cuda.Device(comm._session.backend.device):
        x = cupy.ones(1000, cupy.float32)
        if comm.rank == 0:
            comm.all_reduce(x, x)
            comm.send(x, 1)
        else:
            comm.recv(x, 0)
            comm.all_reduce(x, x)
        comm.synchronize()
    return "done"


@pytest.mark.cuda
def test_the_api_raises_mismatch_error_on_both_ranks(gpu, kcache):
    import slicetrace
    from slicetrace.errors import PeerError
    with pytest.raises(PeerError, match="Mismatch") as e:
        slicetrace.launch(_collective_then_send, 2, backend="cuda", cache_dir=kcache, timeout_s=20.0,
                          join_timeout_s=240)
    assert sorted(e.value.errors) == [0, 1], e.value.errors
    want = _said(0, 524288, 1, "a receive of 1000 x float32 from rank 0")
    for r, err in e.value.errors.items():
        head = err.split("\n", 1)[0]
        assert head.startswith(f"MismatchError: rank {r}: ") and want in head, head
