"""Every operation x dtype x reduction x ranks {1..5} x counts {0, 1, prime, large} against numpy.

Rank processes are spawned once per world size and reused; each remote call runs many cases in-process.
A small FIFO (64 KiB) makes modest counts span many chunks, loops and channels.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers.procs import RankPool
from tests.helpers.ref import (DTYPES, REDOPS, avg_atol, data, expected, mismatches, npdtype,
                               skip_without_bf16)

COUNTS = [0, 1, 7919, 100_003]
SMALL = dict(buffsize=1 << 16, nchannels=2, timeout_s=30.0)
JOIN = 120          # launch() bound: a hang fails the test


def _comm(ctx, kw):
    import slicetrace
    key = ("comm", tuple(sorted(kw.items())))
    if key not in ctx["state"]:
        c = slicetrace.init(rank=ctx["rank"], world_size=ctx["world"], store=ctx["store"],
                            job=f"{ctx['job']}{len(ctx['state'])}", **kw)
        ctx["state"][key] = c
        prev = ctx["state"].get("close")
        ctx["state"]["close"] = lambda: ([prev() if prev else None], c.close())
    return ctx["state"][key]


def run_case(comm, op, dtype, redop, count, root, inplace, seed, reg=0, sym=False):
    """reg: a bit per rank whose buffers come from comm.mem_alloc (registered memory: direct slices); sym: as
    symmetric windows (symmetric kernels where every rank's are)."""
    held = []

    def mk(a):
        if not (reg >> comm.rank) & 1:
            return a
        b = comm.mem_alloc(a.shape, a.dtype, symmetric=sym)
        b[...] = a
        held.append(b)
        return b
    try:
        return _run_case(comm, op, dtype, redop, count, root, inplace, seed, mk)
    finally:
        for b in held:
            comm.mem_free(b)


def _run_case(comm, op, dtype, redop, count, root, inplace, seed, mk):
    n, r = comm.world_size, comm.rank
    dt = npdtype(dtype)
    cin = count * n if op in ("reduce_scatter", "all_to_all") else count
    xs = [data(seed, k, cin, dtype, redop) for k in range(n)]
    x = mk(xs[r].copy())
    if op == "all_gather":
        out = mk(np.full(count * n, 55, dtype=dt))
        if inplace:
            out[r * count:(r + 1) * count] = x
            x = out[r * count:(r + 1) * count]
        comm.all_gather(x, out)
    elif op == "reduce_scatter":
        out = x[r * count:(r + 1) * count] if inplace else mk(np.full(count, 55, dtype=dt))
        comm.reduce_scatter(x, out, op=redop)
    elif op == "all_to_all":
        out = mk(np.full(cin, 55, dtype=dt))
        comm.all_to_all(x, out)
    else:
        out = x if inplace else mk(np.full(count, 55, dtype=dt))
        before = out.copy()                  # a non-root reduce must leave it so
        if op == "all_reduce":
            comm.all_reduce(x, out, op=redop)
        elif op == "broadcast":
            comm.broadcast(x, out, root=root)
        else:
            comm.reduce(x, out, root=root, op=redop)
        return mismatches(out, expected(op, xs, r, root, redop, dt), dt, before, avg_atol(xs, redop, dt))
    return mismatches(out, expected(op, xs, r, root, redop, dt), dt, atol=avg_atol(xs, redop, dt))


def run_cases(ctx, kw, cases):
    comm = _comm(ctx, kw)
    bad = []
    for case in cases:
        w = run_case(comm, *case)
        if w:
            bad.append((case, w))
    return bad


@pytest.fixture(scope="module", params=[1, 2, 3, 4, 5])
def pool(request):
    p = RankPool(request.param, timeout=240)
    yield p
    p.close()


OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]
ALL_DTYPES = DTYPES + ["bfloat16"]      # a dtype's index picks its roots, modes and seed
BOTH_MODES = ("int8", "float32")        # run in place and out of place alike


def _cases(op, world, dtypes):
    reduces = op in ("all_reduce", "reduce", "reduce_scatter")
    out = []
    for i, dtype in ((ALL_DTYPES.index(d), d) for d in dtypes):
        for redop in (REDOPS if reduces else ["sum"]):
            for count in COUNTS:
                if count == 100_003 and dtype not in ("float32", "int8", "bfloat16"):
                    continue            # the large count on a few dtypes keeps CI fast
                root = (i + count) % world
                parity = (i + len(redop)) % 2 == 0
                # both modes for a few dtypes (every redop and count); the others alternate by parity
                modes = (parity, not parity) if dtype in BOTH_MODES and op != "all_to_all" else (parity,)
                out += [(op, dtype, redop, count, root, inplace, 11 + i) for inplace in modes]
    return out


