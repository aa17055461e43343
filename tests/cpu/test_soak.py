"""Soak (deselected by default; run with `pytest -m soak`): a long profiled run keeps every stamp, stays
inside bounded memory and leaves a valid trace."""
import glob
import resource
import time

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.trace import check_trace

pytestmark = pytest.mark.soak
SECONDS = 30.0


def _loop(comm, seconds):
    rng = np.random.default_rng(comm.rank)
    sizes = [1, 1000, 65_536, 1 << 20]
    bufs = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    t0, ops = time.monotonic(), 0
    rss0 = None
    while True:
        # stop together: every rank must run the same ops, so the decision is itself a collective
        if comm.all_reduce(np.array([time.monotonic() - t0 > seconds], dtype=np.int32), op="max")[0]:
            break
        for b in bufs:
            comm.all_reduce(b)
            with comm.group():
                comm.send(b, (comm.rank + 1) % comm.world_size)
                comm.recv(np.empty_like(b), (comm.rank - 1) % comm.world_size)
            ops += 2
        if rss0 is None and time.monotonic() - t0 > seconds / 4:
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    comm.flush_profiler()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ops, comm.drop_counters(), rss0, rss1


def test_long_profiled_run_loses_nothing_and_stays_bounded(tmp_path):
    prefix = str(tmp_path / "soak")
    res = slicetrace.launch(_loop, 2, SECONDS, profiler_plugin="example", profile_dump_file=prefix)
    for ops, counters, rss0, rss1 in res:
        lost = {k: v for k, v in counters.items()
                if v and not k.startswith(("delivered", "plugin_written", "clock_"))}
        assert ops > 1000 and lost == {}, (ops, lost)
        assert rss1 - rss0 < 200 * 1024, (rss0, rss1)            # KiB: memory does not grow with the run
    files = sorted(glob.glob(prefix + "_*.json"))
    assert len(files) == 2, files                                # one trace per rank
    for f in files:
        assert check_trace(f) == []
