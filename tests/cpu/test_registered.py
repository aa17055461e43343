"""Registered memory (Comm.mem_alloc, SLICETRACE_CPU_POOL): ring collectives on such buffers move slices
directly (the receiver reads the sender's input, the sender writes the receiver's output) and must give the same
results as through the FIFO, whichever ranks registered; the pool's allocator and its errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from slicetrace.config import Settings
from slicetrace.errors import ConfigError
from tests.cpu.test_collectives import _comm, run_case
from tests.helpers.procs import RankPool

POOL = 32 << 20
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]
# the default FIFO (4 MiB: 1 MiB slices, direct from 16 KiB), and a 64 KiB FIFO with every slice direct
CONFIGS = [(dict(cpu_pool=POOL, timeout_s=30.0), None),
           (dict(cpu_pool=POOL, buffsize=1 << 16, nchannels=2, timeout_s=30.0), 1)]


@pytest.fixture(scope="module", params=[2, 3, 4])
def pool(request):
    p = RankPool(request.param, timeout=240)
    yield p
    p.close()


def _cases(ctx, kw, dmin, cases):
    """Each case with its direct slices sent by this rank; wrong elements first."""
    from slicetrace.backend.cpu import worker
    worker.DIRECT_MIN = dmin or 16 << 10
    comm = _comm(ctx, kw)
    be = comm._session.backend
    out = []
    for case in cases:
        before = be.direct_slices()
        out.append((run_case(comm, *case), be.direct_slices() - before))
    return out


def _masks(world):
    every, alternate, first = (1 << world) - 1, sum(1 << r for r in range(0, world, 2)), 1
    return [every, alternate, first, 0]


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("op", OPS)
def test_direct_slices_match_numpy(pool, op, cfg):
    kw, dmin = CONFIGS[cfg]
    n = pool.world
    cases = []
    for i, (dtype, redop) in enumerate([("float32", "sum"), ("int8", "max"), ("float16", "avg"), ("int64", "avg"),
                                        ("float64", "prod")]):
        if op not in ("all_reduce", "reduce", "reduce_scatter") and redop != "sum":
            redop = "sum"
        for count in (0, 1, 7919, 300_007):
            for reg in _masks(n):
                cases.append((op, dtype, redop, count, (i + count) % n, (i + reg) % 2 == 0, 30 + i, reg))
    res = pool.run(_cases, kw, dmin, cases)
    for r in range(n):
        assert [(c, w) for c, (w, _) in zip(cases, res[r]) if w] == [], r
    every = (1 << n) - 1
    for k, case in enumerate(cases):
        got = [res[r][k][1] for r in range(n)]
        if case[-1] == 0 or case[3] == 0 or (dmin is None and case[3] == 1):
            assert got == [0] * n, case          # nothing registered, no slices, or under 16 KiB (the default)
        elif case[-1] == every and case[3] == 300_007:
            assert [g > 0 for g in got] == _direct_senders(op, n, case[4], case[1], case[2]), (case, got)


def _direct_senders(op, n, root, dtype, redop):
    """Which ranks send some slice directly when every rank registered: writes into the next rank's output
    (all_reduce's and all_gather's forwarding, broadcast's chain) and reads of a `send` slice from the input
    (reduce_scatter, reduce's first hop; not with avg on floats, whose input is scaled on the way)."""
    scaled = redop == "avg" and dtype.startswith("float")
    if op in ("all_reduce", "all_gather"):
        return [True] * n
    if op == "broadcast":
        return [(r + 1) % n != root for r in range(n)]
    if op == "reduce_scatter":
        return [not scaled] * n
    return [r == (root + 1) % n and not scaled for r in range(n)]


def _pool_errors(ctx, kw):
    from slicetrace.errors import UsageError
    comm = _comm(ctx, kw)
    got = []
    a = comm.mem_alloc((3, 5), np.int16)
    b = comm.mem_alloc(10, "float64")
    got.append((a.shape, str(a.dtype), b.shape, a.ctypes.data % 4096, b.ctypes.data - a.ctypes.data))
    for call in (lambda: comm.mem_alloc(POOL, np.float64), lambda: comm.mem_free(np.zeros(3)),
                 lambda: comm.mem_alloc(-1, np.float32), lambda: comm.mem_alloc(4, "no-such-type")):
        try:
            call()
            got.append("no error")
        except UsageError as e:
            got.append(str(e))
    comm.mem_free(a)
    try:
        comm.mem_free(a)
        got.append("no error")
    except UsageError as e:
        got.append(str(e))
    c = comm.mem_alloc(100, np.int8)          # the freed first block comes back
    got.append(c.ctypes.data == a.ctypes.data)
    comm.mem_free(b)
    comm.mem_free(c)
    d = comm.mem_alloc(POOL // 8, np.float64)   # all of it, once the blocks merged again
    comm.mem_free(d)
    return got


def test_pool_allocates_frees_and_names_what_is_wrong(pool):
    res = pool.run(_pool_errors, dict(cpu_pool=POOL, timeout_s=30.0))
    for got in res:
        assert got[0] == ((3, 5), "int16", (10,), 0, 4096)
        assert "do not fit in the registered pool of 33554432 bytes" in got[1] and "SLICETRACE_CPU_POOL" in got[1]
        assert "is not an array returned by this communicator's mem_alloc" in got[2]
        assert "shape=-1 has a negative dimension" in got[3]
        assert "mem_alloc: shape=4, dtype='no-such-type'" in got[4]
        assert "freed already" in got[5]
        assert got[6] is True


def _no_pool(ctx, kw):
    from slicetrace.errors import UsageError
    comm = _comm(ctx, kw)
    try:
        comm.mem_alloc(4, np.float32)
    except UsageError as e:
        return str(e)
    return "no error"


def test_mem_alloc_without_a_pool_says_which_setting(pool):
    res = pool.run(_no_pool, dict(timeout_s=30.0))
    assert all("cpu_pool=0; set SLICETRACE_CPU_POOL" in r for r in res)


def test_cpu_pool_setting():
    assert Settings.from_env({"SLICETRACE_CPU_POOL": "256M"}).cpu_pool == 256 << 20
    with pytest.raises(ConfigError, match=r"cpu_pool=-1 must be in 0\.\.68719476736 bytes"):
        Settings(cpu_pool=-1)


def test_bench_R1_runs_registered_and_checks():
    r = subprocess.run([sys.executable, "-m", "slicetrace", "bench", "-b", "1M", "-e", "4M", "-f", "4", "-n", "3",
                        "-w", "1", "--inplace", "-R", "1", "--op", "all_reduce,all_gather"], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "registered buffers (-R 1)" in r.stdout
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(rows) == 4 and all(row[-1] == "0" for row in rows), r.stdout


def _die_registered(comm, folder, op):
    import os
    import signal
    import threading
    with open(os.path.join(folder, f"job{comm.rank}"), "w") as f:
        f.write(comm._session.job)
    n = comm.world_size
    x = comm.mem_alloc(1 << 20, np.float32)
    out = comm.mem_alloc(n << 20, np.float32) if op == "all_gather" else x
    x[:] = 1
    if comm.rank == 1:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    for _ in range(5000):
        comm.all_gather(x, out) if op == "all_gather" else comm.all_reduce(x, out)
    return "finished"


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
def test_a_rank_killed_during_direct_slices_fails_the_others_and_leaves_nothing(tmp_path, op):
    import slicetrace
    with pytest.raises(slicetrace.LaunchError) as e:
        slicetrace.launch(_die_registered, 3, str(tmp_path), op, timeout_s=6.0, join_timeout_s=120,
                          cpu_pool=16 << 20)
    check_rank1_killed(e.value, tmp_path)


def check_rank1_killed(err, folder) -> None:
    """Of 3 ranks, rank 1 was SIGKILLed: the launch says so, ranks 0 and 2 raised PeerError naming it, and the job's
    segments (its name in folder/job0) are gone from /dev/shm."""
    import glob
    import re
    assert str(err).startswith("rank 1 died with exit code -9 (SIGKILL"), str(err)
    for r in (0, 2):
        last = err.errors[r].strip().splitlines()[-1]
        assert re.match(r"slicetrace\.errors\.PeerError: rank 1 \(pid \d+\) (exited|died)", last), (r, last)
    jobs = {(folder / f"job{r}").read_text() for r in (0, 2)}
    assert glob.glob(f"/dev/shm/st_{jobs.pop()}*") == []


def _late_peer(comm):
    import time
    x, out = comm.mem_alloc(1 << 18, np.float32), comm.mem_alloc(2 << 18, np.float32)
    if comm.rank == 1:
        time.sleep(3)               # past rank 0's timeout: rank 0 waits for where to write rank 1's output
        return "late"
    try:
        comm.all_gather(x, out)
    except Exception as e:          # noqa: BLE001 - shipped back to the test
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_a_peer_that_never_posts_its_output_is_a_timeout_naming_the_wait():
    import slicetrace
    got = slicetrace.launch(_late_peer, 2, cpu_pool=4 << 20, timeout_s=1.0, join_timeout_s=60)
    assert got[1] == "late"
    assert got[0].startswith("CommTimeoutError: rank 0 waited 1.0s (timeout_s) for the output address from rank 1 on "
                             "channel 0 (step 0); rank(s) 1 had not started AllGather #0"), got[0]
