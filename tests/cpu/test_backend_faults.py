"""cpu backend failures: abort, a peer killed mid-operation, a rank that never arrives, timeouts, and
operations that differ across ranks. Every failure must reach every rank as an error, never a hang (set-up deaths:
test_setup_deaths.py)."""
from __future__ import annotations

import glob
import os
import re
import signal
import threading
import time

import numpy as np
import pytest

from tests.cpu.test_backend import SMALL, backend, make_input
from tests.helpers.procs import RankError, RankPool


def submit_case(ctx, key: str, kw: dict, case: dict, then_ok: bool = False):
    """Submit one collective or send/recv; return (error type, message) instead of raising."""
    from slicetrace.backend.base import Work
    from slicetrace.plan.schedule import P2pPart, plan_collective, plan_p2p
    be = backend(ctx, key, **kw)
    r, n = ctx["rank"], ctx["world"]
    c = case[r] if isinstance(case, list) else case
    try:
        for i in range(2 if then_ok else 1):          # then_ok: a follow-up all_reduce must fail too
            c = dict(func="all_reduce", count=1, dtype=c["dtype"]) if i else c
            f = c["func"]
            x = make_input(1, r, c["count"] * (n if f == "reduce_scatter" else 1), c["dtype"], "sum")
            y = np.empty(c["count"] * (n if f == "all_gather" else 1), x.dtype)
            if c["func"] == "send_recv":
                part = P2pPart(c["peer"], c["is_send"], c["count"], 0)
                plan = plan_p2p([part], n, r, x.itemsize, be.settings.p2p_chunksize, be.settings.step_bytes, be.nch)
                be.submit(Work(1, plan, c["dtype"], "sum", parts=[(part, x)]))
            else:
                plan = plan_collective(c["func"], n, r, c["count"], x.itemsize, c.get("root", 0), be.nch,
                                       be.settings.step_bytes)
                be.submit(Work(1, plan, c["dtype"], c.get("redop", "sum"), x, y))
        return ("ok", "")
    except Exception as e:  # noqa: BLE001 - reported to the test
        return (type(e).__name__, str(e))
    finally:
        ctx["state"]["backends"].pop(key).close()


def idle_then(ctx, key: str, kw: dict, action: str, delay: float):
    be = backend(ctx, key, **kw)
    time.sleep(delay)
    if action == "abort":
        be.abort("boom from the test")
    ctx["state"]["backends"].pop(key).close()
    return "done"


def then_signal(ctx, key: str, fn, *args):
    """fn(ctx, key, *args), then set the store key `<key>/done` (whatever fn did): a peer idling in
    idle_until_done may close once this rank has seen its op end."""
    try:
        return fn(ctx, key, *args)
    finally:
        ctx["store"].set(f"{key}/done", b"1")


def idle_until_done(ctx, key: str, kw: dict):
    """Set up, then stay alive without submitting until the peer's `<key>/done` (then_signal); 50 s at most (under
    the pool's 60 s, so a missing peer shows as this store error)."""
    backend(ctx, key, **kw)
    try:
        ctx["store"].get(f"{key}/done", 50.0, what=f"the peer's end of test case {key!r}")
    finally:
        ctx["state"]["backends"].pop(key).close()
    return "done"


def shm_left(ctx, key: str) -> list:
    return glob.glob(f"/dev/shm/st_{ctx['job']}{key}_*")


def _warm(ctx):
    """A no-op from this module: a pool process imports the test modules (numpy, hypothesis) and the cpu backend on
    its first message, which under load took longer than a test's 1 s set-up timeout."""
    import slicetrace.backend.cpu.backend  # noqa: F401
    import slicetrace.plan.schedule  # noqa: F401
    return ctx["rank"]


def warm_pool(world: int, timeout: float = 60) -> RankPool:
    """A pool whose processes have all answered once: they are past their imports."""
    p = RankPool(world, timeout=timeout)
    try:
        assert p.run(_warm) == list(range(world))
    except BaseException:
        p.close()
        raise
    return p


@pytest.fixture(scope="module")
def pool3():
    p = warm_pool(3)
    yield p
    p.close()


@pytest.fixture(scope="module")
def pool2():
    p = warm_pool(2)
    yield p
    p.close()


def _results(pool: RankPool, fns: list) -> list:
    """Different functions on different ranks, run concurrently (RankPool.run_each: a rank that hangs gets the
    pool killed before the test fails)."""
    return pool.run_each(fns)


