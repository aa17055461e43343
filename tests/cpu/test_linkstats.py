"""Two plugins at once on a real run: the trace plugin and the link-statistics plugin agree on every byte and every
nanosecond; the .prom files a scraper reads mid-run, at close and after a rank is killed are whole and valid."""
import glob
import os
import signal
import threading
import time

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.trace import kernel_steps, load_traces
from slicetrace.errors import LaunchError
from slicetrace.events.abi import moving_from
from tests.helpers.prom import parse, series

_LINK = ("channel", "direction", "peer")


def _job(comm):
    x = np.ones(300_001, dtype=np.float32)
    for _ in range(3):
        comm.all_reduce(x, x)
    comm.broadcast(x, root=1)
    comm.flush_profiler()
    lp = [s.lp for s in comm._session.host._slots if s.lp.name == "linkstats"][0]
    return lp.plugin.snapshot(lp.ctx)


@pytest.mark.parametrize("sample_rate", [1, 3])
def test_linkstats_and_trace_fan_out_agree(tmp_path, sample_rate):
    """Bytes, wait (ready - wait) and transfer (done - ready, a fused slice from its later ready) of every link equal
    the sums over the same run's Chrome trace, also with 1 slice in k kept (both see the same kept slices)."""
    prefix = str(tmp_path / "t")
    tables = slicetrace.launch(_job, 3, profiler_plugin="example,linkstats", profile_dump_file=prefix,
                               buffsize=1 << 16, nchannels=2, linkstats_file=str(tmp_path / "m"),
                               sample_rate=sample_rate, join_timeout_s=120)
    ks = kernel_steps(load_traces(sorted(glob.glob(prefix + "_*.json"))))
    for rank, table in enumerate(tables):
        mine = ks[ks["rank"] == rank]
        assert sum(r["bytes"] for r in table) == int(mine["size"].sum()) > 0
        sent = {(r["channel"], r["peer"]) for r in table if r["is_send"]}
        assert sent == {(c, (rank + 1) % 3) for c in (0, 1)}
        assert all(r["transfer_us"] > 0 and r["gbps"] > 0 for r in table)
        prom = glob.glob(str(tmp_path / f"m_*_{rank}.prom"))       # the metrics file says the same
        assert len(prom) == 1
        m = parse(open(prom[0], encoding="utf-8").read())
        moved = mine["done_ns"] - moving_from(mine, mine["op"], mine["channel"])
        want: dict = {}
        for i in range(len(mine)):
            key = (str(mine["channel"][i]), "send" if mine["is_send"][i] else "recv", str(mine["peer"][i]))
            w = want.setdefault(key, [0, 0, 0, 0])
            w[0] += 1
            w[1] += int(mine["size"][i])
            w[2] += int(mine["ready_ns"][i] - mine["wait_ns"][i])
            w[3] += int(moved[i])
        got = {k: [int(series(m, "slicetrace_link_slices_total", *_LINK)[k]),
                   int(series(m, "slicetrace_link_bytes_total", *_LINK)[k]),
                   round(series(m, "slicetrace_link_wait_seconds_total", *_LINK)[k] * 1e9),
                   round(series(m, "slicetrace_link_transfer_seconds_total", *_LINK)[k] * 1e9)]
               for k in series(m, "slicetrace_link_bytes_total", *_LINK)}
        assert got == want
        acc = series(m, "slicetrace_profiler_accounting_total", "counter")
        assert acc[("delivered_kernel_step",)] == len(mine) and acc[("overrun",)] == 0   # its own, not both plugins'
        assert (acc[("sampled_out",)] > 0) == (sample_rate > 1)      # what sampling left out is counted
        assert series(m, "slicetrace_sampling", "setting")[("kernel_step_sample_rate",)] == sample_rate


