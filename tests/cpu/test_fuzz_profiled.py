"""Randomized profiled runs of the cpu engine: random ops, sizes (0, 1, primes, FIFO step/slice/chunk boundaries
of small buffers), channels, ranks, modes, sample rates, tiny stamp rings and event masks, each case on a fresh
communicator with a recording plugin. Checked: results against numpy; what the plugin received (KernelSteps inside
their KernelCh and Coll/P2p, bytes per direction as the algorithm moves them, a receive ready no earlier than the
matching send was done, which ops were profiled); loss counters exact (delivered + lost = written); no /dev/shm
segment left behind; a faulty plugin beside a clean one loses exactly what the host counts. The ranks are spawned
once per world size and reused by both tests."""
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
LOSSES = ("overrun", "unpaired", "unwritten", "undrained") + EVENT_LOSSES
PER_PLUGIN = ("declined", "pool_full", "parent_dropped", "plugin_error", "plugin_disabled")   # each plugin's own
LIMITS = [int(ALL_TYPES & ~T.KERNEL_STEP), int(T.KERNEL_STEP), int(T.KERNEL_CH), int(T.COLL)]
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
                          st.builds(lambda m, d: max(m * step + d, 0),
                                    st.sampled_from([1, 2, 3, 4, 7, 8, 9, 16, 17, 33, 48, 64, 96]),
                                    st.sampled_from([-1, 0, 1]))))


@st.composite
def cases(draw):
    world = draw(st.integers(2, 4))
    kw = dict(buffsize=draw(st.sampled_from([1 << 15, 1 << 16])), nchannels=draw(st.integers(1, 4)),
              ring_slots=draw(st.sampled_from([64, 64, 128, 256, 1 << 14])),
              sample_rate=draw(st.sampled_from([1, 1, 2, 3, 7])),
              op_sample_rate=draw(st.sampled_from([1, 1, 2, 3])), profile_event_mask=draw(st.sampled_from(MASKS)),
              profile_min_bytes=draw(st.sampled_from([0, 0, 100, 5000])), timeout_s=30.0,
              cpu_pool=draw(st.sampled_from([0, 0, 4 << 20])))     # registered memory: direct slices
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
        reg = draw(st.integers(0, (1 << world) - 1)) if kw["cpu_pool"] else 0     # ranks with registered buffers
        ops.append(("coll", kind, dtype, redop, count, draw(st.integers(0, world - 1)), inplace, 10 + i, reg))
    # per op: the plugins' new mask (None: kept), profiling on, a comm.profiling(mask=) limit (None: no block)
    ctl = [(draw(st.sampled_from([None] * 6 + MASKS)), draw(st.sampled_from([True] * 5 + [False])),
            draw(st.sampled_from([None] * 4 + LIMITS))) for _ in ops]
    return world, kw, draw(st.sampled_from(["batch", "slow", "both"])), ops, ctl


def _nbytes(op) -> int:
    """The bytes op sampling and profile_min_bytes judge an op by (per-rank count x itemsize; a group: its largest)."""
    if op[0] == "p2p":
        return op[3] * ITEMSIZE[op[1]]
    return op[4] * ITEMSIZE[op[2]]


def profiled(ops, ctl, kw) -> tuple[list[int], int, int]:
    """Each op's event mask (0: unprofiled), and the ops below profile_min_bytes and sampled out. An op in a
    profiling(False) block is neither; the others at or above profile_min_bytes count towards op sampling (the
    first and every k-th, collectives and point-to-point groups, all_to_all among them, counted apart); a profiled
    op's mask is the plugins' (parents added), within the block's limit (a kept type keeps its parents)."""
    seen, masks, below, out = {False: 0, True: 0}, [], 0, 0
    plugin = kw["profile_event_mask"]
    for op, (pm, on, limit) in zip(ops, ctl):
        plugin = plugin if pm is None else pm
        if not on:
            masks.append(0)
            continue
        if _nbytes(op) < kw["profile_min_bytes"]:
            below += 1
            masks.append(0)
            continue
        p2p = op[0] == "p2p" or op[1] == "all_to_all"
        seen[p2p] += 1
        if (seen[p2p] - 1) % kw["op_sample_rate"]:
            out += 1
            masks.append(0)
            continue
        m = effective_mask(plugin) & int(ALL_TYPES)
        masks.append(m if limit is None else effective_mask(m & limit) & m)
    return masks, below, out