def test_abort_reaches_every_rank(pool3):
    kw = dict(SMALL, timeout_s=20)
    case = dict(func="all_reduce", count=5000, dtype="float32")
    res = _results(pool3, [(idle_then, ("abort", kw, "abort", 0.3)), (submit_case, ("abort", kw, case)),
                           (submit_case, ("abort", kw, case))])
    for kind, msg in res[1:]:     # the abort word, not a timeout: its reason and who posted it
        assert (kind, msg) == ("PeerError", "boom from the test (abort posted by rank 0)"), (kind, msg)
    assert pool3.run(shm_left, "abort") == [[], [], []]


def test_timeout_when_a_rank_never_submits(pool2):
    kw = dict(SMALL, timeout_s=1.0)
    # rank 1 idles, alive, until rank 0 has seen its op end (not for a fixed time that a loaded machine could overrun)
    res = _results(pool2, [(then_signal, ("tmo", submit_case, kw, dict(func="all_reduce", count=100, dtype="int32"))),
                           (idle_until_done, ("tmo", kw))])
    # the deadline of rank 0's first wait ran out (rank 1 is alive, so no peer check fires): it says what it
    # waited for and how long
    assert res[1] == "done"
    assert res[0] == ("CommTimeoutError", "rank 0 waited 1.0s (timeout_s) for data from rank 1 on channel 0 (step 0); "
                                          "rank(s) 1 had not started collective #1")


def stamped_until_timeout(ctx, key: str, kw: dict):
    """A stamped all_reduce whose peer never comes: what the rings hold once the timeout was raised."""
    from slicetrace.backend.base import Work
    from slicetrace.plan.schedule import plan_collective
    be = backend(ctx, key, **kw)
    x = np.ones(20_000, np.float32)
    plan = plan_collective("all_reduce", ctx["world"], ctx["rank"], x.size, 4, 0, be.nch, be.settings.step_bytes)
    try:
        be.submit(Work(7, plan, "float32", "sum", x, np.empty_like(x), stamp_steps=True, stamp_channels=True))
        kind = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test
        kind = type(e).__name__
    v = be.rings
    top = int(v.header["reserved"][0])
    ents = [(int(v.started["seq"][0, q % v.slots]), int(v.completed["seq"][0, q % v.slots]),
             int(v.started["op"][0, q % v.slots]), int(v.started["kind"][0, q % v.slots]),
             int(v.started["flags"][0, q % v.slots])) for q in range(1, top + 1)]
    ctx["state"]["backends"].pop(key).close()
    return kind, ents


def test_a_failed_op_publishes_the_slices_it_completed(pool2):
    """Staged records reach the rings when the op fails (stamper.py): the sends made before the wait for data
    that timed out are published whole, with their KernelCh start."""
    kw = dict(SMALL, timeout_s=1.0)
    res = _results(pool2, [(then_signal, ("pub", stamped_until_timeout, kw)), (idle_until_done, ("pub", kw))])
    kind, ents = res[0]
    assert kind == "CommTimeoutError" and len(ents) >= 2, res[0]
    assert all(st == co == q for q, (st, co, *_) in enumerate(ents, 1))            # every reserved seq published
    assert {op for _, _, op, _, _ in ents} == {7}
    assert ents[0][3] == 1 and all(k == 0 and f & 1 for _, _, _, k, f in ents[1:])  # KernelCh start, then sends


def test_rank_missing_at_init_times_out(pool2):
    def only_rank0():
        return pool2.run(submit_case, "init", dict(SMALL, timeout_s=1.0), dict(func="all_reduce", count=1,
                                                                             dtype="int32"), ranks=[0])
    with pytest.raises(RankError, match=r"CommTimeoutError: rendezvous: \"rank 1's cpu backend segment"):
        only_rank0()
    assert pool2.run(shm_left, "init") == [[], []]


MISMATCHES = {
    "count": [dict(func="all_reduce", count=1000, dtype="float32"), dict(func="all_reduce", count=2000, dtype="float32")],
    "func": [dict(func="all_reduce", count=1000, dtype="float32"), dict(func="broadcast", count=1000, dtype="float32")],
    "dtype": [dict(func="all_reduce", count=1000, dtype="float32"), dict(func="all_reduce", count=1000, dtype="int32")],
    "root": [dict(func="broadcast", count=1000, dtype="int8", root=0), dict(func="broadcast", count=1000, dtype="int8", root=1)],
    "redop": [dict(func="reduce", count=64, dtype="int64", redop="sum"), dict(func="reduce", count=64, dtype="int64", redop="max")],
    "zero": [dict(func="all_gather", count=0, dtype="uint8"), dict(func="all_gather", count=3000, dtype="uint8")],
}


