"""An error between ranks says which communicator it came from (a process may hold several, each numbering its
collectives from 1): its comm_hash as its trace files show it, and its name."""
from __future__ import annotations

import glob
import os
import uuid

import numpy as np
import pytest

import slicetrace
from slicetrace.errors import SliceTraceError

pytestmark = pytest.mark.usefixtures("sigint_on")   # tests/cpu/conftest.py


def _mismatch_in_a_second_communicator(comm, prefix: str, job: str) -> dict:
    """The launch's communicator stays open; a second one, named, runs an all_reduce whose count differs across
    ranks, then an all_to_all whose counts do not pair."""
    r, out = comm.rank, {"launch_hash": comm.comm_hash}
    comm.all_reduce(np.ones(4, np.float32))
    for what in ("all_reduce", "all_to_all"):
        sub = slicetrace.init(rank=r, world_size=2, job=f"{job}-{what}", name=f"second-{what}", timeout_s=10,
                              profiler_plugin="example", profile_dump_file=prefix)
        out[what + "_hash"], out[what + "_name"] = sub.comm_hash, sub.name
        try:
            if what == "all_reduce":
                sub.all_reduce(np.ones(8 * (r + 1), np.float32))
            else:                       # rank 1 sends rank 0 two elements where rank 0 expects one
                sub.all_to_all(np.ones(3, np.float32), send_counts=[2, 1] if r else [1, 2],
                               recv_counts=[2, 1] if r else [1, 1])
            out[what] = "returned"
        except SliceTraceError as e:
            out[what] = f"{type(e).__name__}: {e}"
        try:
            sub.close()
        except SliceTraceError:         # a sender whose data fit may learn of the mismatch here
            pass
    comm.barrier()
    return out


def test_an_error_between_ranks_names_its_communicator_as_its_trace_does(tmp_path):
    """Before: "... (collective #1 of this communicator)", with no word of which of the rank's two."""
    prefix = str(tmp_path / "t")
    res = slicetrace.launch(_mismatch_in_a_second_communicator, 2, prefix, uuid.uuid4().hex[:8], timeout_s=20,
                            join_timeout_s=120)
    for r, got in enumerate(res):
        h, name = got["all_reduce_hash"], got["all_reduce_name"]
        assert name == "second-all_reduce" and h != got["launch_hash"]
        tag = f" [comm_hash={h}, name='second-all_reduce']"
        assert got["all_reduce"].startswith("MismatchError: collective #1 differs across ranks") and \
            got["all_reduce"].endswith(tag), got["all_reduce"]
        assert got["all_reduce"].count("comm_hash=") == 1
        assert os.path.exists(f"{prefix}_{h}_{r}.json")         # the number its trace file carries
    # all_to_all restates the mismatch in its counts' terms: the communicator still named once, at the end
    a2a, h = res[0]["all_to_all"], res[0]["all_to_all_hash"]
    assert a2a.startswith("MismatchError: all_to_all: ") and a2a.endswith(f"; rank i's send_counts[j] must equal rank j's "
                                                          f"recv_counts[i] (this rank's send_counts=[1, 2], "
                                                          f"recv_counts=[1, 1]) [comm_hash={h}, "
                                                          f"name='second-all_to_all']"), a2a
    assert a2a.count("comm_hash=") == 1
    assert sorted(os.path.basename(f) for f in glob.glob(f"{prefix}_*.json")) == sorted(
        f"t_{res[0][k]}_{r}.json" for k in ("all_reduce_hash", "all_to_all_hash") for r in range(2))
