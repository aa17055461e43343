"""The per-op fast paths (api's inline op/root checks, the cpu backend's cached signatures and in-place test, the
host buffers' dtype cache, the FIFO reclaim's kept views) against the checks they stand for: op and root given as
numpy values or enums, and a randomized sequence of collectives on one pool of ranks compared with numpy."""
from __future__ import annotations

import enum
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import slicetrace
from slicetrace.rendezvous import DictStore
from tests.cpu.test_collectives import _comm
from tests.helpers.procs import RankPool
from tests.helpers.ref import BF16_DTYPES, DTYPES, REDOPS, avg_atol, data, expected, mismatches, npdtype


class Op(str, enum.Enum):       # a user's enum of the reductions (str mixin: it compares equal to its value)
    SUM = "sum"
    MAX = "max"


def _two_threads(body) -> dict:
    """body(comm) on ranks 0 and 1 of a cpu communicator, as threads of this process; each rank's result or error."""
    shared: dict = {}
    out: dict = {}

    def rank(r: int) -> None:
        try:
            with slicetrace.init(backend="cpu", rank=r, world_size=2, store=DictStore(shared), job="perop",
                                 timeout_s=10.0, cpu_bind="off") as c:
                out[r] = body(c)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out[r] = f"{type(e).__name__}: {e}"
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    return out


def _enum_ops(c) -> list:
    x = np.arange(6, dtype=np.float32) * (c.rank + 1)
    return [c.all_reduce(x, op=Op.SUM).tolist(), c.reduce_scatter(x, op=Op.MAX).tolist(),
            c.all_reduce(x, op=np.str_("min")).tolist()]


def test_an_op_given_as_a_str_enum_member_runs_as_its_value():
    # it passed the check (it is a str equal to 'sum'), then str() made it 'Op.SUM': a raw ValueError from the
    # signature's REDOPS.index on every rank of two or more
    out = _two_threads(_enum_ops)
    want = [[0.0, 3.0, 6.0, 9.0, 12.0, 15.0]]
    assert out == {0: want + [[0.0, 2.0, 4.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]],
                   1: want + [[6.0, 8.0, 10.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]}, out


# ---- a randomized sequence of collectives on one 3-rank pool, every form of each argument, against numpy ----

class RedOp(str, enum.Enum):
    SUM, PROD, MIN, MAX, AVG = "sum", "prod", "min", "max", "avg"


class Sub(np.ndarray):          # an array subclass: as_buffer takes a plain view of it
    pass


SEQ = dict(buffsize=1 << 16, nchannels=2, timeout_s=30.0, cpu_reclaim="on")    # 8 KiB slots, reclaimed lines
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")


def _place(arena: np.ndarray, at: int, a: np.ndarray) -> np.ndarray:
    """a copied into the reused arena at byte `at` (a multiple of 8): the same addresses recur across ops."""
    v = arena[at:at + a.nbytes].view(a.dtype)
    v[...] = a
    return v


def _seq_case(comm, arena, op, dtype, redop, count, root, mode, op_form, root_form, layout, seed):
    n, r = comm.world_size, comm.rank
    dt = npdtype(dtype)
    cin = count * n if op == "reduce_scatter" else count
    cout = count * n if op == "all_gather" else count
    xs = [data(seed, k, cin, dtype, redop) for k in range(n)]
    x = _place(arena, 0, xs[r])
    out = _place(arena, (x.nbytes + 64) // 8 * 8, np.full(cout, 55, dt)) if mode == "out" else None
    if mode == "inplace":
        if op == "all_gather":
            out = _place(arena, 0, np.full(cout, 55, dt))
            out[r * count:(r + 1) * count] = xs[r]
            x = out[r * count:(r + 1) * count]
        elif op == "reduce_scatter":
            out = x[r * count:(r + 1) * count]
        else:
            out = x
    if layout == "sub":
        x, out = x.view(Sub), None if out is None else out.view(Sub)
    elif layout == "2d" and mode != "inplace" and cin and cout and not (cin % 2 or cout % 2):
        x, out = x.reshape(2, -1), None if out is None else out.reshape(2, -1)
    before = None if out is None else out.copy()
    kw = {}
    if op in ("all_reduce", "reduce", "reduce_scatter"):
        kw["op"] = {"str": redop, "np": np.str_(redop), "enum": RedOp(redop)}[op_form]
    if op in ("broadcast", "reduce"):
        kw["root"] = {"int": root, "np64": np.int64(root), "npu8": np.uint8(root)}[root_form]
    got = getattr(comm, op)(x, out, **kw)
    want = expected(op, xs, r, root, redop, dt)
    if out is not None:
        if got is not out:
            return "not out"
        return mismatches(out.reshape(-1), want, dt, before.reshape(-1), avg_atol(xs, redop, dt))
    if want is None:
        return 0 if got is None else "non-root reduce returned an array"
    return mismatches(np.asarray(got).reshape(-1), want, dt, atol=avg_atol(xs, redop, dt))


def _run_seq(ctx, kw, cases):
    comm = _comm(ctx, kw)
    arena = ctx["state"].setdefault("arena", np.zeros(4 << 20, np.uint8))
    return [(case, w) for case in cases if (w := _seq_case(comm, arena, *case))]


@pytest.fixture(scope="module")
def pool3():
    p = RankPool(3, timeout=120)
    yield p
    p.close()


_case = st.tuples(
    st.sampled_from(OPS), st.sampled_from(DTYPES + BF16_DTYPES), st.sampled_from(REDOPS),
    st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(4, 3000), st.integers(3000, 30_000)),
    st.integers(0, 2), st.sampled_from(["out", "inplace", "alloc"]), st.sampled_from(["str", "np", "enum"]),
    st.sampled_from(["int", "np64", "npu8"]), st.sampled_from(["flat", "sub", "2d"]), st.integers(0, 99))


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases=st.lists(_case, min_size=4, max_size=8))
def test_a_random_sequence_of_collectives_matches_numpy(pool3, cases):
    """Ops, dtypes, reductions, roots and counts in a random order on one communicator, buffers at recurring
    addresses: a cached signature, dtype or reclaim view that went stale shows as a wrong result or an error."""
    assert pool3.run(_run_seq, SEQ, cases) == [[]] * 3