# how the message describes each side of MISMATCHES: ranks 0 and 1 run the first, rank 2 the second
MISMATCH_TEXT = {
    "count": ("all_reduce(count=1000, dtype=float32, op=sum)", "all_reduce(count=2000, dtype=float32, op=sum)"),
    "func": ("all_reduce(count=1000, dtype=float32, op=sum)", "broadcast(count=1000, dtype=float32, root=0)"),
    "dtype": ("all_reduce(count=1000, dtype=float32, op=sum)", "all_reduce(count=1000, dtype=int32, op=sum)"),
    "root": ("broadcast(count=1000, dtype=int8, root=0)", "broadcast(count=1000, dtype=int8, root=1)"),
    "redop": ("reduce(count=64, dtype=int64, op=sum, root=0)", "reduce(count=64, dtype=int64, op=max, root=0)"),
    "zero": ("all_gather(count=0, dtype=uint8)", "all_gather(count=3000, dtype=uint8)"),
}
MISMATCH_MSG = re.compile(r"collective #1 differs across ranks: rank (\d) runs (.+?) \[nchannels=1, step_bytes=8192\], "
                          r"rank (\d) runs (.+?) \[nchannels=1, step_bytes=8192\]( \(abort posted by rank [012]\))?")


@pytest.mark.parametrize("what", sorted(MISMATCHES))
def test_mismatch_raises_on_every_rank(pool3, what):
    a, b = MISMATCHES[what]
    res = pool3.run(submit_case, f"mm{what}", dict(SMALL, timeout_s=10), [a, a, b])
    for kind, msg in res:
        assert kind == "MismatchError" and "differs across ranks" in msg, (kind, msg)
    ta, tb = MISMATCH_TEXT[what]
    for kind, msg in res:       # each rank: the two sides that differ, each as the rank that ran it described it
        m = MISMATCH_MSG.fullmatch(msg)
        assert m, msg
        sides = {(int(m.group(1)), m.group(2)), (int(m.group(3)), m.group(4))}
        assert sides in ({(0, ta), (2, tb)}, {(1, ta), (2, tb)}), msg


def test_p2p_count_mismatch(pool2):
    """The receiver detects it on the first data; a sender whose data fit in the FIFO learns it at its next wait."""
    cases = [dict(func="send_recv", peer=1, is_send=True, count=1000, dtype="int64"),
             dict(func="send_recv", peer=0, is_send=False, count=1500, dtype="int64")]
    res = pool2.run(submit_case, "p2pmm", dict(SMALL, timeout_s=10), cases, True)
    for kind, msg in res:
        assert kind == "MismatchError" and "point-to-point mismatch" in msg, (kind, msg)


PEER_GONE = re.compile(r"rank 2 \(pid \d+\) (exited|exited \(pid reused\)|died \(zombie\)); detected by rank [013]"
                       r" in collective #\d+, waiting for (data|credit) from rank [0-3] on channel \d \(step \d+\)"
                       r"( \(abort posted by rank [013]\))?")


@pytest.mark.parametrize("send, recv", [(("float32", 1000), ("int32", 1000)), (("int64", 1000), ("int32", 2000))],
                         ids=["same-size", "same-bytes"])
def test_p2p_dtype_mismatch(pool2, send, recv):
    """A receive of another dtype is refused even where the bytes would fit exactly: the receiver checks the
    sender's (count, dtype) on the first data, and its abort reaches the sender."""
    (sdt, sn), (rdt, rn) = send, recv
    cases = [dict(func="send_recv", peer=1, is_send=True, count=sn, dtype=sdt),
             dict(func="send_recv", peer=0, is_send=False, count=rn, dtype=rdt)]
    res = pool2.run(submit_case, "p2pdt", dict(SMALL, timeout_s=10), cases, True)
    detail = (f"point-to-point mismatch: rank 1 expects message #0 of {rn} x {rdt} from rank 0, rank 0 sends "
              f"a message of {sn} x {sdt}")
    assert res == [("MismatchError", detail + " (abort posted by rank 1)"), ("MismatchError", detail)], res


