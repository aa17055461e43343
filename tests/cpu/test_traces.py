"""Trace invariants on real multi-process runs: traffic, nesting, causality, loss accounting."""
from __future__ import annotations

import glob
import time
from collections import Counter

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.report import stragglers
from slicetrace.analyze.trace import check_trace, kernel_chs, kernel_steps, load_traces
from slicetrace.plan.schedule import P2pPart, plan_collective, plan_p2p
from slicetrace.plan.traffic import expected_slices, stamp_records

FUNCS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
         "Broadcast": "broadcast", "Reduce": "reduce"}
KW = dict(buffsize=1 << 16, nchannels=2, timeout_s=30.0, profiler_plugin="example",
          join_timeout_s=120)       # launch() bound: a hang fails the test


A2A_BLOCK = 30_011            # all_to_all elements per peer: no other op of _ops has this count
ALIGN = 16                    # plan.schedule.ALIGN_BYTES: channel ranges and last-loop chunks round to it


def _ops(comm, count, a2a_block=0):
    n, r = comm.world_size, comm.rank
    x = np.full(count, r + 1, dtype=np.float32)
    comm.all_reduce(x)
    comm.all_gather(x)
    comm.reduce_scatter(np.ones(count * n, dtype=np.float32))
    comm.broadcast(x, root=0)
    comm.reduce(x, root=0)
    comm.all_reduce(x[: count // 3])
    with comm.group():
        comm.send(x, (r + 1) % n)
        comm.recv(np.empty_like(x), (r - 1) % n)
    ok = True
    if a2a_block:                # block j of rank r's input goes to rank j; exact in float32 (values < 2**24)
        k = a2a_block
        out = comm.all_to_all(np.arange(n * k, dtype=np.float32) + 1_000_000 * r)
        want = np.concatenate([np.arange(r * k, (r + 1) * k, dtype=np.float32) + 1_000_000 * j for j in range(n)])
        ok = bool((out == want).all())
    comm.flush_profiler()
    return comm.drop_counters(), ok


def _run(tmp_path, world, count, a2a_block=0, **kw):
    prefix = str(tmp_path / f"w{world}")
    res = slicetrace.launch(_ops, world, count, a2a_block, profile_dump_file=prefix, **{**KW, **kw})
    assert [ok for _, ok in res] == [True] * world          # the all_to_all results, where there is one
    files = sorted(glob.glob(prefix + "_*.json"))
    return [c for c, _ in res], files


def closed_form(name: str, n: int, rank: int, nbytes: int, root: int = 0) -> tuple[int, int] | None:
    """(bytes sent, bytes received) by `rank` in a ring algorithm, from the algorithm alone (not the plan);
    None for all_reduce, whose per-rank share depends on chunk rounding (checked within alignment)."""
    if name in ("AllGather", "ReduceScatter"):        # n - 1 blocks of the per-rank count pass each rank
        return (n - 1) * nbytes, (n - 1) * nbytes
    if name == "Broadcast":                            # root -> root+1 -> ... -> root-1
        return (0 if rank == (root - 1) % n else nbytes), (0 if rank == root else nbytes)
    if name == "Reduce":                               # root+1 -> ... -> root
        return (0 if rank == root else nbytes), (0 if rank == (root + 1) % n else nbytes)
    return None


@pytest.mark.parametrize("world", [2, 3, 4])
def test_trace_invariants_hold_on_real_runs(tmp_path, world):
    count = 70_001
    counters, files = _run(tmp_path, world, count, A2A_BLOCK)
    assert len(files) == world
    for f in files:
        assert check_trace(f) == [], f
    for c in counters:
        lost = {k: v for k, v in c.items() if not k.startswith(("delivered", "unrecorded_")) and v}
        assert lost == {}, lost
    recs = load_traces(files)
    ks = kernel_steps(recs)
    parents = {(r["pid"], r["id"]): r for r in recs if r.get("ph") == "b" and r.get("cat") in ("COLL", "P2P")}
    assert len(ks) > 0 and set(np.unique(ks["rank"])) == set(range(world))

    # bytes per direction (and every slice size) equal the plan's traffic, per rank and op
    a2a = {}                                           # rank -> [(Send/Recv, peer, KernelSteps)] of the all_to_all
    ring_totals = Counter()                            # (func, SeqNum, direction) -> bytes over all ranks
    for (rank, op_id), coll in parents.items():
        mine = ks[(ks["rank"] == rank) & (ks["op"] == op_id)]
        a = coll["args"]
        if coll["cat"] == "P2P" and a["Count"] == A2A_BLOCK:
            a2a.setdefault(rank, []).append((coll["name"], a["Peer"], mine))
            continue
        if coll["cat"] == "COLL":
            plan = plan_collective(FUNCS[coll["name"]], world, rank, a["Count"], 4, 0, 2, (1 << 16) // 8)
        else:
            part = P2pPart(a["Peer"], coll["name"] == "Send", a["Count"], 0)
            plan = plan_p2p([part], world, rank, 4, (1 << 16) // 8, (1 << 16) // 8, KW["nchannels"])
        want = Counter((c, s, p, b) for c, s, p, _, b in expected_slices(plan))
        got = Counter((int(r["channel"]), bool(r["is_send"]), int(r["peer"]), int(r["size"])) for r in mine)
        assert got == want, (rank, coll["name"], a)
        if coll["cat"] != "COLL":
            continue
        # ... and the algorithm's closed form, independent of the plan
        sent, recv = int(mine["size"][mine["is_send"] == 1].sum()), int(mine["size"][mine["is_send"] == 0].sum())
        nbytes = 4 * a["Count"]
        assert a["Count"] in (count, count // 3), a           # Count is the per-rank count, as NCCL's
        exact = closed_form(coll["name"], world, rank, nbytes)
        if exact is not None:
            assert (sent, recv) == exact, (rank, coll["name"], a, sent, recv)
        else:          # a rank skips one chunk per phase; in a channel's last loop chunks round up to ALIGN
            ideal, slack = 2 * (world - 1) / world * nbytes, 2 * (world - 1) * KW["nchannels"] * ALIGN
            assert abs(sent - ideal) <= slack and abs(recv - ideal) <= slack, (rank, a, sent, recv, ideal)
            ring_totals[(a["SeqNum"], True)] += sent
            ring_totals[(a["SeqNum"], False)] += recv
    # over all ranks an all_reduce moves exactly 2 (n - 1) x its buffer each way
    assert len(ring_totals) == 4 and all(
        v == 2 * (world - 1) * 4 * (count if seq == 0 else count // 3) for (seq, _), v in ring_totals.items()), \
        ring_totals

    # all_to_all: each rank sends (n - 1) / n of its input, one block to each other rank, and receives as much;
    # the block to itself is a copy (no KernelStep)
    assert sorted(a2a) == list(range(world))
    for rank, entries in a2a.items():
        assert sorted((name, peer) for name, peer, _ in entries) == sorted(
            (name, p) for name in ("Send", "Recv") for p in range(world))
        for name, peer, mine in entries:
            want_bytes = 0 if peer == rank else 4 * A2A_BLOCK
            assert int(mine["size"].sum()) == want_bytes, (rank, name, peer)
            assert set(mine["is_send"].tolist()) <= {int(name == "Send")} and set(mine["peer"].tolist()) <= {peer}
        total = Counter()
        for name, _, mine in entries:
            total[name] += int(mine["size"].sum())
        assert total == {"Send": (world - 1) * 4 * A2A_BLOCK, "Recv": (world - 1) * 4 * A2A_BLOCK}

    # causality, exact on the shared clock: a receive is ready no earlier than the matching send is done. Ring and
    # p2p connections count steps apart; a p2p send and its receive share a channel on both ranks, as rings do.
    kind = [parents[(int(r["rank"]), int(r["op"]))]["cat"] for r in ks]
    sends = {(k, int(r["rank"]), int(r["peer"]), int(r["channel"]), int(r["step"])): int(r["done_ns"])
             for k, r in zip(kind, ks) if r["is_send"]}
    recvs = {(k, int(r["peer"]), int(r["rank"]), int(r["channel"]), int(r["step"])): int(r["ready_ns"])
             for k, r in zip(kind, ks) if not r["is_send"]}
    assert sends.keys() == recvs.keys() and len(sends) == int(ks["is_send"].sum()) > 0
    assert "P2P" in set(kind)
    assert [key for key, t in recvs.items() if t < sends[key]] == []


def test_a_tiny_ring_overruns_with_exact_counts_and_a_valid_trace(tmp_path):
    count = 200_003
    counters, files = _run(tmp_path, 2, count, ring_slots=64, drain_interval_us=1_000_000)
    recs = load_traces(files)
    ks = kernel_steps(recs)
    for rank, c in enumerate(counters):
        assert c["overrun"] > 0
        delivered = int((ks["rank"] == rank).sum())
        assert delivered == c.get("delivered_kernel_step", 0)
        # every stamp the rank wrote is either delivered or counted lost (KernelCh records are two entries)
        written = 0
        for func, n in (("all_reduce", count), ("all_gather", count), ("reduce_scatter", count),
                        ("broadcast", count), ("reduce", count), ("all_reduce", count // 3)):
            plan = plan_collective(func, 2, rank, n, 4, 0, 2, (1 << 16) // 8)
            written += len(expected_slices(plan)) + 2 * len(plan.programs)
        plan = plan_p2p([P2pPart(1 - rank, True, count, 0), P2pPart(1 - rank, False, count, 1)], 2, rank, 4,
                        (1 << 16) // 8, (1 << 16) // 8, 2)
        written += len(expected_slices(plan)) + 2 * len(plan.programs)
        accounted = (delivered + 2 * c.get("delivered_kernel_ch", 0) + c["overrun"] + c["unpaired"] + c["unwritten"]
                     + c["no_parent"])
        assert accounted == written, (rank, c)
    for f in files:
        assert check_trace(f) == []


def _late(comm, late_rank, delay_s, nops):
    x = np.ones(20_000, np.float32)
    for _ in range(nops):
        if comm.rank == late_rank:
            time.sleep(delay_s)              # a straggler: every collective starts late on this rank
        comm.all_reduce(x)
    comm.flush_profiler()


def test_report_names_the_rank_that_arrives_late(tmp_path):
    prefix = str(tmp_path / "late")
    slicetrace.launch(_late, 3, 2, 0.05, 7, profile_dump_file=prefix, **KW)   # 50 ms: well above start skew under load
    recs = load_traces(sorted(glob.glob(prefix + "_*.json")))
    chs = kernel_chs(recs)
    sk = stragglers(chs, ranks=[0, 1, 2])
    assert sk.left_out == {"collectives": 0, "lacking": []}
    assert [(r["rank"], r["times_last"], r["consistent"]) for r in sk.ranks] == [(2, 6, True)]     # 6 of 6: odds 1/729
    assert len(sk.ops) == 6 and all(o["rank"] == 2 and o["ranks"] == 3 and o["late_us"] > 0 for o in sk.ops)
    # causal, exact on the shared clock: a ring all_reduce needs rank 2's data on every channel, so no rank's
    # program of a channel stops before rank 2's program of that channel started
    assert sorted(set(chs["seq_number"].tolist())) == [sk.startup["seq"]] + sorted(o["seq"] for o in sk.ops)
    for seq in set(chs["seq_number"].tolist()):
        mine = chs[chs["seq_number"] == seq]
        late = {int(c): int(t) for rk, c, t in zip(mine["rank"], mine["channel"], mine["start_ns"]) if rk == 2}
        assert sorted(late) == [0, 1]
        early = [(int(rk), int(c)) for rk, c, t in zip(mine["rank"], mine["channel"], mine["stop_ns"])
                 if t < late[int(c)]]
        assert early == [], (seq, early)


def _twice_to_one_peer(comm, count):
    n, r = comm.world_size, comm.rank
    a, b = np.full(count, r, np.float32), np.full(count // 2 + 1, r, np.float32)
    ra, rb = np.empty_like(a), np.empty_like(b)
    with comm.group():                       # two parts per direction to one peer: records must not double
        comm.send(a, (r + 1) % n)
        comm.send(b, (r + 1) % n)
        comm.recv(ra, (r - 1) % n)
        comm.recv(rb, (r - 1) % n)
    comm.flush_profiler()
    return comm.drop_counters(), bool((ra == (r - 1) % n).all()), bool((rb == (r - 1) % n).all())


def test_two_parts_to_one_peer_in_a_group_deliver_each_record_once(tmp_path):
    count = 50_001
    prefix = str(tmp_path / "twice")
    res = slicetrace.launch(_twice_to_one_peer, 2, count, profile_dump_file=prefix, **KW)
    files = sorted(glob.glob(prefix + "_*.json"))
    assert len(files) == 2
    assert [(ok_a, ok_b) for _, ok_a, ok_b in res] == [(True, True)] * 2      # both buffers whole, every element
    counters = [c for c, _, _ in res]
    for f, c in zip(files, counters):
        assert check_trace(f) == [], f
        assert {k: v for k, v in c.items() if not k.startswith(("delivered", "unrecorded_")) and v} == {}
        ks = kernel_steps(load_traces([f]))
        for is_send in (1, 0):               # every slice of both parts once: sizes add up to both buffers
            assert int(ks["size"][ks["is_send"] == is_send].sum()) == 4 * (count + count // 2 + 1)


def _mask_limited(comm, count):
    from slicetrace.errors import UsageError
    from slicetrace.events.abi import EventType
    x = np.ones(count, np.float32)
    comm.all_reduce(x)
    comm.flush_profiler()
    a = dict(comm.drop_counters())
    with comm.profiling(True, mask=~int(EventType.KERNEL_STEP) & 0xFFFFFFFF):     # all but KernelStep
        comm.all_reduce(x)
    with comm.profiling(True, mask="Coll|KernelCh"):                              # the same, by name
        comm.all_reduce(x)
    comm.flush_profiler()
    b = dict(comm.drop_counters())
    errs = []
    for bad in (-1, 1.5, True, "Coll|KernelStp"):
        try:
            with comm.profiling(True, mask=bad):
                pass
        except UsageError as e:
            errs.append(str(e))
    return a, b, errs


def test_a_mask_limit_drops_kernel_step_alone_and_is_checked():
    """What `bench --overhead-of kernel_step` compares: ops profiled without KernelStep keep their Coll and
    KernelCh events, write no slice stamps, and lose nothing."""
    for a, b, errs in slicetrace.launch(_mask_limited, 2, 100_003, **KW):
        assert a["delivered_kernel_step"] > 0 and b["delivered_kernel_step"] == a["delivered_kernel_step"]
        assert b["delivered_kernel_ch"] == 3 * a["delivered_kernel_ch"] > 0
        assert b["delivered_coll"] == 3 and b["ops_masked_kernel_step"] == 2     # left out on purpose, counted
        assert not {k: v for k, v in b.items() if not k.startswith(("delivered", "unrecorded_")) and v
                    and k not in ("clock_offset_ns", "clock_uncertainty_ns", "ops_masked_kernel_step")}
        assert len(errs) == 4 and all("must be an int >= 0 of EventType bits" in e for e in errs[:3]), errs
        assert errs[3].startswith("mask='Coll|KernelStp': 'KernelStp' is not an event type, which are GROUP,"), errs


def _sampled(comm):
    big, small = np.ones(3000, np.float32), np.ones(10, np.float32)
    for i in range(7):
        comm.all_reduce(big)
        if i % 2:
            comm.all_reduce(small)                       # 40 bytes: under profile_min_bytes
    with comm.group():                                   # the first p2p group: counted apart, profiled
        comm.send(big, (comm.rank + 1) % comm.world_size)
        comm.recv(np.empty_like(big), (comm.rank - 1) % comm.world_size)
    comm.flush_profiler()
    return comm.drop_counters()


def test_op_sampling_and_min_bytes_profile_the_same_ops_on_every_rank_and_count_the_rest(tmp_path):
    prefix = str(tmp_path / "sampled")
    counters = slicetrace.launch(_sampled, 2, profile_dump_file=prefix, op_sample_rate=3, profile_min_bytes=1024,
                                 **KW)
    files = sorted(glob.glob(prefix + "_*.json"))
    assert len(files) == 2
    recs = load_traces(files)
    ks = kernel_steps(recs)
    for rank, (f, c) in enumerate(zip(files, counters)):
        assert check_trace(f) == []
        assert (c["ops_sampled_out"], c["ops_below_min_bytes"]) == (4, 3), c
        lost = {k: v for k, v in c.items() if v and not k.startswith(("delivered", "unrecorded_", "ops_"))}
        assert lost == {}, lost
        colls = [r for r in recs if r.get("ph") == "b" and r.get("pid") == rank and r.get("cat") == "COLL"]
        # collectives 1, 4 and 7 of those >= 1 KiB; seq numbers count every all_reduce (the small ones too)
        assert sorted(r["args"]["SeqNum"] for r in colls) == [0, 4, 9], colls
        p2ps = [r for r in recs if r.get("ph") == "b" and r.get("pid") == rank and r.get("cat") == "P2P"]
        assert len(p2ps) == 2, p2ps                     # the group's send and recv
        assert int((ks["rank"] == rank).sum()) == c["delivered_kernel_step"] > 0
        meta = [r for r in recs if r.get("name") == "slicetrace_counters" and r.get("pid") == rank]
        assert meta and meta[0]["args"]["ops_sampled_out"] == 4 and meta[0]["args"]["ops_below_min_bytes"] == 3


def _sampled_with_own_p2p(comm):
    x = np.ones(3000, np.float32)
    for i in range(6):
        if comm.rank < 2 and i % 2:                      # ranks 0 and 1 exchange on their own, between collectives
            p = 1 - comm.rank
            with comm.group():
                comm.send(x, p)
                comm.recv(np.empty_like(x), p)
        comm.all_reduce(x)
    comm.flush_profiler()


def test_op_sampling_profiles_the_same_collectives_on_ranks_with_p2p_of_their_own(tmp_path):
    """Op sampling counted p2p groups and collectives together: ranks with p2p traffic of their own profiled
    other collectives than the rest, and report then judged none of them."""
    prefix = str(tmp_path / "own")
    slicetrace.launch(_sampled_with_own_p2p, 3, profile_dump_file=prefix, op_sample_rate=2, **KW)
    recs = load_traces(sorted(glob.glob(prefix + "_*.json")))
    seqs = {r: sorted(e["args"]["SeqNum"] for e in recs if e.get("ph") == "b" and e.get("pid") == r
                      and e.get("cat") == "COLL") for r in range(3)}
    assert seqs == {0: [0, 2, 4], 1: [0, 2, 4], 2: [0, 2, 4]}, seqs
    left_out = stragglers(kernel_chs(recs), ranks=[0, 1, 2]).left_out
    assert left_out["collectives"] == 0, left_out


def _a2a_once(comm, block):
    n, r = comm.world_size, comm.rank
    comm.all_to_all(np.full(n * block, r, np.float32))
    comm.flush_profiler()


def test_a_p2p_lane_is_not_charged_with_time_spent_on_the_other_lanes(tmp_path):
    """All parts of a group move round-robin in one thread. A send's wait used to start at its lane's previous
    done (or the part's start), so the copies of the lanes served before it read as waiting for credit from its
    peer. In a first all_to_all of 2 steps per message the FIFOs are empty: no send ever lacks credit, so every
    send's wait is its ready clock, exactly."""
    prefix = str(tmp_path / "lanes")
    block = 4096                              # 16 KiB per peer = 2 steps of the 64 KiB buffer's 8 KiB
    slicetrace.launch(_a2a_once, 3, block, profile_dump_file=prefix, **KW)
    ks = kernel_steps(load_traces(sorted(glob.glob(prefix + "_*.json"))))
    sends = ks[ks["is_send"] == 1]
    assert len(sends) == 3 * 2 * 2            # 3 ranks, 2 peers, 2 steps
    assert (sends["wait_ns"] == sends["ready_ns"]).all(), (sends["ready_ns"] - sends["wait_ns"]).tolist()
    recvs = ks[ks["is_send"] == 0]
    assert len(recvs) == 12 and (recvs["wait_ns"] <= recvs["ready_ns"]).all()


def _sampled_ring(comm):
    x = np.full(300_001, comm.rank + 1, np.float32)
    comm.all_reduce(x)
    comm.reduce_scatter(np.ones(3 * 100_003, np.float32))
    comm.all_gather(x[:100_003])
    comm.flush_profiler()
    return comm.drop_counters()


def test_kernel_step_sampling_keeps_the_same_slices_at_both_ends_of_a_connection(tmp_path):
    """Sampling used to count a program's slices, both directions together: rank r's k-th slice is a send, its
    peer's k-th a receive of another step, so with k = 4 no kept receive had its kept send (no flow, no causality
    check). Counted per direction, both ends keep the same steps."""
    prefix = str(tmp_path / "samp")
    res = slicetrace.launch(_sampled_ring, 3, profile_dump_file=prefix, sample_rate=4, **KW)
    ks = kernel_steps(load_traces(sorted(glob.glob(prefix + "_*.json"))))
    sends = {(int(r["rank"]), int(r["peer"]), int(r["channel"]), int(r["step"])): int(r["done_ns"])
             for r in ks if r["is_send"]}
    recvs = {(int(r["peer"]), int(r["rank"]), int(r["channel"]), int(r["step"])): int(r["ready_ns"])
             for r in ks if not r["is_send"]}
    assert len(recvs) > 20 and sends.keys() == recvs.keys()
    assert [key for key, t in recvs.items() if t < sends[key]] == []
    assert all(c["sampled_out"] > 2 * len(ks) // 3 for c in res)      # about 3 of every 4 left out, per rank
    # exactly: per op, program and direction, the slices whose index in that direction is a multiple of 4, and as
    # many kept and left out as plan.traffic.stamp_records counts
    recs = load_traces(sorted(glob.glob(prefix + "_*.json")))
    colls = [r for r in recs if r.get("ph") == "b" and r.get("cat") == "COLL"]
    assert sorted(r["name"] for r in colls) == sorted(["AllReduce", "ReduceScatter", "AllGather"] * 3)
    skipped = Counter()
    for coll in colls:
        rank, a = coll["pid"], coll["args"]
        mine = ks[(ks["rank"] == rank) & (ks["op"] == coll["id"])]
        plan = plan_collective(FUNCS[coll["name"]], 3, rank, a["Count"], 4, 0, 2, (1 << 16) // 8)
        ss, kept = plan.proto.slice_steps, 0
        for prog in plan.programs:
            k, s = stamp_records(prog, 4, True, False)
            kept += k
            skipped[rank] += s
            for is_send in (False, True):
                sizes = [n * 4 for prim in prog.prims for _, n in prim.slices
                         if (prim.send_to if is_send else prim.recv_from) is not None]
                want = [(i, b) for i, b in enumerate(sizes) if i % 4 == 0 and b > 0]
                got = sorted((int(r["step"]), int(r["size"])) for r in mine
                             if r["channel"] == prog.channel and bool(r["is_send"]) == is_send)
                assert want and want[0][0] == 0 and len(got) == len(want), (coll["name"], rank, is_send, got, want)
                assert [((st - got[0][0]) // ss, b) for st, b in got] == want, (coll["name"], rank, prog.channel)
        assert len(mine) == kept, (coll["name"], rank)
    assert [c["sampled_out"] for c in res] == [skipped[r] for r in range(3)]


def _late_send(comm, delay_s):
    store, key = comm._session.store, "test/late_send/receiving"
    x = np.ones(1000, np.float32)
    comm.all_reduce(x)                       # both ranks past start-up
    if comm.rank == 0:
        store.get(key, 60)                   # rank 1 is about to post its receive: it waits from there on
        time.sleep(delay_s)
        comm.send(x, 1)
    else:
        store.set(key, b"1")
        comm.recv(np.empty_like(x), 0)
    comm.flush_profiler()


def test_a_receive_posted_before_its_sender_sends_records_its_wait(tmp_path):
    """A blocked p2p lane stamps when it began to wait: a receive posted ~1 s before its data came waited that
    long, so its wait clock is well before its ready clock (not equal to it, as if it had never waited)."""
    prefix = str(tmp_path / "latesend")
    slicetrace.launch(_late_send, 2, 1.0, profile_dump_file=prefix, **KW)
    ks = kernel_steps(load_traces(sorted(glob.glob(prefix + "_*.json"))))
    recv = ks[(ks["rank"] == 1) & (ks["is_send"] == 0) & (ks["peer"] == 0) & (ks["size"] == 4000)]
    assert len(recv) == 1, ks                # 4000 bytes: one step of the send/recv, not the all_reduce's
    waited = int(recv["ready_ns"][0] - recv["wait_ns"][0])
    assert waited >= 500_000_000, waited     # half the sleep: it began once rank 1 was about to receive
