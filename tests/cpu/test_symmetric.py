"""Symmetric kernels (buffers from comm.mem_alloc(..., symmetric=True)): all_reduce, all_gather and reduce_scatter
load from and store into every rank's window instead of running the ring. Results must match numpy, the kernel must
really run (and only where its rule says), a rank that passes no window must be a mismatch on every rank, a dead
rank an error on the others, and the trace must hold one KernelStep per cell, peer and direction."""
from __future__ import annotations

import glob
import subprocess
import sys

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.trace import check_trace, kernel_chs, kernel_steps, load_traces, op_names
from slicetrace.backend.opsig import describe_sig, encode_sig
from slicetrace.plan.symmetric import SYM_MIN, plan_symmetric
from tests.cpu.test_collectives import _comm, run_case
from tests.cpu.test_registered import check_rank1_killed
from tests.helpers.procs import RankPool

POOL = 32 << 20
KW = dict(cpu_pool=POOL, timeout_s=30.0)
OPS = ["all_reduce", "all_gather", "reduce_scatter"]
PAIRS = [("float32", "sum"), ("int8", "max"), ("float16", "avg"), ("int64", "avg"), ("float64", "prod"),
         ("int32", "min")]


@pytest.fixture(scope="module", params=[2, 3, 4, 5])
def pool(request):
    p = RankPool(request.param, timeout=240)
    yield p
    p.close()


def _sym_cases(ctx, kw, cases):
    """Wrong elements and whether the symmetric kernel ran, per case."""
    comm = _comm(ctx, kw)
    be = comm._session.backend
    out = []
    for case in cases:
        before = be.sym_ops
        out.append((run_case(comm, *case, reg=(1 << comm.world_size) - 1, sym=True), be.sym_ops - before))
    return out


@pytest.mark.parametrize("op", OPS)
def test_symmetric_kernels_match_numpy(pool, op):
    n = pool.world
    cases = []
    for i, (dtype, redop) in enumerate(PAIRS):
        if op == "all_gather":
            redop = "sum"
        for count in (0, 1, 7919, 300_007):
            for inplace in (False, True):
                cases.append((op, dtype, redop, count, 0, inplace, 50 + i))
    res = pool.run(_sym_cases, dict(KW, nchannels=2), cases)
    for r in range(n):
        assert [(c, w) for c, (w, _) in zip(cases, res[r]) if w] == [], r
        for case, (_, ran) in zip(cases, res[r]):
            nbytes = case[3] * np.dtype(case[1]).itemsize * (n if op != "all_reduce" else 1)
            want = case[3] > 0 and (n > 2 or nbytes >= SYM_MIN)     # the rule (CpuBackend.symmetric)
            assert ran == int(want), (r, case, ran)


def _mixed(ctx, kw):
    """Windows on rank 0 only: every rank must hear that the ranks disagree."""
    comm = _comm(ctx, kw)
    n, r = comm.world_size, comm.rank
    x = comm.mem_alloc(1 << 16, np.float32, symmetric=(r == 0))
    x[:] = 1
    try:
        comm.all_reduce(x, x)
    except Exception as e:          # noqa: BLE001 - shipped back to the test
        return f"{type(e).__name__}: {e}"
    return f"no error ({n} ranks)"


def test_windows_on_one_rank_only_are_a_mismatch_on_every_rank(pool):
    res = pool.run(_mixed, dict(KW, timeout_s=19.5))     # a comm of its own: this one ends aborted
    for r, got in enumerate(res):
        assert got.startswith("MismatchError"), (r, got)
        assert "symmetric kernel: buffers in windows, mem_alloc(symmetric=True)" in got, (r, got)


def _api_errors(ctx, kw):
    from slicetrace.errors import UsageError
    comm = _comm(ctx, kw)
    got = []
    try:
        comm.mem_alloc(4, np.float32, symmetric="yes")
        got.append("no error")
    except UsageError as e:
        got.append(str(e))
    be = comm._session.backend
    w = comm.mem_alloc(1 << 15, np.float32, symmetric=True)
    plain = comm.mem_alloc(1 << 15, np.float32)
    got.append((be.pool.window(w, 4) >= 0, be.pool.window(w[8:100], 4) >= 0, be.pool.window(plain, 4),
                be.pool.window(np.zeros(4, np.float32), 4)))
    comm.mem_free(w)
    again = comm.mem_alloc(1 << 15, np.float32)      # the window's block, now an ordinary buffer
    got.append(be.pool.window(again, 4))
    comm.mem_free(again)
    comm.mem_free(plain)
    return got


def test_windows_are_tracked_and_symmetric_must_be_a_bool(pool):
    for got in pool.run(_api_errors, KW):
        assert got[0] == "mem_alloc: symmetric='yes'; pass True or False"
        assert got[1] == (True, True, -1, -1)
        assert got[2] == -1