def _two_comms(comm, folder):
    kw = dict(backend="cpu", rank=comm.rank, world_size=2, store=comm._session.store, profiler_plugin="linkstats",
              linkstats_file=os.path.join(folder, "m"), linkstats_interval_s=1e-6, timeout_s=30)
    a = slicetrace.init(job=f"{comm._session.job}-a", name="dp", **kw)
    b = slicetrace.init(job=f"{comm._session.job}-b", name="tp", **kw)
    x = np.ones(50_000, np.float32)
    for _ in range(60):
        a.all_reduce(x, x)
        b.all_reduce(x, x)
        b.all_reduce(x, x)
    a.close()
    b.close()
    return a.comm_hash, b.comm_hash


def test_a_scraper_reading_while_two_communicators_rewrite_sees_whole_files_and_counters_that_never_drop(tmp_path):
    """Rewrites as often as KernelSteps arrive (interval 1 us), two communicators per process: every read of every
    file parses strictly, no counter of a series ever goes down between two reads, and each communicator has its
    own file with its own totals."""
    stop, seen, errors, reads = threading.Event(), {}, [], [0]

    def scrape():
        for f in glob.glob(str(tmp_path / "*.prom")):
            try:
                fams = parse(open(f, encoding="utf-8").read())
            except AssertionError as e:
                errors.append(f"{f}: {e}")
                continue
            reads[0] += 1
            for name, fam in fams.items():
                for labels, v in fam["samples"].items():
                    if fam["type"] == "counter" and v < seen.get((f, name, labels), 0):
                        errors.append(f"{f}: {name}{dict(labels)} went from {seen[f, name, labels]} to {v}")
                    seen[f, name, labels] = v

    def scraper():
        while not stop.is_set():
            scrape()
    t = threading.Thread(target=scraper, daemon=True)
    t.start()
    try:
        hashes = slicetrace.launch(_two_comms, 2, str(tmp_path), join_timeout_s=120)
    finally:
        stop.set()
        t.join(30)
    scrape()
    assert errors == [] and reads[0] >= 4
    assert sorted(os.listdir(tmp_path)) == sorted(f"m_{h}_{r}.prom" for h in hashes[0] for r in (0, 1))
    for (h, name, ops) in ((hashes[0][0], "dp", 60), (hashes[0][1], "tp", 120)):
        m = parse((tmp_path / f"m_{h}_0.prom").read_text(encoding="utf-8"))
        by = series(m, "slicetrace_link_bytes_total", "comm", "comm_name", "direction")
        assert by == {(str(h), name, d): ops * 200_000 for d in ("send", "recv")}


def _killed(comm):
    x = np.ones(50_000, np.float32)
    for i in range(100):
        comm.all_reduce(x, x)
        if i == 60 and comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    return 0


def test_a_killed_rank_leaves_its_last_whole_file_and_the_survivor_closes_its_own(tmp_path):
    with pytest.raises(LaunchError, match="rank 1 died"):
        slicetrace.launch(_killed, 2, profiler_plugin="linkstats", linkstats_file=str(tmp_path / "m"),
                          linkstats_interval_s=1e-3, timeout_s=10, join_timeout_s=120)
    (dead,) = glob.glob(str(tmp_path / "m_*_1.prom"))
    (alive,) = glob.glob(str(tmp_path / "m_*_0.prom"))
    d, a = parse(open(dead).read()), parse(open(alive).read())
    assert sum(series(d, "slicetrace_link_slices_total", "direction").values()) > 0    # a periodic write, valid
    # it never closed, yet its periodic writes carried the host's counters of their time (live_counters)
    assert series(d, "slicetrace_profiler_accounting_total", "counter")[("delivered_kernel_step",)] > 0
    assert "slicetrace_profiler_accounting_total" in a              # the survivor's close wrote its counters


def _late_rank_1(comm):
    x = np.ones(100_000, np.float32)
    for _ in range(8):
        if comm.rank == 1:
            time.sleep(0.03)                # comes to every op late: the others wait for it
        comm.all_reduce(x, x)
    return 0


