"""cpu backend driven directly (plan + Work, no session): results against numpy, in place, p2p groups, stamps.

Rank-side functions build their inputs from (seed, rank), so every rank can compute the expected output
itself and only small verdicts travel back to the test.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers.procs import RankPool
from tests.helpers.ref import DTYPES, avg_atol, npdtype as np_dtype, skip_without_bf16

REDOPS = ["sum", "prod", "min", "max", "avg"]
FUNCS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]
SMALL = dict(buffsize=64 * 1024, p2p_chunksize=4096)          # 8 KiB FIFO steps: many slices, cheap data
SENTINEL = 99             # out-of-place outputs start as this: no input (-4..4) or (partial) result here is 99


# ---------------------------------------------------------------- rank side

def backend(ctx, key: str, **kw):
    """One backend per (pool process, key), closed when the pool closes."""
    from slicetrace.backend.base import create
    from slicetrace.config import Settings
    st_ = ctx["state"]
    bes = st_.setdefault("backends", {})
    if key not in bes:
        kw.setdefault("timeout_s", 30.0)
        bes[key] = create(Settings(backend="cpu", **kw), ctx["rank"], ctx["world"], ctx["store"],
                          f"{ctx['job']}{key}")
        st_["close"] = lambda: [b.close() for b in bes.values()]
    return bes[key]


def make_input(seed: int, rank: int, n: int, dtype: str, redop: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    lo, hi = (1, 3) if redop == "prod" else ((0, 4) if dtype == "uint8" else (-4, 5))
    return rng.integers(lo, hi, n).astype(np_dtype(dtype))


def reduce_ref(xs: list, redop: str, nranks: int) -> np.ndarray:
    f = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.fmin, "max": np.fmax}[redop]
    acc = xs[0].copy()
    for x in xs[1:]:
        f(acc, x, out=acc)
    if redop == "avg":
        if acc.dtype.kind in "iu":       # NCCL SumPostDiv: truncation toward zero
            acc = (np.sign(acc.astype(np.int64)) * (np.abs(acc.astype(np.int64)) // nranks)).astype(acc.dtype)
        else:
            return np.mean([x.astype(np.float64) for x in xs], axis=0)     # the exact mean
    return acc


def run_case(ctx, key: str, kw: dict, case: dict, stamps: bool = False):
    from slicetrace.backend.base import Work
    from slicetrace.plan.schedule import plan_collective
    be = backend(ctx, key, **kw)
    r, n = ctx["rank"], ctx["world"]
    func, count, dtype, redop, root = case["func"], case["count"], case["dtype"], case["redop"], case["root"]
    nin = count * n if func == "reduce_scatter" else count
    nout = count * n if func == "all_gather" else count
    xs = [make_input(case["seed"], q, nin, dtype, redop) for q in range(n)]
    x = xs[r].copy()
    if case.get("inplace"):
        if func == "all_gather":
            y = np.zeros(nout, x.dtype)
            y[r * count:(r + 1) * count] = x
            x = y[r * count:(r + 1) * count]
        elif func == "reduce_scatter":
            y = x[r * count:(r + 1) * count]
        else:
            y = x
    else:
        y = np.full(nout, SENTINEL, x.dtype)
    before_y = y.copy()                  # a non-root reduce must leave its output untouched (NCCL: recvbuff unused)
    plan = plan_collective(func, n, r, count, x.dtype.itemsize, root, be.nch, be.settings.step_bytes)
    work = Work(case.get("tag", 1), plan, dtype, redop, x, y, stamp_steps=stamps, stamp_channels=stamps,
                sample_rate=case.get("rate", 1))
    before = be.rings.header["reserved"].copy()
    be.submit(work)
    if func == "all_reduce":
        exp = reduce_ref(xs, redop, n)
    elif func == "reduce_scatter":
        exp = reduce_ref(xs, redop, n)[r * count:(r + 1) * count]
    elif func == "all_gather":
        exp = np.concatenate(xs)
    elif func == "broadcast":
        exp = xs[root]
    else:
        exp = reduce_ref(xs, redop, n) if r == root else before_y
    atol = avg_atol(xs, redop, dtype) if not (func == "reduce" and r != root) else None
    if atol is None:
        ok = np.array_equal(y.astype(np.float64), exp.astype(np.float64))
    else:                                # PreMulSum: exact only within its roundings (tests.helpers.ref.avg_atol)
        ok = bool(np.allclose(y.astype(np.float64), exp, rtol=0, atol=atol))
    detail = "" if ok else f"rank {r}: got {y[:8]}... expected {exp[:8]}..."
    out = {"ok": ok, "detail": detail}
    if stamps:
        out["stamps"] = read_stamps(be, before)
        out["expected"] = expected(plan, case.get("rate", 1))
        out["sampled_out"] = int(be.rings.header["sampled_out"].sum())
    return out


def read_stamps(be, before) -> list:
    """Every entry written since `before`: (kind, channel, flags, peer, step, size, op, wait, ready, done).
    A backend whose records reach the rings through fetch_stamps gets that call first, as the drain makes it."""
    views = be.rings
    if be.stamps_fetched:
        be.fetch_stamps(before.astype(np.int64), views.header["reserved"].astype(np.int64))
    recs = []
    for ch in range(views.nchannels):
        for seq in range(int(before[ch]) + 1, int(views.header["reserved"][ch]) + 1):
            s = views.started[ch][seq % views.slots]
            c = views.completed[ch][seq % views.slots]
            assert s["seq"] == seq and c["seq"] == seq, f"seq {seq} of channel {ch} not published"
            ident = [(int(e["kind"]), int(e["flags"]), int(e["peer"]), int(e["step"]), int(e["size"]), int(e["op"]))
                     for e in (s, c)]
            assert ident[0] == ident[1], f"started/completed disagree: {ident}"
            k, f, p, stp, sz, op = ident[0]
            recs.append((k, ch, f, p, stp, sz, op, int(s["wait"]), int(s["ready"]), int(c["done"])))
    return recs


def expected(plan, rate: int = 1) -> dict:
    from slicetrace.plan.traffic import expected_slices, stamp_records
    dirs: dict = {}          # (channel, is_send) -> bytes of each slice of that direction in order, empty ones too
    for p in plan.programs:
        for prim in p.prims:
            for _, n in prim.slices:
                for is_send, peer in ((False, prim.recv_from), (True, prim.send_to)):
                    if peer is not None:
                        dirs.setdefault((p.channel, is_send), []).append(n * plan.itemsize)
    return {"slices": expected_slices(plan), "programs": [(p.channel, p.kind) for p in plan.programs],
            "dirs": sorted(dirs.items()), "slice_steps": plan.proto.slice_steps,
            "records": [stamp_records(p, rate, True, True) for p in plan.programs]}


# ---------------------------------------------------------------- test side

@pytest.fixture(scope="module")
def pools():
    made: dict[int, RankPool] = {}

    def get(n: int) -> RankPool:
        if n not in made:
            made[n] = RankPool(n, timeout=120)
        return made[n]
    yield get
    for p in made.values():
        p.close()


def check(pool: RankPool, key: str, kw: dict, cases: list, stamps: bool = False):
    outs = []
    for case in cases:
        res = pool.run(run_case, key, kw, case, stamps)
        bad = [r["detail"] for r in res if not r["ok"]]
        assert not bad, f"{case}: {bad[0]}"
        outs.append(res)
    return outs


def cases_for(n: int, counts, dtypes=("float32",), redops=("sum",), inplace=(False,)):
    return [dict(func=f, count=c, dtype=d, redop=o, root=(c + 1) % n, seed=c, inplace=ip)
            for f in FUNCS for c in counts for d in dtypes for o in redops for ip in inplace
            if o == "sum" or f in ("all_reduce", "reduce_scatter", "reduce")]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_collectives_small_fifo(pools, n):
    """Every function, counts 0 / 1 / prime / several FIFO laps, out of place and in place, 2 channels."""
    counts = [0, 1, 17, 20011] if n < 5 else [0, 1, 20011]
    check(pools(n), "small", dict(SMALL, nchannels=2), cases_for(n, counts, inplace=(False, True)))


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_default_geometry(pools, n):
    """NCCL's default 4 MiB FIFO: a count past one ring loop (n x 2 MiB chunks) and a prime."""
    check(pools(n), "default", {}, cases_for(n, [1_100_003, 4099]))


