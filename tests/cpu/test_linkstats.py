"""Two plugins at once on a real run: the trace plugin and the link-statistics plugin agree on every byte."""
import glob

import numpy as np

import slicetrace
from slicetrace.analyze.trace import kernel_steps, load_traces


def _job(comm):
    x = np.ones(300_001, dtype=np.float32)
    for _ in range(3):
        comm.all_reduce(x, x)
    comm.flush_profiler()
    lp = [s.lp for s in comm._session.host._slots if s.lp.name == "linkstats"][0]
    return lp.plugin.snapshot(lp.ctx)


def test_linkstats_and_trace_fan_out_agree(tmp_path):
    prefix = str(tmp_path / "t")
    tables = slicetrace.launch(_job, 3, profiler_plugin="example,linkstats", profile_dump_file=prefix,
                               buffsize=1 << 16, nchannels=2)
    ks = kernel_steps(load_traces(sorted(glob.glob(prefix + "_*.json"))))
    for rank, table in enumerate(tables):
        mine = ks[ks["rank"] == rank]
        assert sum(r["bytes"] for r in table) == int(mine["size"].sum()) > 0
        sent = {(r["channel"], r["peer"]) for r in table if r["is_send"]}
        assert sent == {(c, (rank + 1) % 3) for c in (0, 1)}
        assert all(r["transfer_us"] > 0 and r["gbps"] > 0 for r in table)