@pytest.mark.parametrize("op", OPS)
def test_matches_numpy(pool, op):
    bad = pool.run(run_cases, SMALL, _cases(op, pool.world, DTYPES))
    assert bad == [[]] * pool.world


@pytest.mark.parametrize("op", OPS)
def test_bfloat16_matches_numpy(pool, op):
    skip_without_bf16()
    bad = pool.run(run_cases, SMALL, _cases(op, pool.world, ["bfloat16"]))
    assert bad == [[]] * pool.world


def _nan_cases(ctx, kw):
    """min/max with NaNs in every rank's data at different places: NCCL's fminf/fmaxf keep the number, NaN only
    where every rank has NaN, whichever rank reduces that chunk."""
    comm = _comm(ctx, kw)
    n, r = comm.world_size, comm.rank
    bad = []
    for dtype in ("float16", "float32", "float64"):
        dt = npdtype(dtype)
        count = 7919 * n
        xs = []
        for k in range(n):
            x = np.random.default_rng(k).integers(-50, 50, count).astype(dt)
            x[k::n + 1] = np.nan                    # rank k's NaNs: some shared with others, some its own
            x[::97] = np.nan                        # NaN on every rank
            xs.append(x)
        for redop, f in (("min", np.fmin), ("max", np.fmax)):
            want = f.reduce(np.stack(xs), 0)
            got = comm.all_reduce(xs[r].copy(), op=redop)
            got_rs = comm.reduce_scatter(xs[r].copy(), op=redop)
            if not (np.array_equal(got, want, equal_nan=True)
                    and np.array_equal(got_rs, want[r * 7919:(r + 1) * 7919], equal_nan=True)):
                bad.append((dtype, redop, int(np.isnan(got).sum()), int(np.isnan(want).sum())))
    return bad


def test_min_max_treat_nan_as_nccl_does(pool):
    assert pool.run(_nan_cases, SMALL) == [[]] * pool.world


def test_results_identical_on_every_rank(pool):
    res = pool.run(_allreduce_bytes, SMALL)
    assert all(r == res[0] for r in res)


def _allreduce_bytes(ctx, kw):
    comm = _comm(ctx, kw)
    x = np.random.default_rng(ctx["rank"]).standard_normal(50_001).astype(np.float32)
    return comm.all_reduce(x).tobytes()


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data_=st.data())
def test_random_shapes_default_fifo(pool, data_):
    op = data_.draw(st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]))
    count = data_.draw(st.integers(0, 300_000))
    root = data_.draw(st.integers(0, pool.world - 1))
    redop = data_.draw(st.sampled_from(REDOPS))
    case = (op, "float32", redop, count, root, data_.draw(st.booleans()), 5)
    assert pool.run(run_cases, {"timeout_s": 30.0}, [case]) == [[]] * pool.world


def _uneven_all_to_all(ctx, kw, counts, dtype, alloc):
    """counts[i][j]: the elements rank i sends rank j. Block (i -> j) holds data(seed i*n+j); out=None or given."""
    comm = _comm(ctx, kw)
    n, r = comm.world_size, comm.rank
    dt = npdtype(dtype)
    x = np.concatenate([data(17, r * n + j, counts[r][j], dtype, "sum") for j in range(n)])
    sends, recvs = counts[r], [counts[j][r] for j in range(n)]
    want = np.concatenate([data(17, j * n + r, counts[j][r], dtype, "sum") for j in range(n)])
    if alloc:
        out = comm.all_to_all(x, send_counts=sends, recv_counts=np.array(recvs))
    else:
        out = np.full(sum(recvs), 55, dtype=dt)
        assert comm.all_to_all(x, out, send_counts=tuple(sends), recv_counts=recvs) is out
    return out.shape, int((out != want).sum())


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data_=st.data())
def test_uneven_all_to_all_matches_numpy(pool, data_):
    """Blocks of different sizes (torch's split sizes), zeros and blocks over the 64 KiB FIFO among them."""
    n = pool.world
    sizes = st.one_of(st.just(0), st.integers(1, 50), st.integers(1, 40_000))
    counts = [[data_.draw(sizes) for _ in range(n)] for _ in range(n)]
    dtype = data_.draw(st.sampled_from(["int8", "float16", "int64"]))
    alloc = data_.draw(st.booleans())
    res = pool.run(_uneven_all_to_all, SMALL, counts, dtype, alloc)
    assert res == [((sum(counts[j][r] for j in range(n)),), 0) for r in range(n)]


def test_send_recv_ring_and_group(pool):
    assert pool.run(_ring_sendrecv, SMALL) == [0] * pool.world