def redop_cases(n: int, dtypes) -> list:
    return [dict(func=f, count=c, dtype=d, redop=o, root=n - 1, seed=7, inplace=False)
            for f in ("all_reduce", "reduce_scatter", "reduce") for d in dtypes for o in REDOPS
            for c in ((1031,) if f == "all_reduce" else (257,))]


@pytest.mark.parametrize("n", [2, 3])
def test_dtypes_and_redops(pools, n):
    check(pools(n), "small", dict(SMALL, nchannels=2), redop_cases(n, DTYPES))


@pytest.mark.parametrize("n", [2, 3])
def test_bfloat16_redops(pools, n):
    skip_without_bf16()
    check(pools(n), "small", dict(SMALL, nchannels=2), redop_cases(n, ["bfloat16"]))


def run_given(ctx, key: str, kw: dict, func: str, dtype: str, redop: str, rows: list) -> list:
    """One collective on this rank's row of `rows` (given values, not generated); the output as a list."""
    from slicetrace.backend.base import Work
    from slicetrace.plan.schedule import plan_collective
    be = backend(ctx, key, **kw)
    r, n = ctx["rank"], ctx["world"]
    x = np.array(rows[r], np_dtype(dtype))
    count = x.size // n if func == "reduce_scatter" else x.size
    y = np.full(count, SENTINEL, x.dtype)
    plan = plan_collective(func, n, r, count, x.dtype.itemsize, 0, be.nch, be.settings.step_bytes)
    be.submit(Work(1, plan, dtype, redop, x, y))
    return y.tolist()


