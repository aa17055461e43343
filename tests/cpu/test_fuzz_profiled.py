"""Randomized profiled runs of the cpu engine: random ops, sizes (0, 1, primes, FIFO step/slice/chunk boundaries
of small buffers), channels, ranks, modes, sample rates, tiny stamp rings and event masks, each case on a fresh
communicator with a recording plugin. Checked: results against numpy; what the plugin received (KernelSteps inside
their KernelCh and Coll/P2p, bytes per direction as the algorithm moves them, a receive ready no earlier than the
matching send was done, which ops were profiled); loss counters exact (delivered + lost = written); no /dev/shm
segment left behind. The ranks are spawned once per world size and reused."""
from __future__ import annotations

import glob
import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import ALL_TYPES, effective_mask
from tests.helpers.fuzz_ops import run_case
from tests.helpers.procs import RankPool

_KEYS = itertools.count()
ITEMSIZE = {"int8": 1, "int32": 4, "float16": 2, "float32": 4, "float64": 8}
COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
FUNC = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
        "broadcast": "Broadcast", "reduce": "Reduce"}
BASE = int(T.COLL | T.P2P | T.KERNEL_CH | T.KERNEL_STEP)
MASKS = [BASE, BASE, int(T.COLL | T.P2P | T.KERNEL_STEP), int(T.COLL | T.P2P | T.KERNEL_CH), int(T.KERNEL_STEP),
         int(T.COLL | T.KERNEL_CH), int(T.P2P | T.KERNEL_STEP), int(T.COLL | T.P2P), int(ALL_TYPES)]
# every reason a record can be lost for; EVENT_LOSSES: those no case here may have (one plugin that keeps all)
EVENT_LOSSES = ("no_parent", "parent_dropped", "pool_full", "consumer_behind", "plugin_error", "plugin_disabled",
                "declined", "plugin_init_failed")
LOSSES = ("overrun", "unpaired", "undrained") + EVENT_LOSSES
PRIMES = [2, 3, 7, 13, 127, 1021, 7919, 16381]


@pytest.fixture(scope="module")
def pools():
    made: dict[int, RankPool] = {}

    def get(world: int) -> RankPool:
        if world not in made:
            made[world] = RankPool(world, timeout=120)
        return made[world]
    yield get
    for p in made.values():
        p.close()


@st.composite
def counts(draw, buffsize: int, itemsize: int):
    step = buffsize // 8 // itemsize                 # elements per FIFO step (slices are 2 steps, chunks 4)
    return draw(st.one_of(st.sampled_from([0, 1]), st.sampled_from(PRIMES),
                          st.builds(lambda m, d: max(m * step + d, 0), st.sampled_from([1, 2, 3, 4, 7, 8, 9, 16, 17, 33, 48, 64, 96]),
                                    st.sampled_from([-1, 0, 1]))))


@st.composite
def cases(draw):
    world = draw(st.integers(2, 4))
    kw = dict(buffsize=draw(st.sampled_from([1 << 15, 1 << 16])), nchannels=draw(st.integers(1, 4)),
              ring_slots=draw(st.sampled_from([64, 64, 128, 256, 1 << 14])), sample_rate=draw(st.sampled_from([1, 1, 2, 3, 7])),
              op_sample_rate=draw(st.sampled_from([1, 1, 2, 3])), profile_event_mask=draw(st.sampled_from(MASKS)),
              profile_min_bytes=draw(st.sampled_from([0, 0, 100, 5000])), timeout_s=30.0)
    ops = []
    for i in range(draw(st.integers(1, 5))):
        dtype = draw(st.sampled_from(sorted(ITEMSIZE)))
        count = draw(counts(kw["buffsize"], ITEMSIZE[dtype]))
        kind = draw(st.sampled_from(COLLS + ("p2p",)))
        if kind == "p2p":
            shifts = draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=3))
            ops.append(("p2p", dtype, shifts, count, 100 + i))
            continue
        redop = draw(st.sampled_from(["sum", "prod", "min", "max", "avg"])) if kind in (
            "all_reduce", "reduce", "reduce_scatter") else "sum"
        inplace = draw(st.booleans()) and kind != "all_to_all"
        ops.append(("coll", kind, dtype, redop, count, draw(st.integers(0, world - 1)), inplace, 10 + i))
    return world, kw, draw(st.sampled_from(["batch", "slow", "both"])), ops


