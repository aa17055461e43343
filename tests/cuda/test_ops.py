"""Every op x dtype x reduction against a float64/numpy reference; random inputs, poisoned outputs."""
from __future__ import annotations

import functools
import importlib

import numpy as np
import pytest

from tests.cuda import ranks
from tests.cuda.ranks import INTS, inputs
from tests.helpers.procs import RankError
from tests.helpers.ref import UNIT_ROUNDOFF

DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64", "bfloat16")
REDOPS = ("sum", "prod", "min", "max", "avg")
SIZES = (0, 1, 7, 1021, 65539)
TOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}
TINY = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126, "float64": 2.0 ** -1022}  # least normal


@functools.lru_cache(maxsize=None)
def bf16_missing() -> str | None:
    """Why bfloat16 cases cannot run, or None: the tests make bfloat16 device tensors and round host inputs to
    bfloat16 with torch, which the cuda extra does not install."""
    try:
        importlib.import_module("torch")
    except Exception as e:               # noqa: BLE001 - any import failure: no bfloat16 cases
        return f"bfloat16 cases need torch, which is not importable ({type(e).__name__}: {e})"
    return None


def skip_without_bf16(dtype: str) -> None:
    if dtype == "bfloat16" and bf16_missing():
        print(f"\nskipping: {bf16_missing()}")
        pytest.skip(bf16_missing())


def host_inputs(seed, world, n, dtype, op):
    xs = [inputs(seed, r, n, dtype, op) for r in range(world)]
    if dtype == "bfloat16":                       # the device holds bf16-rounded values
        import torch
        xs = [torch.from_numpy(x).to(torch.bfloat16).float().numpy() for x in xs]
    return xs


def reduce_ref(xs, dtype, op):
    if dtype in INTS:
        t = xs[0].dtype
        with np.errstate(over="ignore"):
            if op in ("sum", "avg"):
                s = np.zeros_like(xs[0])
                for x in xs:
                    s = (s + x).astype(t)
                if op == "avg":
                    s = np.trunc(s.astype(np.float64) / len(xs)).astype(t)
                return s
            if op == "prod":
                s = np.ones_like(xs[0])
                for x in xs:
                    s = (s * x).astype(t)
                return s
        return (np.fmin if op == "min" else np.fmax).reduce(xs)
    a = np.stack([x.astype(np.float64) for x in xs])
    return {"sum": a.sum(0), "prod": a.prod(0), "min": np.fmin.reduce(a, 0), "max": np.fmax.reduce(a, 0),
            "avg": a.mean(0)}[op]


def rounding_atol(xs, dtype, op):
    """Per element, what rounding in the type may add to a floating sum, avg or prod over the ranks: each partial
    result (and PreMulSum's x/n) is rounded, within (n - 1) u sum|x_i| for a sum, (n - 1) u prod|x_i| for a product
    (u the type's unit roundoff); twice that, plus n least normals (an x/n or a sum that underflows, or is flushed
    to zero). 0 for min and max (they select an input) and for integers (exact)."""
    if dtype in INTS or op not in ("sum", "avg", "prod") or not len(xs):
        return 0.0
    acc = np.full(xs[0].shape, 1.0 if op == "prod" else 0.0)
    for x in xs:
        if op == "prod":
            acc *= np.abs(x)
        else:
            acc += np.abs(x)
    return 2 * len(xs) * UNIT_ROUNDOFF[dtype] * acc + len(xs) * TINY[dtype]


def check(out, ref, dtype, what, atol=0.0, exact=False):
    """Element by element: integers and copies (exact=True: broadcast, all_gather, send/recv) bit for bit, other
    floats within TOL relative plus `atol` (rounding_atol). One wrong element fails."""
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    if out.size == 0:
        return
    if dtype in INTS or exact:
        want = ref.astype(out.dtype)
        assert np.array_equal(want.astype(np.float64), ref.astype(np.float64), equal_nan=True), \
            f"{what}: the reference is not exact in {out.dtype}"
        bad = np.flatnonzero((out.view(np.uint8).reshape(out.size, -1) != want.view(np.uint8).reshape(out.size, -1))
                             .any(axis=1))
        assert bad.size == 0, f"{what}: {bad.size} of {out.size} wrong, first at {bad[0]}: {out[bad[0]]!r} != " \
                              f"{want[bad[0]]!r}"
        return
    o = out.astype(np.float64)
    assert not np.isnan(o).any(), f"{what}: NaN in output (unwritten or poisoned elements)"
    bad = np.flatnonzero(~(np.abs(o - ref) <= atol + TOL[dtype] * np.abs(ref)))
    assert bad.size == 0, f"{what}: {bad.size} of {o.size} wrong, first at {bad[0]}: {o[bad[0]]!r} != {ref[bad[0]]!r}"


def untouched(out, dtype, what):
    """The output still holds ranks.poisoned's 0x7B bytes (bfloat16 comes back as float32: bits 0x7B7B0000)."""
    if out.size == 0:
        return
    if dtype == "bfloat16":
        bad = np.flatnonzero(out.astype(np.float32).view(np.uint32) != 0x7B7B0000)
    else:
        bad = np.flatnonzero((out.view(np.uint8).reshape(out.size, -1) != 0x7B).any(axis=1))
    assert bad.size == 0, f"{what}: {bad.size} elements written, first at {bad[0]}: {out[bad[0]]}"