@pytest.mark.parametrize("func", ["all_reduce", "reduce_scatter"])
def test_float_avg_multiplies_each_input_before_the_sum_as_nccl(pools, func):
    """NCCL's PreMulSum for floating types: x * (1/n) as each input enters the sum. Summing first overflowed
    float16 to inf where the mean (and NCCL's answer) is finite."""
    rows = [[60000.0, 65504.0, 40000.0, -65504.0], [60000.0, 65504.0, 40000.0, -65504.0]]
    kw = dict(SMALL, nchannels=2)
    want = [60000.0, 65504.0, 40000.0, -65504.0]
    if func == "all_reduce":
        assert pools(2).run(run_given, "small", kw, func, "float16", "avg", rows) == [want] * 2
    else:
        assert pools(2).run(run_given, "small", kw, func, "float16", "avg", rows) == [want[:2], want[2:]]
    third = np.float16(np.float32(1 / 3))            # float(1.0/n) in the type, as NCCL's scalar
    t = np.float16(np.float16(3.0) * third)          # each input times it, rounded; 2t exact, 2t + t rounded
    got = pools(3).run(run_given, "small", kw, "all_reduce", "float16", "avg", [[3.0], [3.0], [3.0]])
    assert got == [[float(np.float16(np.float16(t + t) + t))]] * 3


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_avg_truncates_toward_zero(pools, dtype):
    """NCCL's SumPostDiv for integers: the sum, then C division (toward zero, not floor)."""
    rows = [[-7, 7, -1, -8, 9, 5], [0, 0, 0, 1, -2, 0]]
    kw = dict(SMALL, nchannels=2)
    assert pools(2).run(run_given, "small", kw, "all_reduce", dtype, "avg", rows) == [[-3, 3, 0, -3, 3, 2]] * 2
    assert pools(2).run(run_given, "small", kw, "reduce_scatter", dtype, "avg", rows) == [[-3, 3, 0], [-3, 3, 2]]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(func=st.sampled_from(FUNCS), count=st.integers(0, 40000), root=st.integers(0, 3),
       inplace=st.booleans(), redop=st.sampled_from(REDOPS))
def test_random_counts_and_roots(pools, func, count, root, inplace, redop):
    redop = redop if func in ("all_reduce", "reduce_scatter", "reduce") else "sum"
    case = dict(func=func, count=count, dtype="float64", redop=redop, root=root, seed=count, inplace=inplace)
    check(pools(4), "small", dict(SMALL, nchannels=3), [case])