def _nbytes(op, world) -> int:
    """The bytes op sampling and profile_min_bytes judge an op by (per-rank count x itemsize; a group: its largest)."""
    if op[0] == "p2p":
        return op[3] * ITEMSIZE[op[1]]
    return op[4] * ITEMSIZE[op[2]]


def profiled(ops, kw, world) -> list[bool]:
    """Which ops are profiled: at or above profile_min_bytes, then the first and every k-th of those, collectives
    and point-to-point groups (all_to_all is one) counted apart."""
    seen, out = {False: 0, True: 0}, []
    for op in ops:
        p2p = op[0] == "p2p" or op[1] == "all_to_all"
        if _nbytes(op, world) < kw["profile_min_bytes"]:
            out.append(False)
            continue
        seen[p2p] += 1
        out.append((seen[p2p] - 1) % kw["op_sample_rate"] == 0)
    return out


PER_PLUGIN = ("declined", "pool_full", "parent_dropped", "plugin_error", "plugin_disabled")


def check_case(world, kw, plugin, ops, res):
    mask = effective_mask(kw["profile_event_mask"])
    want_prof = profiled(ops, kw, world)
    views = []                          # per plugin: per rank, what it received and its own counters
    for rank, r in enumerate(res):
        assert r["wrong"] == [0] * len(ops), (rank, r["wrong"])
        c = r["counters"]
        assert c.get("ops_below_min_bytes", 0) == sum(_nbytes(o, world) < kw["profile_min_bytes"] for o in ops)
        assert c.get("ops_sampled_out", 0) == len(ops) - sum(want_prof) - c.get("ops_below_min_bytes", 0)
        assert [p["name"] for p in r["plugins"]] == (["recorder", "slow_recorder"] if plugin == "both" else
                                                    ["slow_recorder" if plugin == "slow" else "recorder"])
        for k, v in c.items():          # drop_counters(): the rank's counters, the plugins' own summed
            own = k.startswith(("delivered_", "unrecorded_")) or k in PER_PLUGIN
            got = [p["final"].get(k, 0) for p in r["plugins"]]
            assert (sum(got) if own else max(got)) == v == (v if own else min(got)), (rank, k, v, got)
        for i, p in enumerate(r["plugins"]):
            assert p["finalized"]
            check_accounting(rank, r, p, mask)
            check_nesting(rank, p, mask)
            views[i:] = views[i:] or [[]]
            views[i].append(dict(p, counters=p["final"]))
    for view in views:
        check_traffic(world, kw, ops, want_prof, view, mask)
        check_causality(view)
    if plugin == "both":                # the batch entry points and the per-event path deliver the same records
        for rank in range(world):
            a, b = (_normal(v[rank]) for v in views)
            assert a == b, rank


def _normal(p):
    """A plugin's records with op ids as the index of their op among its Coll/P2p events, sorted."""
    at = {o["id"]: i for i, o in enumerate(x for x in p["ops"] if x["cat"] in ("COLL", "P2P"))}
    steps = sorted((at[int(s["op"])], int(s["channel"]), int(s["is_send"]), int(s["peer"]), int(s["step"]),
                    int(s["size"]), int(s["wait_clk"]), int(s["ready_clk"]), int(s["done_clk"]), int(s["wait_ns"]),
                    int(s["ready_ns"]), int(s["done_ns"])) for s in p["steps"])
    chs = sorted((at[int(c["op"])], int(c["channel"]), int(c["start_clk"]), int(c["stop_clk"]), int(c["start_ns"]),
                  int(c["stop_ns"])) for c in p["chs"])
    return steps, chs


