"""Soak (deselected by default; run with `pytest -m soak`): a long profiled run keeps every result exact, loses
no stamp (every op's events delivered, counted exactly) and leaves a valid trace. Speed and memory belong to the
benchmarks, not here."""
import glob
import time

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.trace import check_trace, kernel_steps, load_trace

pytestmark = pytest.mark.soak
SECONDS = 30.0
SIZES = [1, 1000, 65_536, 1 << 20]


def _input(rank: int, size: int) -> np.ndarray:
    # small integers: float32 sums are exact in any order, so every rank knows the exact all_reduce result
    return np.random.default_rng([rank, size]).integers(-8, 9, size).astype(np.float32)


def _loop(comm, seconds):
    n, r = comm.world_size, comm.rank
    bufs = [_input(r, s) for s in SIZES]
    sums = [sum(_input(q, s) for q in range(n)) for s in SIZES]
    prev = [_input((r - 1) % n, s) for s in SIZES]
    t0, iters, wrong = time.monotonic(), 0, 0
    while True:
        # stop together: every rank must run the same ops, so the decision is itself a collective
        if comm.all_reduce(np.array([time.monotonic() - t0 > seconds], dtype=np.int32), op="max")[0]:
            break
        for b, want_sum, want_prev in zip(bufs, sums, prev):
            out = comm.all_reduce(b)
            got = np.full_like(b, np.nan)
            with comm.group():
                comm.send(b, (r + 1) % n)
                comm.recv(got, (r - 1) % n)
            wrong += int((out != want_sum).sum()) + int((got != want_prev).sum())
        iters += 1
    comm.flush_profiler()
    return iters, wrong, comm.drop_counters()


def test_long_profiled_run_keeps_every_result_and_every_stamp(tmp_path):
    prefix = str(tmp_path / "soak")
    res = slicetrace.launch(_loop, 2, SECONDS, profiler_plugin="example", profile_dump_file=prefix,
                            join_timeout_s=SECONDS + 300)
    files = sorted(glob.glob(prefix + "_*.json"))
    assert len(files) == 2, files                                # one trace per rank
    assert res[0][0] == res[1][0] > 0                            # both ranks ran the same ops
    for rank, (f, (iters, wrong, counters)) in enumerate(zip(files, res)):
        assert wrong == 0, (rank, wrong)
        lost = {k: v for k, v in counters.items()
                if v and not k.startswith(("delivered", "unrecorded_", "plugin_written", "clock_"))}
        assert lost == {}, lost
        # every op profiled and delivered: len(SIZES) all_reduces and groups per iteration, the stop checks
        assert counters["delivered_coll"] == len(SIZES) * iters + iters + 1, counters
        assert counters["delivered_p2p"] == 2 * len(SIZES) * iters, counters       # one send, one recv
        assert check_trace(f) == []
        assert len(kernel_steps(load_trace(f))) == counters["delivered_kernel_step"] > 0