# ---------------------------------------------------------------- point to point

def run_alltoall(ctx, key: str, kw: dict, k: int, extra: bool):
    """all_to_all as one group (self copy included), each message larger than the FIFO; `extra` adds a
    second send to the next rank and a zero-count pair, so a connection carries several parts in order."""
    from slicetrace.backend.base import Work
    from slicetrace.plan.schedule import P2pPart, plan_p2p
    be = backend(ctx, key, **kw)
    r, n = ctx["rank"], ctx["world"]
    x = (np.arange(n * k, dtype=np.int64) + 1000_000 * r)
    y = np.zeros(n * k, np.int64)
    parts = []
    for j in range(n):
        parts.append((P2pPart(j, True, k, len(parts)), x[j * k:(j + 1) * k]))
        parts.append((P2pPart(j, False, k, len(parts)), y[j * k:(j + 1) * k]))
    if extra and n > 1:
        x2, y2 = np.full(k + 5, r, np.int64), np.zeros(k + 5, np.int64)
        nxt, prv = (r + 1) % n, (r - 1) % n
        parts += [(P2pPart(nxt, True, k + 5, len(parts)), x2), (P2pPart(prv, False, k + 5, len(parts) + 1), y2),
                  (P2pPart(nxt, True, 0, len(parts) + 2), x2[:0]), (P2pPart(prv, False, 0, len(parts) + 3), y2[:0])]
    plan = plan_p2p([p for p, _ in parts], n, r, 8, be.settings.p2p_chunksize, be.settings.step_bytes, be.nch)
    before = be.rings.header["reserved"].copy()
    be.submit(Work(5, plan, "int64", "sum", parts=parts, stamp_steps=True, stamp_channels=True))
    exp = np.concatenate([np.arange(r * k, (r + 1) * k, dtype=np.int64) + 1000_000 * j for j in range(n)])
    ok = np.array_equal(y, exp) and (not extra or n == 1 or bool((y2 == (r - 1) % n).all()))
    return {"ok": ok, "stamps": read_stamps(be, before), "expected": expected(plan)}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_alltoall_larger_than_fifo_no_deadlock(pools, n):
    kw = dict(SMALL, nchannels=2)
    res = pools(n).run(run_alltoall, "small", kw, 30_000, True)     # 240 KB per message vs a 64 KiB FIFO
    assert all(r["ok"] for r in res)
    check_stamps(res)


def check_stamps(res: list) -> None:
    """Counts/sizes/directions as plan.traffic.expected_slices, KernelCh per program, causality on a shared clock."""
    sends, recvs = {}, {}
    nsend = nrecv = 0
    for rank, out in enumerate(res):
        steps = [s for s in out["stamps"] if s[0] == 0]
        chans = [s for s in out["stamps"] if s[0] == 1]
        progs = sorted(ch for ch, _ in out["expected"]["programs"])
        for stop in (0, 2):                              # KernelCh start and stop records (FLAG_CH_STOP)
            assert sorted(ch for _, ch, f, *_ in chans if f & 2 == stop) == progs
        got = sorted((ch, bool(f & 1), p, sz) for _, ch, f, p, _, sz, *_ in steps)
        assert got == sorted((ch, s, p, b) for ch, s, p, _, b in out["expected"]["slices"])
        for _, ch, f, p, step, sz, op, w, rd, d in steps:
            assert w <= rd <= d
            key = (rank, p, step, ch) if f & 1 else (p, rank, step, ch)     # p2p too: one channel both ends
            (sends if f & 1 else recvs)[key] = (rd, d, sz)
        nsend += sum(1 for s in steps if s[2] & 1)
        nrecv += sum(1 for s in steps if not s[2] & 1)
    assert (len(sends), len(recvs)) == (nsend, nrecv), "two stamps of one direction share (src, dst, step, channel)"
    assert sends.keys() == recvs.keys()
    for key, (_, done, size) in sends.items():
        ready, _, rsize = recvs[key]
        assert ready >= done, f"recv ready before send done on {key}"
        assert size == rsize