def check_case(world, kw, plugin, ops, ctl, res):
    masks, below, sampled_out = profiled(ops, ctl, kw)
    views = []                          # per plugin: per rank, what it received and its own counters
    for rank, r in enumerate(res):
        assert r["wrong"] == [0] * len(ops), (rank, r["wrong"])
        c = r["counters"]
        assert (c.get("ops_below_min_bytes", 0), c.get("ops_sampled_out", 0)) == (below, sampled_out), (rank, c)
        assert [p["name"] for p in r["plugins"]] == (["recorder", "slow_recorder"] if plugin == "both" else
                                                    ["slow_recorder" if plugin == "slow" else "recorder"])
        for k, v in c.items():          # drop_counters(): the rank's counters, the plugins' own summed
            if k.endswith("proxy_ctrl"):
                continue                # close's own drain poll is a ProxyCtrl event after drop_counters()
            own = k.startswith(("delivered_", "unrecorded_")) or k in PER_PLUGIN
            got = [p["final"].get(k, 0) for p in r["plugins"]]
            assert (sum(got) if own else max(got)) == v == (v if own else min(got)), (rank, k, v, got)
        for i, p in enumerate(r["plugins"]):
            assert p["finalized"]
            of = match_events(world, rank, ops, masks, p)
            check_accounting(rank, r, p, masks)
            check_nesting(rank, p, of)
            views[i:] = views[i:] or [[]]
            views[i].append(dict(p, of=of))
    for view in views:
        check_traffic(world, kw, view)
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


def check_accounting(rank, r, p, masks):
    """Every entry the engine wrote was delivered or counted lost. overrun, unpaired and undrained count ring
    entries (a KernelCh is two: start, stop); masked_out counts KernelCh events here (the plugins never drop
    KernelStep), which are stamped for KernelStep's sake when an op's mask has no KernelCh."""
    c = p["final"]
    assert {k: c.get(k, 0) for k in EVENT_LOSSES} == dict.fromkeys(EVENT_LOSSES, 0), (rank, c)
    assert c["masked_out"] == 0 or any(m & T.KERNEL_STEP and not m & T.KERNEL_CH for m in masks), (rank, c)
    lost = c["overrun"] + c["unpaired"] + c["unwritten"] + c.get("undrained", 0) + 2 * c["masked_out"]
    delivered = c.get("delivered_kernel_step", 0) + 2 * c.get("delivered_kernel_ch", 0)
    assert delivered + lost == r["written_steps"] + r["written_chs"], (rank, c, r["written_steps"], r["written_chs"])
    assert c["sampled_out"] == r["skipped"], (rank, c["sampled_out"], r["skipped"])
    assert len(p["steps"]) == c.get("delivered_kernel_step", 0), (rank, len(p["steps"]), c)
    assert len(p["chs"]) == c.get("delivered_kernel_ch", 0), (rank, len(p["chs"]), c)


def match_events(world, rank, ops, masks, p) -> dict:
    """The plugin's Coll/P2p events, in order, must be the profiled ops' (those whose mask has the type); returns
    event id -> (op index, its mask, its dtype)."""
    want = []
    for k, (op, m) in enumerate(zip(ops, masks)):
        if op[0] == "p2p":
            _, dtype, shifts, count, _ = op
            es = [x for d in shifts for x in (("Send", (rank + d) % world, count), ("Recv", (rank - d) % world, count))]
        elif op[1] == "all_to_all":
            dtype, es = op[2], [(f, j, op[4]) for j in range(world) for f in ("Send", "Recv")]
        else:
            root = op[5] if op[1] in ("broadcast", "reduce") else 0      # NCCL's descriptors: 0 when unused
            dtype, es = op[2], [(FUNC[op[1]], op[4], root)]
        if m & (T.COLL if op[0] == "coll" and op[1] != "all_to_all" else T.P2P):
            want += [(k, m, dtype, e) for e in es]
    evs = [o for o in p["ops"] if o["cat"] in ("COLL", "P2P")]
    got = [(o["func"], o["peer"], o["count"]) if o["cat"] == "P2P" else (o["func"], o["count"], o["root"])
           for o in evs]
    assert got == [w[-1] for w in want], (rank, got, want)
    return {o["id"]: w[:3] for o, w in zip(evs, want)}


def check_nesting(rank, r, of):
    ops = {o["id"]: o for o in r["ops"] if o["cat"] in ("COLL", "P2P")}
    for o in ops.values():
        assert o["stop_ns"] is not None and o["start_ns"] <= o["stop_ns"], (rank, o)
    spans: dict = {}
    for ch in r["chs"]:
        o = ops[int(ch["op"])]                          # a KernelCh's parent is a Coll/P2p of this rank
        assert of[o["id"]][1] & T.KERNEL_CH, (rank, o, of[o["id"]])
        assert o["start_ns"] <= ch["start_ns"] <= ch["stop_ns"] <= o["stop_ns"], (rank, o, ch)
        spans.setdefault((int(ch["op"]), int(ch["channel"])), []).append((int(ch["start_ns"]), int(ch["stop_ns"])))
    for s in r["steps"]:
        o = ops[int(s["op"])]
        mask = of[o["id"]][1]
        assert mask & T.KERNEL_STEP, (rank, o, mask)
        assert s["wait_ns"] <= s["ready_ns"] <= s["done_ns"], (rank, s)
        assert s["wait_clk"] <= s["ready_clk"] <= s["done_clk"], (rank, s)
        assert o["start_ns"] <= s["wait_ns"] and s["done_ns"] <= o["stop_ns"], (rank, o, s)
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


