"""A timeout names the collective it stopped in as the trace does (function and SeqNum), so the error and
`slicetrace report`'s "unfinished: AllReduce #N" point at the same op."""
from __future__ import annotations

import json
import re
import uuid

import numpy as np

import slicetrace
from slicetrace.backend.opsig import coll_name, encode_sig
from slicetrace.cli.main import main
from slicetrace.errors import CommTimeoutError
from slicetrace.session import comm_hash

SHORT = 1.5         # the sub-communicator's timeout_s: rank 0's wait in the op rank 1 never starts
NAME = re.compile(r"(\w+) #(\d+) \(collective #(\d+) of this communicator\)")


def _one_rank_stops(comm, prefix: str, job: str) -> str:
    """Six all-reduces and three broadcasts (each function numbered from 0, the communicator's collectives from 1),
    then rank 1 stays away from the seventh all-reduce until rank 0's wait in it has ended."""
    store = comm._session.store
    comm.barrier()
    r = comm.rank
    with slicetrace.init(rank=r, world_size=comm.world_size, job=job, timeout_s=SHORT, profiler_plugin="example",
                         profile_dump_file=prefix) as sub:
        x = np.ones(1 << 10, np.float32)
        for _ in range(3):
            sub.all_reduce(x)
            sub.broadcast(x)
            sub.all_reduce(x)
        if r == 1:
            store.get(f"test/{job}/ended", 60.0)
            return "away"
        try:
            sub.all_reduce(x)
        except CommTimeoutError as e:
            return str(e)
        finally:
            store.set(f"test/{job}/ended", b"1")
    return "returned"


def test_a_timeout_names_the_op_by_the_seq_number_its_trace_shows(tmp_path):
    """Before: the error said "had not started collective #10" (every collective, from 1) where the report said
    "unfinished: AllReduce #6" (NCCL's per-function SeqNum, from 0)."""
    prefix, job = str(tmp_path / "t"), uuid.uuid4().hex[:10]
    res = slicetrace.launch(_one_rank_stops, 2, prefix, job, timeout_s=30.0, join_timeout_s=120)
    assert res[1] == "away", res
    named = NAME.search(res[0])
    assert named and "rank(s) 1 had not started " + named.group(0) in res[0], res[0]
    assert named.groups() == ("AllReduce", "6", "10"), res[0]
    # which of the rank's two communicators: the sub-communicator, by the hash its trace files carry
    assert res[0].endswith(f" [comm_hash={comm_hash(job)}, name='slicetrace-{job}']"), res[0]
    assert (tmp_path / f"t_{comm_hash(job)}_0.json").exists()
    out = tmp_path / "rep.json"
    assert main(["report", prefix, "--json", str(out)]) == 0
    unfinished = json.loads(out.read_text())["unfinished"]
    assert [(u["func"], u["seq"]) for u in unfinished] == [("AllReduce", 6)], unfinished


def test_coll_name_reads_the_function_from_the_signature():
    sig = (154,) + encode_sig("reduce_scatter", 8, "float32", "sum", 0, 1, 4096)
    assert coll_name(sig, 51) == "ReduceScatter #51 (collective #154 of this communicator)"
    assert coll_name(sig, -1) == "collective #154"          # a Work built without its SeqNum