def run_and_check(pool, func, dtype, op, count, root=0, seed=1, nchannels=0, wait_s=0.0):
    world = pool.world
    res = pool.results_or_errors(ranks.run_coll, func, dtype, op, count, root, seed, nchannels, False, wait_s)
    errs = [r for r in res if isinstance(r, RankError)]
    assert not errs, "\n".join(str(e) for e in errs)          # every rank's error, not only the first
    n_in = count * world if func == "reduce_scatter" else count
    xs = host_inputs(seed, world, n_in, dtype, op)
    what = f"{func} {dtype} {op} count={count}"
    full = (reduce_ref(xs, dtype, op), rounding_atol(xs, dtype, op)) if func in ("all_reduce", "reduce") else None
    for r, out in enumerate(res):
        out = out["out"]
        if func == "all_reduce":
            check(out, full[0], dtype, f"{what} rank {r}", full[1])
        elif func == "reduce" and r == root:
            check(out, full[0], dtype, f"{what} root {r}", full[1])
        elif func == "reduce":
            untouched(out, dtype, f"{what} non-root {r}")        # NCCL: recvbuff is only used on the root
        elif func == "reduce_scatter":
            mine = [x[r * count:(r + 1) * count] for x in xs]
            check(out, reduce_ref(mine, dtype, op), dtype, f"{what} rank {r}", rounding_atol(mine, dtype, op))
        elif func == "broadcast":
            check(out, xs[root], dtype, f"{what} rank {r}", exact=True)
        elif func == "all_gather":
            check(out, np.concatenate(xs), dtype, f"{what} rank {r}", exact=True)


@pytest.mark.cuda
def test_compile_all(pool2):
    want = sorted((d, s) for d in DTYPES for s in (False, True))
    assert pool2.run(ranks.prepare, DTYPES) == [want, want]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("func", ("all_reduce", "reduce_scatter", "reduce"))
def test_reducing(pool2, func, dtype):
    skip_without_bf16(dtype)
    for op in REDOPS:
        for count in SIZES:
            run_and_check(pool2, func, dtype, op, count, root=count % 2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ("float16", "float32", "float64", "bfloat16"))
def test_min_max_treat_nan_as_nccl_does(pool2, dtype):
    """NCCL's fminf/fmaxf/__hmin: a NaN loses to a number, whichever rank holds it and whichever rank reduces
    its chunk; NaN only where every rank has NaN."""
    skip_without_bf16(dtype)
    world, count = pool2.world, 65539
    xs = [ranks.with_nans(x, r, world) for r, x in enumerate(host_inputs(3, world, count * world, dtype, "min"))]
    for op, f in (("min", np.fmin), ("max", np.fmax)):
        want = f.reduce(np.stack([x.astype(np.float64) for x in xs]), 0)
        for func in ("all_reduce", "reduce_scatter"):
            n = count * world if func == "all_reduce" else count
            res = pool2.run(ranks.run_coll, func, dtype, op, n, 0, 3, 0, False, 0.0, True)
            for r, got in enumerate(res):
                ref = want if func == "all_reduce" else want[r * count:(r + 1) * count]
                o = got["out"].astype(np.float64)
                assert np.array_equal(o, ref, equal_nan=True), \
                    f"{func} {dtype} {op} rank {r}: {int(np.isnan(o).sum())} NaN, want {int(np.isnan(ref).sum())}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("func", ("all_gather", "broadcast"))
def test_copying(pool2, func, dtype):
    skip_without_bf16(dtype)
    for count in SIZES:
        run_and_check(pool2, func, dtype, "sum", count, root=(count + 1) % 2)


@pytest.mark.cuda
@pytest.mark.parametrize("func", ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"))
def test_large_prime_many_channels(pool2, func):
    for nch in (1, 5, 16):
        run_and_check(pool2, func, "float32", "sum", 1_000_003, root=1, nchannels=nch)



@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ("int8", "float16", "float32", "bfloat16", "float64"))
@pytest.mark.parametrize("pattern", ("ring", "multi", "a2a"))
def test_send_recv(pool2, pattern, dtype):
    skip_without_bf16(dtype)
    for count in (0, 1, 1021, 300_007):
        res = pool2.run(ranks.run_p2p, dtype, count, 3, pattern)
        w = pool2.world
        for r, out in enumerate(res):
            for frm, got in out["outs"]:
                ref = host_inputs(3 + r, w, count, dtype, "sum")[frm]
                check(got, ref, dtype, f"send_recv {pattern} {dtype} count={count} rank {r} from {frm}", exact=True)


@pytest.mark.cuda
@pytest.mark.parametrize("world", (3, 4))
def test_more_ranks_than_two(gpu, kcache, world):
    """Rings of 3 and 4 ranks (GPUs shared round-robin): nothing assumes 2 ranks."""
    from tests.helpers.procs import RankPool
    pool = RankPool(world, timeout=300)
    try:
        pool.run(ranks.setup, {"cache_dir": kcache, "timeout_s": 20.0, "nchannels": 4,
                               "dtypes": ("float32", "int32")})
        for func in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
            for count in (1, 1021, 200_003):
                run_and_check(pool, func, "float32", "sum", count, root=count % world, nchannels=3)
        run_and_check(pool, "all_reduce", "int32", "max", 5000)
        for pattern in ("ring", "a2a"):
            res = pool.run(ranks.run_p2p, "float32", 40_009, 5, pattern)
            for r, out in enumerate(res):
                for frm, got in out["outs"]:
                    check(got, host_inputs(5 + r, world, 40_009, "float32", "sum")[frm], "float32",
                          f"send_recv {pattern} world {world} rank {r} from {frm}", exact=True)
    finally:
        pool.close()


@pytest.mark.cuda
def test_all_reduce_1gib(pool2):
    run_and_check(pool2, "all_reduce", "float32", "sum", 1 << 28, seed=7, wait_s=120.0)
    run_and_check(pool2, "all_reduce", "float32", "avg", (1 << 28) - 5, seed=8, wait_s=120.0)