def killed_mid_op(ctx, key: str, kw: dict, victim: int):
    be = backend(ctx, key, **kw)
    from slicetrace.backend.base import Work
    from slicetrace.plan.schedule import plan_collective
    if ctx["rank"] == victim:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    x = np.ones(200_000, np.float32)
    plan = plan_collective("all_reduce", ctx["world"], ctx["rank"], x.size, 4, 0, be.nch, be.settings.step_bytes)
    try:
        while True:
            be.submit(Work(1, plan, "float32", "sum", x, np.empty_like(x)))
    except Exception as e:  # noqa: BLE001
        res = (type(e).__name__, str(e))
    ctx["state"]["backends"].pop(key).close()
    return res + (shm_left(ctx, key),)


def test_peer_killed_mid_op():
    pool = RankPool(4, timeout=60)
    try:
        res = pool.results_or_errors(killed_mid_op, "kill", dict(SMALL, timeout_s=10), 2)
        left = glob.glob(f"/dev/shm/st_{pool.job}kill_*")     # survivors closed; the victim's was unlinked
    finally:
        pool.close()
    assert isinstance(res[2], RankError) and res[2].name == "EOFError"
    for r in (0, 1, 3):
        kind, msg, _ = res[r]
        # found by a liveness check of rank 2's process (its own, or one that another survivor's abort carries),
        # not by running out of time: that would be a CommTimeoutError
        assert kind == "PeerError" and PEER_GONE.fullmatch(msg), res[r]
    assert left == []


def open_then_list(ctx, key: str, kw: dict):
    """Segment names in /dev/shm while the backend is open (after an all_reduce: every rank is past its set-up),
    and the all_reduce's result."""
    from slicetrace.backend.base import Work
    from slicetrace.plan.schedule import plan_collective
    be = backend(ctx, key, **kw)
    try:
        x = np.full(1000, ctx["rank"] + 1.0, np.float32)
        y = np.empty_like(x)
        be.submit(Work(1, plan_collective("all_reduce", ctx["world"], ctx["rank"], x.size, 4, 0, be.nch,
                                          be.settings.step_bytes), "float32", "sum", x, y))
        return shm_left(ctx, key), float(y[0])
    finally:
        ctx["state"]["backends"].pop(key).close()


def test_segment_names_are_gone_once_every_rank_attached(pool3):
    """A rank that ends without close() (a torchrun script that just exits, a SIGKILL) left its ~14 MB segment in
    /dev/shm for good: only launch() removed leftovers. Each rank now unlinks its name once all have attached."""
    res = pool3.run(open_then_list, "names", dict(SMALL))
    assert res == [([], 6.0)] * 3


def open_with(ctx, key: str, per_rank: list):
    """A backend with this rank's settings; (error type, message)."""
    try:
        backend(ctx, key, **per_rank[ctx["rank"]])
        ctx["state"]["backends"].pop(key).close()
        return ("ok", "")
    except Exception as e:  # noqa: BLE001 - reported to the test
        return (type(e).__name__, str(e))


@pytest.mark.parametrize("field, values", [("ring_slots", (64, 128)), ("buffsize", (1 << 16, 1 << 17)),
                                           ("nchannels", (1, 2)), ("p2p_chunksize", (4096, 8192))])
def test_ranks_whose_settings_differ_fail_at_set_up_on_every_rank(pool2, field, values):
    """A FIFO or stamp ring laid out differently at the two ends would misread every slot: the attach compares
    them and refuses, naming both ranks' settings. A p2p chunk size that differs cut messages into steps unalike:
    the receiver read half-filled slots with no error (8976 of 10000 elements wrong), before it was compared."""
    per_rank = [dict(SMALL, timeout_s=10.0, **{field: v}) for v in values]
    res = pool2.run(open_with, f"set{field}", per_rank)
    for r, (kind, msg) in enumerate(res):
        # the rank that attaches second may find the first one's segment already gone with its failed set-up
        assert kind in ("MismatchError", "PeerError") and "every rank needs the same settings" in msg, (r, msg)
        assert "runs the cpu backend with (nchannels, buffsize, world, ring_slots, p2p_chunksize)=" in msg
        assert kind == "MismatchError" or f"rank {1 - r}'s set-up failed: MismatchError: " in msg
    assert "MismatchError" in {kind for kind, _ in res}
    assert glob.glob(f"/dev/shm/st_{pool2.job}set{field}_*") == []        # both set-ups ended: nothing left