def test_the_late_rank_is_the_one_that_waits_least_as_one_query_over_the_files_finds_it(tmp_path):
    """What `bottomk(1, sum by (comm, rank) (rate(slicetrace_link_wait_seconds_total[5m])))` computes, over the
    files of a run whose rank 1 comes to each op 30 ms late: rank 1 (its peers' data is there when it comes). The
    waits on it are not only its receiver's: in a ring everyone downstream waits too."""
    slicetrace.launch(_late_rank_1, 3, profiler_plugin="linkstats", linkstats_file=str(tmp_path / "m"),
                      nchannels=2, join_timeout_s=120)
    wait: dict = {}
    for f in glob.glob(str(tmp_path / "*.prom")):
        for (comm, rank), v in series(parse(open(f).read()), "slicetrace_link_wait_seconds_total", "comm",
                                      "rank").items():
            wait[comm, rank] = wait.get((comm, rank), 0) + v
    assert len(wait) == 3 and min(wait, key=wait.get)[1] == "1"


def _kernel_step_masked(comm):
    x = np.ones(100_000, np.float32)
    comm.all_reduce(x, x)
    with comm.profiling(True, mask="Coll|KernelCh"):       # KernelStep left out of these three
        for _ in range(3):
            comm.all_reduce(x, x)
    comm.flush_profiler()
    return comm.drop_counters()


def test_ops_whose_kernel_steps_a_profiling_mask_left_out_are_counted_not_lost(tmp_path):
    """Ops run inside profiling(mask=...) without KernelStep made no stamps, so no counter said why their Colls had
    no slices (masked_out counts stamps made): the link counters had a gap nothing explained."""
    from slicetrace.events.abi import lost_counters
    counters = slicetrace.launch(_kernel_step_masked, 2, profiler_plugin="linkstats",
                                 linkstats_file=str(tmp_path / "m"), join_timeout_s=120)
    for rank, c in enumerate(counters):
        assert c["delivered_coll"] == 4 and c["ops_masked_kernel_step"] == 3
        assert "ops_masked_kernel_step" not in lost_counters(c)     # left out on purpose, as ops_sampled_out
        (prom,) = glob.glob(str(tmp_path / f"m_*_{rank}.prom"))
        acc = series(parse(open(prom, encoding="utf-8").read()), "slicetrace_profiler_accounting_total", "counter")
        assert acc[("ops_masked_kernel_step",)] == 3


def _ops_left_out_read_live(comm, prefix):
    """Five 400 KB all-reduces (op sampling 1 in 2: the 2nd and 4th left out), then three of 40 B (under the size
    threshold); the rank's .prom as the writer thread rewrites it while the communicator is still open."""
    big, small = np.ones(100_000, np.float32), np.ones(10, np.float32)
    for x in (big,) * 5 + (small,) * 3:
        comm.all_reduce(x, x)
    path, deadline = f"{prefix}_{comm.comm_hash}_{comm.rank}.prom", time.monotonic() + 60
    while True:             # the next rewrite after the last op (at least every interval while open)
        m = parse(open(path, encoding="utf-8").read())      # strict: each rewrite whole and valid
        acc = series(m, "slicetrace_profiler_accounting_total", "counter") if "slicetrace_profiler_accounting_total" \
            in m else {}
        if acc.get(("ops_below_min_bytes",)) == 3 and acc.get(("ops_sampled_out",)) == 2 or time.monotonic() > deadline:
            return acc
        time.sleep(0.05)


def test_ops_left_out_by_the_settings_are_in_every_rewrite_not_only_at_close(tmp_path):
    """ops_sampled_out and ops_below_min_bytes were the session's, handed to the plugins at close only: a live .prom
    (rewritten every interval) never had them while the job ran."""
    got = slicetrace.launch(_ops_left_out_read_live, 2, str(tmp_path / "m"), profiler_plugin="linkstats",
                            linkstats_file=str(tmp_path / "m"), linkstats_interval_s=0.05, op_sample_rate=2,
                            profile_min_bytes=1024, join_timeout_s=120)
    for acc in got:
        assert acc[("ops_sampled_out",)] == 2 and acc[("ops_below_min_bytes",)] == 3, acc
        assert acc[("delivered_coll",)] == 3            # the 1st, 3rd and 5th