@pytest.mark.parametrize("n", [2, 3])
def test_stamps_match_plan_and_causality(pools, n):
    for func in FUNCS:
        case = dict(func=func, count=5003, dtype="float32", redop="sum", root=1, seed=3, tag=0x1_0000_0007)
        res = pools(n).run(run_case, "small", dict(SMALL, nchannels=2), case, True)
        assert all(r["ok"] for r in res)
        assert all(s[6] == 7 for r in res for s in r["stamps"])            # op = tag & 0xffffffff
        check_stamps(res)


def test_sampling_counts_skipped(pools):
    case = dict(func="all_reduce", count=40_000, dtype="float32", redop="sum", root=0, seed=1, rate=3)
    key, kw = "sampled", dict(SMALL)
    res = pools(2).run(run_case, key, kw, case, True)
    for out in res:
        steps = [s for s in out["stamps"] if s[0] == 0]
        assert len(steps) + out["sampled_out"] == len(out["expected"]["slices"])
        assert 0 < len(steps) < len(out["expected"]["slices"])
        # per program and direction: exactly the slices whose index in that direction is a multiple of 3
        ss = out["expected"]["slice_steps"]
        for (ch, is_send), sizes in out["expected"]["dirs"]:
            want = [(i, b) for i, b in enumerate(sizes) if i % 3 == 0 and b > 0]
            got = sorted((s[4], s[5]) for s in steps if s[1] == ch and bool(s[2] & 1) == is_send)
            assert want and want[0][0] == 0 and len(got) == len(want), (ch, is_send, got, want)
            assert [((stp - got[0][0]) // ss, sz) for stp, sz in got] == want, (ch, is_send)
        # and as plan.traffic.stamp_records counts them: kept steps (+ a KernelCh start and stop each), skipped
        recs = out["expected"]["records"]
        assert len(out["stamps"]) == sum(r for r, _ in recs) and len(steps) == sum(r - 2 for r, _ in recs)
        assert out["sampled_out"] == sum(k for _, k in recs) > 0


def run_nostamp(ctx):
    be = backend(ctx, "small", **dict(SMALL, nchannels=2))
    before = be.rings.header["reserved"].copy()
    run_case(ctx, "small", dict(SMALL, nchannels=2),
             dict(func="all_reduce", count=999, dtype="int32", redop="sum", root=0, seed=2), False)
    return bool((be.rings.header["reserved"] == before).all())


def test_no_stamps_when_off(pools):
    assert all(pools(3).run(run_nostamp))


def test_step_rounding_between_protocols(pools):
    """broadcast/reduce move 1 step per slice, the ring functions 2 per slice and round conn->step up to 4:
    the receiver must return the credit of the skipped steps, or the FIFO shrinks until the ring deadlocks."""
    cases = []
    for i in range(3):
        cases += [dict(func="broadcast", count=1 + i, dtype="int32", redop="sum", root=0, seed=i),
                  dict(func="broadcast", count=1 + i, dtype="int32", redop="sum", root=1, seed=i),
                  dict(func="all_reduce", count=50_001, dtype="float32", redop="sum", root=0, seed=i),
                  dict(func="reduce", count=3000, dtype="int32", redop="sum", root=1, seed=i),
                  dict(func="all_gather", count=20_011, dtype="int8", redop="sum", root=0, seed=i)]
    check(pools(2), "rounding", dict(SMALL, nchannels=2, timeout_s=10), cases)


@pytest.mark.parametrize("mode", ["on", "off"])
@pytest.mark.parametrize("n", [2, 3])
def test_fifo_line_reclaim_never_touches_unread_data(pools, n, mode):
    """With reclaim forced on, the receiver stores into every slot it has read (one byte per line) while the
    sender may already be filling the next ones: results stay exact over many FIFO laps, p2p included."""
    kw = dict(SMALL, nchannels=2, cpu_reclaim=mode)
    check(pools(n), f"reclaim-{mode}", kw, cases_for(n, [1, 20011, 70001], inplace=(False, True)))
    res = pools(n).run(run_alltoall, f"reclaim-{mode}", kw, 30_000, True)
    assert all(r["ok"] for r in res)


@pytest.mark.parametrize("n", [2, 3])
def test_futex_waits_keep_every_result_exact(pools, n):
    """cpu_wait=futex (auto picks it when ranks outnumber CPUs): ring waits sleep on the tail / head word and the
    neighbour wakes them; a missed wake costs one 1 ms timeout, never a wrong result or a hang."""
    kw = dict(SMALL, nchannels=2, cpu_wait="futex", timeout_s=20)
    check(pools(n), "futex", kw, cases_for(n, [1, 20011, 70001], inplace=(False, True)))
    res = pools(n).run(run_alltoall, "futex", kw, 30_000, True)
    assert all(r["ok"] for r in res)


def bind_masks(ctx, bind: str, lock_dir: str):
    import os
    from slicetrace.backend.base import create
    from slicetrace.backend.cpu import affinity
    from slicetrace.config import Settings
    affinity.LOCK_DIR = lock_dir          # this test's own claims: not those of a job that shares the host
    before = sorted(os.sched_getaffinity(0))
    be = create(Settings(backend="cpu", cpu_bind=bind, timeout_s=30.0, **SMALL), ctx["rank"], ctx["world"],
                ctx["store"], f"{ctx['job']}bind{bind}")
    try:
        during = sorted(os.sched_getaffinity(0))
    finally:
        be.close()
    return before, during, sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="no os.sched_setaffinity here")
def test_cpu_bind_on_gives_each_rank_its_own_free_cpu_while_open(tmp_path, monkeypatch):
    """A fresh pool: the module's pools keep bound backends open, and a bound thread is not bound again."""
    import os
    from slicetrace.backend.cpu import affinity
    d = str(tmp_path / "cpus")
    monkeypatch.setattr(affinity, "LOCK_DIR", d)     # this test process's claims go where the ranks look
    pool = RankPool(2, timeout=60)
    try:
        auto = pool.run(bind_masks, "on", d)
        off = pool.run(bind_masks, "off", d)
        unlaunched = pool.run(bind_masks, "auto", d)    # "auto" binds only the ranks launch() starts
        held = []
        try:                              # another job holds every CPU: the ranks stay unbound
            held = [affinity._claim(c) for c in sorted(os.sched_getaffinity(0))]
            taken = pool.run(bind_masks, "on", d)
        finally:
            for fd in held:
                if fd is not None:
                    os.close(fd)
    finally:
        pool.close()
    allowed = auto[0][0]
    for r, (before, during, after) in enumerate(auto):
        assert before == allowed and after == allowed
        assert during == ([allowed[r]] if len(allowed) >= 2 else allowed)
    for unbound in (off, unlaunched, taken):
        assert all(before == during == after == allowed for before, during, after in unbound)
    assert all(fd is not None for fd in held)      # the ranks had freed their claims at close


def _launched_mask(comm):
    import os
    return sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="no os.sched_setaffinity here")
def test_launch_binds_its_ranks_by_default_when_they_crowd_the_cpus():
    import os
    import slicetrace
    from slicetrace.backend.cpu import affinity
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"needs 2 allowed CPUs for 2 bound ranks, this process has {len(cpus)}")
    fds = [affinity._claim(c) for c in cpus[:2]]
    for fd in fds:
        if fd is not None:
            os.close(fd)
    if None in fds:
        pytest.skip(f"another job on this host holds CPU {cpus[fds.index(None)]} ({affinity.LOCK_DIR})")
    masks = slicetrace.launch(_launched_mask, 2, join_timeout_s=60, timeout_s=30.0)
    # bound where 2 ranks fill more than half of the CPUs (the 2-core CI host); with cores to spare, not
    assert masks == ([[cpus[0]], [cpus[1]]] if len(cpus) < 4 else [cpus, cpus])
    assert slicetrace.launch(_launched_mask, 2, join_timeout_s=60, timeout_s=30.0, cpu_bind="on") == [
        [cpus[0]], [cpus[1]]]
    assert slicetrace.launch(_launched_mask, 2, join_timeout_s=60, timeout_s=30.0, cpu_bind="off") == [cpus, cpus]
