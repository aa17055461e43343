"""sinks.chrome: the files of two communicators of one process, merged into one trace (Perfetto opens many files
as one), keep their events apart: async ids and processes are per communicator, and the analyzer still reads
each file's rank."""
from __future__ import annotations

import json

from slicetrace.analyze import check_trace, kernel_steps, load_trace
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks.chrome import ChromePlugin


def _write(tmp_path, comm_hash, rank, nranks=2):
    host = EventHost([LoadedPlugin(ChromePlugin(Settings(profile_dump_file=str(tmp_path / "tr"))))],
                     abi.CommInfo(comm_hash, f"c{comm_hash}", 1, nranks, rank))
    src = SyntheticSource(nranks=nranks, rank=rank, nchannels=2, loops=1, funcs=("all_reduce", "send_recv"), seed=1)
    for op in src.ops(3):
        op.info.mask = host.op_mask()
        host.begin_op(op.info)
        deliver(host, op)
    host.close()
    return str(tmp_path / f"tr_{comm_hash}_{rank}.json")


def test_two_communicators_of_one_rank_merge_without_sharing_ids_or_a_process(tmp_path):
    files = [_write(tmp_path, 111, 0), _write(tmp_path, 222, 0), _write(tmp_path, 111, 1)]
    raw = [json.load(open(f)) for f in files]
    merged = [r for recs in raw for r in recs if r]
    assert check_trace(merged) == []             # every b pairs with its own e: no (cat, id) met twice
    ids = [(r["cat"], r["id"]) for r in merged if r.get("ph") == "b"]
    assert len(ids) == len(set(ids)) > 0
    assert all(i < 2 ** 53 for _, i in ids)     # exact as doubles (a spreadsheet, a JavaScript viewer)
    pids = [{r["pid"] for r in recs if "pid" in r} for recs in raw]
    assert all(len(p) == 1 for p in pids) and len(set.union(*pids)) == 3 and 0 not in set.union(*pids)
    names = [next(r["args"]["name"] for r in recs if r.get("name") == "process_name") for recs in raw]
    assert names == ["rank 0 (comm 111)", "rank 0 (comm 222)", "rank 1 (comm 111)"]
    # the analyzer keys ranks by pid: it reads each file's rank, not its per-communicator pid
    for f, rank in zip(files, (0, 0, 1)):
        recs = load_trace(f)
        assert {r["pid"] for r in recs if "pid" in r} == {rank}
        assert set(kernel_steps(recs)["rank"].tolist()) == {rank}


def test_pids_and_id_bases_of_many_communicators_do_not_meet():
    """The pid was a 15-bit fold of the communicator beside the rank: two of 76 job names met (one process, and
    their async ids paired across files), and ids were pid << 32, above 2**53 for nearly every communicator. Odds
    of a meeting among M (communicator, rank) pairs: ~M**2 / 2**32 (pids), ~M**2 / 2**28 (id bases)."""
    from slicetrace.sinks.chrome_text import id_base, trace_pid
    pairs = [(h * 0x9E3779B97F4A7C15 % (1 << 64), r) for h in range(1, 65) for r in range(8)]   # 64 x 8 ranks
    pids = {trace_pid(h, r) for h, r in pairs}
    bases = {id_base(h, r) for h, r in pairs}
    assert len(pids) == len(bases) == len(pairs)
    assert all(0 < p < 2 ** 31 for p in pids) and all(b + 2 ** 26 <= 2 ** 53 for b in bases)


def test_async_ids_take_a_further_span_once_the_files_own_is_spent(tmp_path, monkeypatch):
    """Each event and KernelCh row took the next id with no end: past a file's 2**26 (~1M ops at 64 channels)
    its ids ran into another file's span, and past 2**53 for the highest bases. Started near the end of the span,
    the ids now go on in a further span of the file's own (id_base's next), and the trace still pairs."""
    from slicetrace.sinks import chrome_store
    from slicetrace.sinks.chrome_text import ID_SPAN, id_base
    made = []

    class NearTheEnd(chrome_store.Ctx):
        def __init__(self, *a):
            super().__init__(*a)
            self.next_id = self.id0 + ID_SPAN - 5       # a few ids left: the first op's events spend them
            made.append(self)
    monkeypatch.setattr("slicetrace.sinks.chrome.Ctx", NearTheEnd)
    f = _write(tmp_path, 333, 1)
    base, more = id_base(333, 1), id_base(333, 1, 1)
    recs = [r for r in json.load(open(f)) if r]
    ids = [r["id"] for r in recs if r.get("ph") == "b"]
    assert made and made[0].spans == {base, more} and more != base
    assert all(base + ID_SPAN - 5 <= i < base + ID_SPAN or more <= i < more + ID_SPAN for i in ids), ids
    assert more in ids and base + ID_SPAN - 5 in ids and max(ids) < 2 ** 53      # both spans were used
    assert check_trace(recs) == []


def test_a_file_that_spends_its_id_span_keeps_its_ids_unique(tmp_path, monkeypatch):
    """Once a file's span was spent (2**26 ids: ~1M ops at 64 channels) its ids started over at its base: every
    later event took an id an earlier one of the same file had, so check_trace found each 'b' and 'e' twice, and
    report's KernelCh pairs, Coll ends and op starts (keyed by pid and id) lost or mixed them up. A span of 4
    ids here, spent several times by the run."""
    from slicetrace.analyze.trace import kernel_chs
    from slicetrace.sinks import chrome_store
    monkeypatch.setattr(chrome_store, "ID_SPAN", 4)
    f = _write(tmp_path, 333, 1)
    recs = [r for r in json.load(open(f)) if r]
    ids = [(r["cat"], r["id"]) for r in recs if r.get("ph") == "b"]
    assert len(ids) > 2 * 4
    assert len(ids) == len(set(ids))
    assert all(i < 2 ** 53 for _, i in ids)
    assert check_trace(recs) == []
    assert len(kernel_chs(recs)) == sum(r.get("name") == "KernelCh" and r.get("ph") == "b" and
                                        r["args"].get("ParentId") in {i for c, i in ids if c == "COLL"} for r in recs)


def test_comm_hashes_stay_exact_as_doubles():
    """The commHash is written as an int (args.CommHash of every Coll/P2p record and slicetrace_comm, the process
    name, the file name): it was 63 bits, so a JavaScript viewer or a spreadsheet reading the trace rounded it
    (7364671435790710097 of `bench --trace` read back as ...09760), and two communicators could read as one."""
    from slicetrace.session import comm_hash
    hashes = [comm_hash(f"job-{i}", g) for i in range(64) for g in (1, 2)]
    assert all(0 <= h < 2 ** 53 for h in hashes) and len(set(hashes)) == len(hashes)