def check_accounting(rank, r, p, mask):
    """Every entry the engine wrote was delivered or counted lost. overrun, unpaired and undrained count ring
    entries (a KernelCh is two: start, stop); masked_out counts KernelCh events here (the plugins never drop
    KernelStep), which are stamped for KernelStep's sake when the mask has no KernelCh."""
    c = p["final"]
    assert {k: c.get(k, 0) for k in EVENT_LOSSES} == dict.fromkeys(EVENT_LOSSES, 0), (rank, c)
    assert c["masked_out"] == 0 or not mask & T.KERNEL_CH, (rank, c)
    lost = c["overrun"] + c["unpaired"] + c.get("undrained", 0) + 2 * c["masked_out"]
    delivered = c.get("delivered_kernel_step", 0) + 2 * c.get("delivered_kernel_ch", 0)
    assert delivered + lost == r["written_steps"] + r["written_chs"], (rank, c, r["written_steps"], r["written_chs"])
    assert c["sampled_out"] == r["skipped"], (rank, c["sampled_out"], r["skipped"])
    assert len(p["steps"]) == c.get("delivered_kernel_step", 0), (rank, len(p["steps"]), c)
    assert len(p["chs"]) == c.get("delivered_kernel_ch", 0), (rank, len(p["chs"]), c)


def check_nesting(rank, r, mask):
    ops = {o["id"]: o for o in r["ops"] if o["cat"] in ("COLL", "P2P")}
    steps, chs = r["steps"], r["chs"]
    if not mask & T.KERNEL_STEP:
        assert len(steps) == 0
    if not mask & T.KERNEL_CH:
        assert len(chs) == 0
    for o in ops.values():
        assert o["stop_ns"] is not None and o["start_ns"] <= o["stop_ns"], (rank, o)
    for ch in chs:
        o = ops[int(ch["op"])]                          # a KernelCh's parent is a Coll/P2p of this rank
        assert o["start_ns"] <= ch["start_ns"] <= ch["stop_ns"] <= o["stop_ns"], (rank, o, ch)
    spans: dict = {}
    for ch in chs:
        spans.setdefault((int(ch["op"]), int(ch["channel"])), []).append((int(ch["start_ns"]), int(ch["stop_ns"])))
    for s in steps:
        o = ops[int(s["op"])]
        assert s["wait_ns"] <= s["ready_ns"] <= s["done_ns"], (rank, s)
        assert s["wait_clk"] <= s["ready_clk"] <= s["done_clk"], (rank, s)
        assert o["start_ns"] <= s["wait_ns"] and s["done_ns"] <= o["stop_ns"], (rank, o, s)
        assert (o["func"] in ("Send", "Recv")) == (o["cat"] == "P2P")
        if o["cat"] == "P2P":
            assert (s["is_send"], s["peer"]) == (o["func"] == "Send", o["peer"]), (rank, o, s)
        if mask & T.KERNEL_CH and r["final"]["overrun"] == 0:
            inside = [a <= s["wait_ns"] and s["done_ns"] <= b for a, b in spans.get((int(s["op"]),
                                                                                    int(s["channel"])), [])]
            assert any(inside), (rank, o, s, spans.get((int(s["op"]), int(s["channel"]))))


def closed_form(func, n, rank, nbytes, root):
    """(bytes sent, received) by `rank` in the ring algorithm; None for all_reduce (checked over all ranks)."""
    if func in ("AllGather", "ReduceScatter"):
        return (n - 1) * nbytes, (n - 1) * nbytes
    if func == "Broadcast":
        return (0 if rank == (root - 1) % n else nbytes), (0 if rank == root else nbytes)
    if func == "Reduce":
        return (0 if rank == root else nbytes), (0 if rank == (root + 1) % n else nbytes)
    return None


def _expected_events(ops, prof, world, rank):
    """Per profiled op, the Coll (func, count, root) or P2p [(func, peer, count)] events this rank must get."""
    out = []
    for op, p in zip(ops, prof):
        if not p:
            continue
        if op[0] == "p2p":
            _, dtype, shifts, count, _ = op
            out.append(("P2P", dtype, [x for d in shifts for x in (("Send", (rank + d) % world, count),
                                                                   ("Recv", (rank - d) % world, count))]))
        elif op[1] == "all_to_all":
            out.append(("P2P", op[2], [(f, j, op[4]) for j in range(world) for f in ("Send", "Recv")]))
        else:
            root = op[5] if op[1] in ("broadcast", "reduce") else 0      # NCCL's descriptors: 0 when unused
            out.append(("COLL", op[2], [(FUNC[op[1]], op[4], root)]))
    return out