def test_plan_splits_each_rank_part_into_cells():
    n, count = 3, 1_000_003
    ar = [plan_symmetric("all_reduce", n, r, count, 4, 2, 1 << 19) for r in range(n)]
    covered = sorted((p.params["src"], p.params["n"]) for pl in ar for p in pl.programs)
    lo = 0
    for src, m in covered:              # the ranks' parts tile the buffer, once each
        assert src == lo
        lo += m
    assert lo == count
    for pl in ar:
        assert pl.algo == "AllReduce_RSxLD_AGxST"
        for p in pl.programs:
            assert sum(k for _, k in p.params["cells"]) == p.params["n"]
            assert all(k <= (1 << 20) // 4 for _, k in p.params["cells"])
    rs = plan_symmetric("reduce_scatter", n, 2, 1000, 4, 1, 1 << 19).programs[0].params
    ag = plan_symmetric("all_gather", n, 2, 1000, 4, 1, 1 << 19).programs[0].params
    assert (rs["src"], rs["dst"], rs["load"], rs["store"]) == (2000, 0, True, False)
    assert (ag["src"], ag["dst"], ag["load"], ag["store"]) == (0, 2000, False, True)
    with pytest.raises(ValueError, match="symmetric kernels exist for"):
        plan_symmetric("broadcast", n, 0, 10, 4, 1, 1 << 19)


def test_signature_names_the_symmetric_kernel():
    ring = encode_sig("all_reduce", 10, "float32", "sum", 0, 1, 1 << 19)
    sym = encode_sig("all_reduce", 10, "float32", "sum", 0, 1, 1 << 19, True)
    assert ring != sym
    assert "symmetric kernel" in describe_sig(*sym) and "symmetric" not in describe_sig(*ring)
    assert describe_sig(*sym).startswith("all_reduce(count=10, dtype=float32, op=sum)")


COUNT = 300_007


def _traced(comm, count):
    n, r = comm.world_size, comm.rank
    x = comm.mem_alloc(count, np.float32, symmetric=True)
    x[:] = r + 1
    comm.all_reduce(x, x)
    ag = comm.mem_alloc(count * n, np.float32, symmetric=True)
    comm.all_gather(x, ag)
    rs = comm.mem_alloc(count, np.float32, symmetric=True)
    comm.reduce_scatter(ag, rs)
    comm.flush_profiler()
    ok = bool((x == n * (n + 1) / 2).all() and (rs == n * n * (n + 1) / 2).all())
    return comm.drop_counters(), ok, comm._session.backend.sym_ops


@pytest.mark.parametrize("world", [2, 4])
def test_trace_has_a_step_per_cell_peer_and_direction(tmp_path, world):
    prefix = str(tmp_path / "sym")
    res = slicetrace.launch(_traced, world, COUNT, profile_dump_file=prefix, profiler_plugin="example",
                            join_timeout_s=120, **KW)
    assert [(ok, ops) for _, ok, ops in res] == [(True, 3)] * world
    for c, _, _ in res:
        lost = {k: v for k, v in c.items() if not k.startswith(("delivered", "unrecorded_")) and v}
        assert lost == {}, lost
    files = sorted(glob.glob(prefix + "_*.json"))
    assert len(files) == world
    for f in files:
        assert check_trace(f) == [], f
    recs = load_traces(files)
    ks, chs, names = kernel_steps(recs), kernel_chs(recs), op_names(recs)
    colls = [r for r in recs if r.get("ph") == "b" and r.get("cat") == "COLL"]
    assert len(colls) == 3 * world
    algos = {"AllReduce": "RSxLD_AGxST", "AllGather": "ST", "ReduceScatter": "LD"}
    for c in colls:                 # NCCL's rule: algo is the kernel's name past the function, no protocol
        assert (c["args"]["Algorithm"], c["args"]["Protocol"]) == (algos[c["name"]], ""), c
    nb = COUNT * 4
    per: dict = {}                          # (op name, is_send) -> bytes, all ranks
    for s in ks:
        key = (names[(int(s["rank"]), int(s["op"]))], bool(s["is_send"]))
        per[key] = per.get(key, 0) + int(s["size"])
        assert int(s["peer"]) != int(s["rank"])
    # all_reduce: each rank loads and stores its part from / to n-1 peers (the parts tile the buffer); all_gather
    # stores and reduce_scatter loads each rank's whole count
    for name, sent, recv in (("AllReduce", 1, 1), ("AllGather", 1, 0), ("ReduceScatter", 0, 1)):
        whole = nb if name == "AllReduce" else nb * world
        assert (per.get((name, True), 0), per.get((name, False), 0)) == (
            sent * (world - 1) * whole, recv * (world - 1) * whole), name
    assert len(chs) == 3 * world


def _die(comm, folder):
    import os
    import signal
    import threading
    with open(os.path.join(folder, f"job{comm.rank}"), "w") as f:
        f.write(comm._session.job)
    x = comm.mem_alloc(1 << 20, np.float32, symmetric=True)
    x[:] = 1
    if comm.rank == 1:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    for _ in range(5000):
        comm.all_reduce(x, x)
    return "finished"


def test_a_rank_killed_during_symmetric_kernels_fails_the_others_and_leaves_nothing(tmp_path):
    with pytest.raises(slicetrace.LaunchError) as e:
        slicetrace.launch(_die, 3, str(tmp_path), timeout_s=6.0, join_timeout_s=120, cpu_pool=16 << 20)
    check_rank1_killed(e.value, tmp_path)


def test_bench_R2_runs_symmetric_windows_and_checks():
    r = subprocess.run([sys.executable, "-m", "slicetrace", "bench", "--ranks", "3", "-b", "64K", "-e", "1M", "-f",
                        "4", "-n", "3", "-w", "1", "-R", "2", "--op", "all_reduce,all_gather,reduce_scatter"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "symmetric windows (-R 2)" in r.stdout
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(rows) == 9 and all(row[-1] == "0" for row in rows), r.stdout