def _ring_sendrecv(ctx, kw):
    comm = _comm(ctx, kw)
    n, r = comm.world_size, comm.rank
    bad = 0
    for count in (0, 1, 7919, 300_007):
        x = data(3, r, count, "int32", "sum")
        out = np.full(count, -1, dtype=np.int32)
        with comm.group():
            comm.send(x, (r + 1) % n)
            comm.recv(out, (r - 1) % n)
        bad += int((out != data(3, (r - 1) % n, count, "int32", "sum")).sum())
    return bad


def test_unpaired_send_to_self_is_a_usage_error_and_the_comm_goes_on(pool):
    res = pool.run(_unpaired_self, SMALL)
    k = 2 if pool.world == 1 else 1                  # one rank: the "next" rank is itself too
    for r, (err, bad) in enumerate(res):
        assert err.startswith(f"UsageError: a send/recv group on rank {r} has {k} send(s) to itself and 0 recv(s)")
        assert bad == 0


def _unpaired_self(ctx, kw):
    from slicetrace.errors import UsageError
    comm = _comm(ctx, kw)
    n, r = comm.world_size, comm.rank
    x = np.arange(10, dtype=np.int32)
    try:
        with comm.group():
            comm.send(x, r)
            comm.send(x, (r + 1) % n)
        err = "no error"
    except UsageError as e:
        err = f"UsageError: {e}"
    out = comm.all_reduce(np.full(5, r + 1, dtype=np.int64))     # nothing of the bad group was submitted
    return err, int((out != n * (n + 1) // 2).sum())


def test_eight_ranks_on_the_cpu_backend():
    """n = 8 (the largest GPU box) runs on the CPU engine too: every collective, a few counts."""
    pool = RankPool(8, timeout=240)
    try:
        cases = [(op, "int32", "sum", count, 5, False, 3)
                 for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
                 for count in (0, 1, 20_011)]
        assert pool.run(run_cases, SMALL, cases) == [[]] * 8
    finally:
        pool.close()


def _big_sendrecv(comm, count):
    n, r = comm.world_size, comm.rank
    x = data(9, r, count, "float32", "sum")
    out = np.full(count, -1, dtype=np.float32)
    with comm.group():
        comm.send(x, (r + 1) % n)
        comm.recv(out, (r - 1) % n)
    comm.flush_profiler()
    plan_parts = len(comm._session.backend.ring_send)          # channels the split could use
    return int((out != data(9, (r - 1) % n, count, "float32", "sum")).sum()), comm.drop_counters(), plan_parts


def _big_all_to_all(comm, block):
    n, r = comm.world_size, comm.rank
    x = np.concatenate([data(11, r * n + j, block, "int32", "sum") for j in range(n)])
    out = comm.all_to_all(x)
    want = np.concatenate([data(11, j * n + r, block, "int32", "sum") for j in range(n)])
    comm.flush_profiler()
    return int((out != want).sum()), comm.drop_counters()


def test_large_all_to_all_split_into_offset_pieces_arrives_whole():
    """all_to_all hands its blocks over as offsets into one buffer; large ones are split again into pieces, each
    an (offset, count) of that buffer on its own channel, and the copy to self is one of them."""
    import slicetrace
    block = 3 * (1 << 20) // 4 + 5                # 3 MiB per peer and an odd tail
    res = slicetrace.launch(_big_all_to_all, 3, block, nchannels=16, buffsize=1 << 16, profiler_plugin="example",
                            timeout_s=60.0, join_timeout_s=JOIN)
    for wrong, counters in res:
        assert wrong == 0
        lost = {k: v for k, v in counters.items() if v and not k.startswith(("delivered", "unrecorded_", "clock_"))}
        assert lost == {}, lost
        assert counters["delivered_p2p"] == 6          # one P2p event per send and recv entry
        assert counters["delivered_kernel_ch"] == 24   # 2 peers x 2 directions x 6 pieces (3 MiB / 512 KiB)


def test_large_send_recv_split_over_channels_arrives_whole():
    """With many channels a large part is split into aligned pieces on separate programs (NCCL's p2p
    channels per peer); every piece lands, and each P2p event completes on its pieces' KernelCh records."""
    import slicetrace
    count = 5 * (1 << 20) // 4 + 3                # 5 MiB and an odd tail: 8 pieces (at most nchannels / 2)
    res = slicetrace.launch(_big_sendrecv, 2, count, nchannels=16, buffsize=1 << 16, profiler_plugin="example",
                            timeout_s=60.0, join_timeout_s=JOIN)
    for wrong, counters, nch in res:
        assert wrong == 0 and nch == 16
        lost = {k: v for k, v in counters.items() if v and not k.startswith(("delivered", "unrecorded_", "clock_"))}
        assert lost == {}, lost
        assert counters["delivered_p2p"] == 2 and counters["delivered_kernel_ch"] == 16  # 8 pieces each way
