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


def _prom(path: str) -> dict:
    """name -> {labels: value} of a Prometheus text file (what a textfile collector parses)."""
    out: dict = {}
    for line in open(path).read().splitlines():
        if line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, labels = head.split("{", 1)
        pairs = (kv.split("=", 1) for kv in labels.rstrip("}").split(","))
        out.setdefault(name, {})[tuple(sorted((k, v.strip('"')) for k, v in pairs))] = float(value)
    return out


def test_linkstats_and_trace_fan_out_agree(tmp_path):
    prefix = str(tmp_path / "t")
    tables = slicetrace.launch(_job, 3, profiler_plugin="example,linkstats", profile_dump_file=prefix,
                               buffsize=1 << 16, nchannels=2, linkstats_file=str(tmp_path / "m"),
                               join_timeout_s=120)
    ks = kernel_steps(load_traces(sorted(glob.glob(prefix + "_*.json"))))
    for rank, table in enumerate(tables):
        mine = ks[ks["rank"] == rank]
        assert sum(r["bytes"] for r in table) == int(mine["size"].sum()) > 0
        sent = {(r["channel"], r["peer"]) for r in table if r["is_send"]}
        assert sent == {(c, (rank + 1) % 3) for c in (0, 1)}
        assert all(r["transfer_us"] > 0 and r["gbps"] > 0 for r in table)
        prom = glob.glob(str(tmp_path / f"m_*_{rank}.prom"))       # the metrics file says the same
        assert len(prom) == 1
        m = _prom(prom[0])
        by = {(dict(k)["channel"], dict(k)["direction"], dict(k)["peer"]): v
              for k, v in m["slicetrace_link_bytes_total"].items()}
        assert by == {(str(r["channel"]), "send" if r["is_send"] else "recv", str(r["peer"])): r["bytes"]
                      for r in table}
        xfer = sum(m["slicetrace_link_transfer_seconds_total"].values())
        assert abs(xfer - sum(r["transfer_us"] for r in table) / 1e6) < 1e-6
        acc = {dict(k)["counter"]: v for k, v in m["slicetrace_profiler_accounting_total"].items()}
        assert acc["delivered_kernel_step"] == len(mine) and acc["overrun"] == 0    # its own, not both plugins'