def check_traffic(world, kw, view):
    """With every slice kept and none lost, each op's KernelSteps move what its algorithm moves."""
    if kw["sample_rate"] != 1 or any(r["final"].get(k, 0) for r in view for k in LOSSES):
        return
    ring = Counter()                     # all_reduce: (op index, direction, bytes) -> bytes over all ranks
    for rank, r in enumerate(view):
        steps = r["steps"]
        p2p = Counter()        # (op, Send/Recv, peer, direction) -> bytes expected minus bytes got
        for o in (o for o in r["ops"] if o["cat"] in ("COLL", "P2P")):
            k, mask, dtype = r["of"][o["id"]]
            if not mask & T.KERNEL_STEP:
                continue
            mine = steps[steps["op"] == o["id"]]
            sent = int(mine["size"][mine["is_send"] == 1].sum())
            recv = int(mine["size"][mine["is_send"] == 0].sum())
            nbytes = o["count"] * ITEMSIZE[dtype]
            if o["cat"] == "P2P":    # parts of a group to one peer and direction may share their records (documented)
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
    for (k, _, nbytes), total in ring.items():        # a ring all_reduce moves 2 (n - 1) x its buffer each way
        assert total == 2 * (world - 1) * nbytes, (k, total, nbytes)


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
    if not any(r["final"].get(k, 0) for r in res for k in LOSSES):
        assert sends.keys() == recvs.keys(), (sorted(sends.keys() ^ recvs.keys())[:10])
    both = sends.keys() & recvs.keys()
    assert [k for k in both if recvs[k][0] < sends[k][0] or recvs[k][1] != sends[k][1]] == []


def _shm(key: str) -> list[str]:
    return glob.glob(f"/dev/shm/*{key}*")


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_random_profiled_runs_keep_every_invariant(pools, case):
    world, kw, plugin, ops, ctl = case
    key = f"fz{next(_KEYS)}{pools(world).job}"
    res = pools(world).run(run_case, key, kw, plugin, ops, ctl)
    assert _shm(key) == []
    check_case(world, kw, plugin, ops, ctl, res)


# ---- a faulty plugin beside a clean one: it refuses some Coll/P2p events, raises in some KernelStep batches and
# keeps only part of others; the host counts exactly what it lost against what the clean one got ----

FAULTY_MASK = int(T.COLL | T.P2P | T.KERNEL_STEP)     # KernelCh off: every per-plugin loss is a KernelStep record


def _faulty(case):
    world, kw, _, ops, ctl = case
    kw = dict(kw, profile_event_mask=FAULTY_MASK, plugin_max_failures=1_000_000)    # never disabled
    return world, kw, ops, [(None, True, None)] * len(ops)


def _rows(steps) -> Counter:
    return Counter(tuple(int(row[n]) for n in steps.dtype.names if n != "op") for row in steps)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases().map(_faulty))
def test_a_faulty_plugin_loses_exactly_what_is_counted(pools, case):
    world, kw, ops, ctl = case
    key = f"ff{next(_KEYS)}{pools(world).job}"
    res = pools(world).run(run_case, key, kw, "faulty", ops, ctl)
    assert _shm(key) == []
    masks = profiled(ops, ctl, kw)[0]
    view = []
    for rank, r in enumerate(res):
        assert r["wrong"] == [0] * len(ops), (rank, r["wrong"])
        clean, bad = r["plugins"]
        assert (clean["name"], bad["name"]) == ("recorder", "faulty")
        of = match_events(world, rank, ops, masks, clean)
        check_accounting(rank, r, clean, masks)
        check_nesting(rank, clean, of)
        view.append(dict(clean, of=of))
        # the faulty plugin: the clean one's Coll/P2p events but every 4th of those offered, each stopped once
        parents = [(o["func"], o["count"], o["peer"]) for o in clean["ops"] if o["cat"] in ("COLL", "P2P")]
        mine = [(o["func"], o["count"], o["peer"]) for o in bad["ops"] if o["cat"] in ("COLL", "P2P")]
        assert mine == [p for i, p in enumerate(parents) if i % 4 != 3], rank
        assert bad["refused"] == len(parents) // 4
        assert all(o["stop_ns"] is not None for o in bad["ops"] if o["cat"] in ("COLL", "P2P"))
        # what it kept it got from the engine (the clean plugin got the same), the rest is counted
        got, want = _rows(bad["steps"]), _rows(clean["steps"])
        assert not got - want, (rank, sorted(got - want)[:5])
        cf, cc = bad["final"], clean["final"]
        assert len(bad["steps"]) == cf.get("delivered_kernel_step", 0)
        assert cf["declined"] == bad["refused"], (rank, cf)      # a refused Coll/P2p is declined
        lost = cf["plugin_error"] + cf["pool_full"] + cf["parent_dropped"]       # a short batch: pool_full
        assert cf.get("delivered_kernel_step", 0) + lost == cc.get("delivered_kernel_step", 0), (rank, cf, cc)
    check_traffic(world, kw, view)
    check_causality(view)