def check_traffic(world, kw, ops, prof, res, mask):
    exact = kw["sample_rate"] == 1 and bool(mask & T.KERNEL_STEP)
    ring = Counter()                     # all_reduce: (op index, direction) -> bytes over all ranks
    for rank, r in enumerate(res):
        c = r["counters"]
        evs = [o for o in r["ops"] if o["cat"] in ("COLL", "P2P")]
        want = [(k, cat, dt, e) for k, (cat, dt, es) in enumerate(_expected_events(ops, prof, world, rank))
                for e in es if mask & (T.COLL if cat == "COLL" else T.P2P)]
        got = [(o["func"], o["peer"], o["count"]) if o["cat"] == "P2P" else (o["func"], o["count"], o["root"])
               for o in evs]
        assert got == [e for *_, e in want], (rank, got, want)
        if not exact or any(c.get(k, 0) for k in LOSSES):
            continue
        steps = r["steps"]
        p2p = Counter()        # (op, Send/Recv, peer) -> (bytes sent, received), expected minus got
        for o, (k, cat, dtype, e) in zip(evs, want):
            mine = steps[steps["op"] == o["id"]]
            sent = int(mine["size"][mine["is_send"] == 1].sum())
            recv = int(mine["size"][mine["is_send"] == 0].sum())
            nbytes = o["count"] * ITEMSIZE[dtype]
            if cat == "P2P":    # parts of a group to one peer and direction may share their records (documented)
                moved = 0 if o["peer"] == rank else nbytes
                p2p[(k, o["func"], o["peer"], True)] += (moved if o["func"] == "Send" else 0) - sent
                p2p[(k, o["func"], o["peer"], False)] += (0 if o["func"] == "Send" else moved) - recv
                continue
            form = closed_form(o["func"], world, rank, nbytes, o["root"])
            if form is not None:
                assert (sent, recv) == form, (rank, o, sent, recv, form)
            else:
                ring[(k, True, nbytes)] += sent
                ring[(k, False, nbytes)] += recv
        assert {k: v for k, v in p2p.items() if v} == {}, rank
    for (i, _, nbytes), total in ring.items():        # a ring all_reduce moves 2 (n - 1) x its buffer each way
        assert total == 2 * (world - 1) * nbytes, (i, total, nbytes)


def check_causality(res):
    """On the shared clock a receive is ready no earlier than the matching send was done. Ring and p2p
    connections count steps apart; a connection is (kind, sender, receiver, channel)."""
    sends, recvs = {}, {}
    for rank, r in enumerate(res):
        kind = {o["id"]: o["cat"] for o in r["ops"]}
        for s in r["steps"]:
            if s["is_send"]:
                key = (kind[int(s["op"])], rank, int(s["peer"]), int(s["channel"]), int(s["step"]))
                assert key not in sends, key
                sends[key] = (int(s["done_ns"]), int(s["size"]))
            else:
                key = (kind[int(s["op"])], int(s["peer"]), rank, int(s["channel"]), int(s["step"]))
                assert key not in recvs, key
                recvs[key] = (int(s["ready_ns"]), int(s["size"]))
    if not any(r["counters"].get(k, 0) for r in res for k in LOSSES):
        assert sends.keys() == recvs.keys(), (sorted(sends.keys() ^ recvs.keys())[:10])
    both = sends.keys() & recvs.keys()
    assert [k for k in both if recvs[k][0] < sends[k][0] or recvs[k][1] != sends[k][1]] == []


def _shm(key: str) -> list[str]:
    return glob.glob(f"/dev/shm/*{key}*")


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_random_profiled_runs_keep_every_invariant(pools, case):
    world, kw, plugin, ops = case
    key = f"fz{next(_KEYS)}{pools(world).job}"
    res = pools(world).run(run_case, key, kw, plugin, ops)
    assert _shm(key) == []
    check_case(world, kw, plugin, ops, res)
