"""A tiny ring laps the reader in the middle of a channel program: what is left of that program must not reach the
trace (its KernelSteps would lie in no KernelCh), and every record stays counted once."""
from __future__ import annotations

import glob

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.trace import check_trace, kernel_chs, kernel_steps, load_traces
from slicetrace.plan.schedule import P2pPart, plan_collective, plan_p2p
from slicetrace.plan.traffic import stamp_records

SLOTS, COUNT, CHUNKS = 64, 20_000, 58       # all_reduce: 10 records per channel; the send: 60 on channel 0
KW = dict(ring_slots=SLOTS, nchannels=2, buffsize=1 << 16, timeout_s=30.0, profiler_plugin="example",
          join_timeout_s=120)


def _lapped(comm, mask):
    comm._session._poll_at = float("inf")    # the inline drain polls only when a ring is a quarter full
    x = np.ones(COUNT, np.float32)
    with comm.profiling(True, mask=mask):
        comm.all_reduce(x)
        comm.flush_profiler()                # read whole
        comm.all_reduce(x)                   # 10 records: not polled
        with comm.group():                   # 60 more on channel 0: polled, 6 lapped (the all_reduce's start..)
            if comm.rank == 0:
                comm.send(np.ones(2048 * CHUNKS, np.float32), 1)
            else:
                comm.recv(np.empty(2048 * CHUNKS, np.float32), 0)
        comm.flush_profiler()
    return comm.drop_counters()


def _records(rank):
    """Records per channel-0 program of the all_reduce and of the send/recv, and all the rank writes."""
    ar = plan_collective("all_reduce", 2, rank, COUNT, 4, 0, 2, (1 << 16) // 8)
    p2p = plan_p2p([P2pPart(1 - rank, rank == 0, 2048 * CHUNKS, 0)], 2, rank, 4, (1 << 16) // 8, (1 << 16) // 8, 2)
    n = {k: [stamp_records(p, 1, True, True)[0] for p in plan.programs if p.channel == 0]
         for k, plan in (("ar", ar), ("p2p", p2p))}
    total = sum(stamp_records(p, 1, True, True)[0] for plan in (ar, ar, p2p) for p in plan.programs)
    return n["ar"][0], n["p2p"][0], total


@pytest.mark.parametrize("mask", ["Coll|P2p|KernelCh|KernelStep", "Coll|P2p|KernelStep"])
def test_the_rest_of_a_program_whose_start_was_lapped_is_dropped_and_counted(tmp_path, mask):
    """The second all_reduce's channel-0 program lost its KernelCh start and first steps to the lap. Its last
    steps were delivered under no KernelCh (check_trace: 'has no KernelCh on channel 0') and its stop counted
    unpaired; now the whole program is counted overrun. With KernelStep alone the KernelCh records are still
    stamped (session._STAMP_CH), so the same program goes."""
    prefix = str(tmp_path / "lap")
    counters = slicetrace.launch(_lapped, 2, mask, profile_dump_file=prefix, **KW)
    files = sorted(glob.glob(prefix + "_*.json"))
    assert len(files) == 2
    for rank, (f, c) in enumerate(zip(files, counters)):
        ar0, p2p0, written = _records(rank)
        assert 0 < ar0 + p2p0 - SLOTS < ar0            # the lap cuts the all_reduce's channel-0 program
        assert check_trace(f) == [], f
        assert (c["overrun"], c["unpaired"], c["no_parent"], c["missing_kernel_ch"]) == (ar0, 0, 0, 1), c
        recs = load_traces([f])
        ks, kch = kernel_steps(recs), kernel_chs(recs)
        assert len(ks) == c["delivered_kernel_step"] == written - 2 * 5 - (ar0 - 2)     # 5 programs' KernelCh
        assert c.get("delivered_kernel_ch", 0) == (4 if "KernelCh" in mask else 0)
        assert sorted(kch["channel"].tolist()) == ([0, 1, 1] if "KernelCh" in mask else [])   # collectives' only
        assert c["delivered_kernel_step"] + 2 * 4 + c["overrun"] == written      # each record once
