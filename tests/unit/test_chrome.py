"""sinks.chrome: the example plugin's trace file, pool recycling (PR #2316 Copilot bug, NCCL #1910), flushing."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slicetrace.analyze import check_trace
from slicetrace.analyze.records import read_records
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.abi import EventType as T
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver, drive
from slicetrace.sinks.chrome import DEFAULT_MASK, ChromePlugin
from slicetrace.sinks.chrome_text import CH_LINES, STEP_LINE, RowFormat, distinct, trace_pid
from tests.unit.test_host import chrec, coll_op, recs

COMM = abi.CommInfo(4242, "t", 1, 4, 1)
COLL_ARGS = {"SeqNum", "CommHash", "Rank", "Count", "Datatype", "Algorithm", "Protocol", "nChannels"}
P2P_ARGS = {"CommHash", "Rank", "Peer", "Count", "Datatype", "nChannels"}
KCH_ARGS = {"Channel", "StartGpuClk", "StopGpuClk"}
KS_ARGS = {"Channel", "IsSend", "Peer", "Step", "Size", "WaitGpuClk", "StartGpuClk", "StopGpuClk"}


class PerEvent:
    """The chrome plugin without kernel_step_batch: the host uses start/state/stop per KernelStep."""
    name, version = "per-event", 8

    def __init__(self, inner):
        self.inner = inner
        self.init, self.start_event, self.stop_event = inner.init, inner.start_event, inner.stop_event
        self.record_event_state, self.finalize = inner.record_event_state, inner.finalize
        self.report_counters = inner.report_counters


def make(tmp_path, slow=False, **kw):
    s = Settings(profile_dump_file=str(tmp_path / "sub" / "trace"), **kw)
    p = ChromePlugin(s)
    host = EventHost([LoadedPlugin(PerEvent(p) if slow else p)], COMM)
    return p, host, str(tmp_path / "sub" / f"trace_{COMM.comm_hash}_{COMM.rank}.json")


def load(path):
    with open(path) as f:
        return json.load(f)


def test_mask_defaults_to_coll_p2p_kernelch_kernelstep():
    m = abi.ActivationMask()
    ChromePlugin(Settings()).init(COMM, m)
    assert m.value == DEFAULT_MASK == 65606
    ChromePlugin(Settings(profile_event_mask=6)).init(COMM, m)
    assert m.value == 6


def run_synthetic(host, nops: int, nchannels: int, seed: int, batch: int) -> list:
    """Synthetic all_reduce and send_recv ops, begun and delivered in batches through `host`."""
    src = SyntheticSource(nranks=4, rank=1, nchannels=nchannels, loops=2, funcs=("all_reduce", "send_recv"),
                          seed=seed)
    ops = [src.next_op() for _ in range(nops)]
    for op in ops:
        op.info.mask = host.op_mask()
        host.begin_op(op.info)
        deliver(host, op, batch=batch)
    return ops


@pytest.fixture
def synthetic_trace(tmp_path):
    p, host, path = make(tmp_path)
    ops = run_synthetic(host, 6, 2, 3, 7)
    host.drop("overrun", 3)
    host.close()
    return path, load(path), ops


def test_trace_file_is_json_with_nccl_names_and_args(synthetic_trace):
    path, data, ops = synthetic_trace
    assert os.path.basename(path) == "trace_4242_1.json"
    by = lambda cat: [r for r in data if r.get("cat") == cat and r["ph"] == "b"]   # noqa: E731
    assert [r["name"] for r in by("COLL")] == ["AllReduce"] * 3
    assert {r["name"] for r in by("P2P")} == {"Send", "Recv"}
    assert all(COLL_ARGS <= set(r["args"]) for r in by("COLL"))
    assert all(P2P_ARGS <= set(r["args"]) for r in by("P2P"))
    kch = [r for r in by("GPU") if r["name"] == "KernelCh"]
    assert len(kch) == 3 * 2 + 3 * 4 and all(KCH_ARGS <= set(r["args"]) for r in kch)
    steps = [r for r in data if r.get("name") == "KernelStep"]
    assert len(steps) == sum(len(op.steps) for op in ops)
    assert all(r["ph"] == "X" and r["cat"] == "GPU" and KS_ARGS <= set(r["args"]) for r in steps)
    assert by("COLL")[0]["args"]["Datatype"] == "ncclFloat32" and by("COLL")[0]["args"]["CommHash"] == 4242
    assert check_trace(path) == []


def test_every_b_has_its_e_and_every_kernel_step_is_inside_its_op(synthetic_trace):
    _, data, _ = synthetic_trace
    b = {(r["cat"], r["id"]): r for r in data if r.get("ph") == "b"}
    e = {(r["cat"], r["id"]): r for r in data if r.get("ph") == "e"}
    assert b.keys() == e.keys() and len(b) == sum(r.get("ph") == "b" for r in data)
    assert all(e[k]["ts"] >= b[k]["ts"] and e[k]["name"] == b[k]["name"] for k in b)
    ops = {b[k]["id"]: (b[k]["ts"], e[k]["ts"]) for k in b if k[0] in ("COLL", "P2P")}
    steps = [r for r in data if r.get("name") == "KernelStep"]
    for r in steps:
        lo, hi = ops[r["args"]["ParentId"]]
        assert lo <= r["ts"] and r["ts"] + r["dur"] <= hi


def _kernel_chs(data):
    """KernelCh events as (parent's name and b ts, b ts, e ts, args without ids): comparable across files."""
    b = {(r["cat"], r["id"]): r for r in data if r.get("ph") == "b"}
    e = {(r["cat"], r["id"]): r for r in data if r.get("ph") == "e"}
    ops = {r["id"]: (r["name"], r["ts"]) for (cat, _), r in b.items() if cat in ("COLL", "P2P")}
    return sorted((ops[r["args"]["ParentId"]], r["ts"], e[k]["ts"],
                   tuple(sorted((a, v) for a, v in r["args"].items() if a != "ParentId")))
                  for k, r in b.items() if r["name"] == "KernelCh")


@pytest.mark.parametrize("pool", [4096, 3])
def test_kernel_ch_batch_writes_what_the_per_event_path_writes(tmp_path, pool):
    """kernel_ch_batch (whole events, formatted in blocks) == start/state/stop per KernelCh record."""
    out = []
    for slow in (False, True):
        _, host, path = make(tmp_path / str(slow), slow=slow, pool_sizes={"KERNEL_CH": pool})
        run_synthetic(host, 5, 3, 5, 4)
        host.close()
        assert check_trace(path) == []
        data = load(path)
        out.append((_kernel_chs(data), data[-1]["args"]["delivered_kernel_ch"]))
    assert out[0] == out[1] and len(out[0][0]) == out[0][1] > 20


def test_timestamps_are_host_ns_over_1000_exactly(synthetic_trace):
    _, data, ops = synthetic_trace
    steps = [r for r in data if r.get("name") == "KernelStep"]
    want = sorted(int(x) for op in ops for x in op.steps["wait_ns"])
    assert sorted(round(r["ts"] * 1000) for r in steps) == want
    assert all(r["dur"] >= 0 for r in steps)


def test_metadata_tracks_and_final_counters(synthetic_trace):
    _, data, _ = synthetic_trace
    meta = [r for r in data if r.get("ph") == "M"]
    pid = trace_pid(COMM.comm_hash, 1)                  # one process per rank and communicator
    assert {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "rank 1 (comm 4242)"}} in meta
    assert meta[0]["name"] == "slicetrace_comm" and meta[0]["args"]["Rank"] == 1
    names = {r["tid"]: r["args"]["name"] for r in meta if r["name"] == "thread_name"}
    assert {"ch 0 send->2", "ch 0 recv<-0", "ch 1 send->2", "ch 1 recv<-0"} <= set(names.values())
    steps = [r for r in data if r.get("name") == "KernelStep"]
    for r in steps:               # every KernelStep sits on the track named for its channel and direction
        a = r["args"]
        assert names[r["tid"]] == (f"ch {a['Channel']} send->{a['Peer']}" if a["IsSend"]
                                   else f"ch {a['Channel']} recv<-{a['Peer']}")
    tracks: dict = {}
    for r in steps:
        tracks.setdefault(r["tid"], []).append((r["ts"], r["ts"] + r["dur"]))
    for iv in tracks.values():    # slices of one track never overlap, so Perfetto nests nothing wrongly
        iv.sort()
        assert all(a[1] <= b[0] for a, b in zip(iv, iv[1:]))
    last = data[-1]
    assert last["name"] == "slicetrace_counters" and last["args"]["overrun"] == 3
    assert last["args"]["delivered_kernel_step"] == len(steps) and last["args"]["plugin_dropped_KERNEL_STEP"] == 0


def test_per_event_kernel_steps_far_beyond_the_pool_size_are_all_kept(tmp_path):
    # PR #2316's Copilot finding: a pool base that never advances drops everything after pool-size events.
    _, host, path = make(tmp_path, slow=True, pool_sizes={"KERNEL_STEP": 8})
    host.begin_op(coll_op())
    host.steps(1, recs(1, 800))                  # 100x the pool, each started and stopped in order
    host.channel(1, chrec(1, stop=10**6))
    host.close()
    data = load(path)
    assert len([r for r in data if r.get("name") == "KernelStep"]) == 800
    assert data[-1]["args"]["plugin_dropped_KERNEL_STEP"] == 0 and data[-1]["args"]["pool_full"] == 0


def test_only_kernel_steps_in_flight_beyond_the_pool_are_dropped_and_counted(tmp_path):
    p = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "t"), pool_sizes={"KERNEL_STEP": 8}))
    ctx = p.init(COMM, abi.ActivationMask())
    parent = p.start_event(ctx, abi.CollDescr(T.COLL, ts_ns=1))
    ks = lambda i: abi.KernelStepDescr(T.KERNEL_STEP, parent, 1, 100 + i, 0, True, 2, i, 64, 90 + i, 95 + i, 99 + i)  # noqa: E731
    handles = [p.start_event(ctx, ks(i)) for i in range(13)]
    assert sum(h is None for h in handles) == 5 and handles[8:] == [None] * 5
    for h in handles[:8]:
        p.stop_event(h, 200)
    again = [p.start_event(ctx, ks(i)) for i in range(8)]        # retired slots are reused
    assert None not in again
    for h in again:
        p.stop_event(h, 300)
    p.stop_event(parent, 400)
    p.finalize(ctx)
    data = load(str(tmp_path / "t_4242_1.json"))
    assert len([r for r in data if r.get("name") == "KernelStep"]) == 16
    assert data[-1]["args"]["plugin_dropped_KERNEL_STEP"] == 5


def test_coll_pool_recycles_over_many_ops_and_drops_only_in_flight(tmp_path):
    # NCCL #1910 shape: parents whose slots are never returned starve every later op.
    small = {"COLL": 2, "COLL_API": 2, "GROUP_API": 2, "GROUP": 2}
    _, host, path = make(tmp_path, pool_sizes=small)
    for tag in range(1, 201):                     # 100x the pool size, completed in order
        host.begin_op(coll_op(tag, ts=tag * 10_000))
        host.steps(tag, recs(tag, 2, t0=tag * 10_000 + 1000))
        host.channel(tag, chrec(tag, start=tag * 10_000 + 900, stop=tag * 10_000 + 5000))
    for tag in range(201, 204):                   # three in flight at once: the third has no slot
        host.begin_op(coll_op(tag, ts=tag * 10_000))
    host.steps(203, recs(203, 4, t0=203 * 10_000 + 1000))
    host.close(ts_ns=10**8)
    data = load(path)
    assert len([r for r in data if r.get("cat") == "COLL" and r["ph"] == "b"]) == 202
    c = data[-1]["args"]
    assert c["plugin_dropped_COLL"] == 1 and c["declined"] == 1 and c["parent_dropped"] == 4
    assert check_trace(path) == []


def test_completed_records_are_flushed_incrementally(tmp_path):
    _, host, path = make(tmp_path, pool_sizes={"KERNEL_STEP": 64, "COLL": 2})
    src = SyntheticSource(nranks=4, nchannels=2, loops=4, seed=1)
    fed = drive(host, src, 10)
    size_before = os.path.getsize(path)
    assert size_before > 100 * (fed - 64)         # all but the last (unflushed) pool were written already
    host.close()
    data = load(path)
    assert len([r for r in data if r.get("name") == "KernelStep"]) == fed
    assert len([r for r in data if r.get("cat") == "COLL" and r["ph"] == "e"]) == 10
    assert check_trace(path) == []


def test_api_events_are_written_only_when_in_the_mask(tmp_path):
    _, host, path = make(tmp_path)
    drive(host, SyntheticSource(seed=2), 2)
    host.close()
    assert {r.get("cat") for r in load(path)} >= {"COLL", "GPU"}
    assert not {r.get("cat") for r in load(path)} & {"COLL_API", "GROUP_API", "GROUP"}
    mask = int(T.COLL_API | T.GROUP_API | T.KERNEL_LAUNCH | T.KERNEL_STEP | T.COLL)
    _, host, path = make(tmp_path / "b", profile_event_mask=mask)
    drive(host, SyntheticSource(seed=2), 2)
    host.close()
    cats = {r.get("cat") for r in load(path)}
    assert {"COLL_API", "GROUP_API", "KERNEL_LAUNCH", "COLL"} <= cats and check_trace(path) == []


def test_no_dump_file_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = ChromePlugin(Settings())
    host = EventHost([LoadedPlugin(p)], COMM)
    drive(host, SyntheticSource(seed=1), 2)
    host.close()
    assert os.listdir(tmp_path) == []


def test_kernel_step_args_carry_the_device_clocks(tmp_path):
    _, host, path = make(tmp_path)
    host.begin_op(coll_op())
    r = recs(1, 3, channel=2, send=1, peer=3)
    host.steps(1, r)
    host.channel(1, chrec(1, channel=2, stop=9000))
    host.close()
    steps = sorted((x for x in load(path) if x.get("name") == "KernelStep"), key=lambda x: x["args"]["Step"])
    got = [(a["WaitGpuClk"], a["StartGpuClk"], a["StopGpuClk"], a["Step"], a["Size"], a["SeqNum"])
           for a in (x["args"] for x in steps)]
    assert got == [(int(w), int(rd), int(d), int(s), 4096, 3)
                   for w, rd, d, s in zip(r["wait"], r["ready"], r["done"], r["step"])]
    assert np.allclose([x["dur"] for x in steps], 0.05)


@pytest.mark.parametrize("mask", [DEFAULT_MASK, int(T.COLL | T.KERNEL_STEP), int(T.P2P | T.KERNEL_CH),
                                  int(T.GROUP | T.COLL | T.P2P)])
def test_begin_fast_path_matches_the_generic_one(tmp_path, monkeypatch, mask):
    """The bulk-skip begin path (no API/Group/KernelLaunch recorded) gives the same trace and counters as the
    generic one, which it replaces only when every skipped type would take the passthrough handle."""
    import slicetrace.events.emit as emit
    out = []
    for generic in (False, True):
        if generic:
            monkeypatch.setattr(emit, "_PARENTS", -1)     # no live mask passes: always the generic path
        _, host, path = make(tmp_path / str(generic), profile_event_mask=mask)
        run_synthetic(host, 6, 2, 11, 5)
        counters = host.counters()
        host.close()
        with open(path) as f:
            out.append((f.read(), counters))
    assert out[0] == out[1]


_VALUES = st.one_of(st.integers(0, 12), st.sampled_from([9, 10, 99, 999, 1000, 9999, 10000, 10001, 99999999,
                                                            100000000, 10**18 - 1, 10**18]), st.integers(0, 2**62))


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.lists(_VALUES, min_size=16, max_size=16), min_size=1, max_size=8), neg=st.booleans(),
       reps=st.sampled_from([1, 9, 64]))
def test_block_formatter_writes_the_same_json_as_one_percent_per_block(rows, neg, reps):
    """Blocks of 64 rows and more take the fast formatter (fewer use the % path itself): the drawn rows repeated
    reach it (hypothesis kept its lists short, and the fast path was never taken)."""
    cols = np.array(rows * reps, dtype=np.int64)
    cols[:, 3] %= 1000                      # the %03d fields hold ns % 1000
    cols[:, 5] %= 1000
    if neg:
        cols[0, 2] = -5                     # a negative value: the % path, byte for byte
    want = (STEP_LINE * len(cols)) % tuple(cols.ravel().tolist())
    got = bytes(RowFormat(STEP_LINE)(cols)).decode("ascii")
    if neg or len(cols) < 64:
        assert got == want
    parse = lambda text: [json.loads(line.rstrip(",")) for line in text.splitlines()]   # noqa: E731
    assert parse(got) == parse(want)
    assert len(got.splitlines()) == len(cols)


def test_block_formatter_folds_constant_columns_and_blanks_only_narrow_rows():
    """The fast formatter's own cases, against one % per block: columns of one value (written into the row
    template), a column whose rows mix widths (a 4-digit group blank in some rows only), a block that is not a
    whole number of 64-row groups (its column extremes), and a constant %03d field."""
    rng = np.random.default_rng(7)
    for n in (64, 100, 640, 1000):
        cols = rng.integers(0, 2**48, (n, 16))
        cols[:, 0] = 1835136600                     # pid: one value
        cols[:, 6] = 0                              # channel: one value, 0
        cols[:, 10] = 262144                        # size: one value
        cols[:, 3] = rng.integers(0, 1000, n)
        cols[:, 5] = 7                              # a constant %03d field
        cols[:, 9] = rng.choice([0, 5, 9999, 10000, 123456789], n)   # narrow and wide rows in one column
        cols[n - 1, 13] = 2**62                     # the widest value only in the last rows (past whole groups)
        want = (STEP_LINE * n) % tuple(cols.ravel().tolist())
        got = bytes(RowFormat(STEP_LINE)(cols)).decode("ascii")
        assert [json.loads(x.rstrip(",")) for x in got.splitlines()] == \
            [json.loads(x.rstrip(",")) for x in want.splitlines()]
        assert got.count("\n") == n and '"pid":1835136600,' in got and '"Channel":0,' in got


def test_block_formatter_writes_a_ts_as_one_field_with_the_bytes_of_two():
    """A "%d.%03d" pair whose columns both vary is written as one field (its digits, ".", 3 digits): the same bytes
    as the two fields apart, also where the us part mixes widths (blank groups) and where either column is
    constant (the pair is not joined)."""
    rng = np.random.default_rng(11)
    for line, pairs in ((STEP_LINE, ((2, 3), (4, 5))), (CH_LINES, ((2, 3), (10, 11)))):
        m = line.count("%")
        for n, const in ((64, None), (200, 0), (1000, 1)):
            cols = rng.integers(0, 2**40, (n, m))
            for hi, lo in pairs:
                cols[:, hi] = rng.choice([0, 7, 9999, 10000, 123456789, 2**40], n)
                cols[:, lo] = rng.integers(0, 1000, n)
            if const is not None:
                cols[:, pairs[1][const]] = 5
            joined, apart = RowFormat(line), RowFormat(line)
            apart.frac = [False] * len(apart.frac)
            got = bytes(joined(cols))
            assert got == bytes(apart(cols))
            want = (line * n) % tuple(cols.ravel().tolist())
            assert [json.loads(x.rstrip(",")) for x in got.decode().splitlines()] == \
                [json.loads(x.rstrip(",")) for x in want.splitlines()]


@settings(max_examples=40, deadline=None)
@given(v=st.lists(st.integers(-2**40, 2**40), max_size=60), few=st.booleans())
def test_distinct_gives_each_value_once(v, few):
    """The KernelStep tracks of a block: every value once, past the values it peels off one by one too."""
    a = np.array(v, np.int64) % 3 if few else np.array(v, np.int64)
    got = distinct(a)
    assert sorted(got) == np.unique(a).tolist()
    assert len(got) == len(set(got))


class StepsPerRun:
    """The chrome plugin without kernel_step_runs: the host hands it a poll's KernelSteps one run at a time."""
    name, version = "per-run", 8

    def __init__(self, inner):
        self.inner = inner
        for a in ("init", "start_event", "stop_event", "record_event_state", "finalize", "report_counters",
                  "kernel_step_batch", "kernel_ch_batch", "unrecorded_handle"):
            setattr(self, a, getattr(inner, a))


@pytest.mark.parametrize("nsteps", [5, 200])   # 200: a poll's batch is large, folded without a concat copy
def test_kernel_step_runs_writes_what_one_batch_per_op_writes(tmp_path, nsteps):
    from slicetrace.stamps.layout import KIND_CHANNEL, KIND_STEP
    out = []
    for per_run in (False, True):
        s = Settings(profile_dump_file=str(tmp_path / str(per_run) / "trace"))
        p = ChromePlugin(s)
        host = EventHost([LoadedPlugin(StepsPerRun(p) if per_run else p)], COMM)
        span = 100 * nsteps + 1000                      # ns per op (recs() spaces KernelSteps 100 ns apart)
        for poll in range(3):                           # 3 polls of 4 ops, nsteps KernelSteps each
            tags = range(4 * poll + 1, 4 * poll + 5)
            for t in tags:
                host.begin_op(coll_op(tag=t, ts=span * t - 100))
            allr = np.concatenate([recs(t, nsteps, t0=span * t) for t in tags]
                                  + [chrec(t, 0, span * t - 50, span * t + 100 * nsteps) for t in tags])
            runs = [(t, KIND_STEP, nsteps * k, nsteps * k + nsteps) for k, t in enumerate(tags)]
            runs += [(t, KIND_CHANNEL, 4 * nsteps + k, 4 * nsteps + 1 + k) for k, t in enumerate(tags)]
            host.batch(allr, runs)
        host.close()
        path = str(tmp_path / str(per_run) / f"trace_{COMM.comm_hash}_{COMM.rank}.json")
        assert check_trace(path) == []
        data = load(path)
        steps = sorted(json.dumps(r, sort_keys=True) for r in data if r.get("name") == "KernelStep")
        out.append((steps, data[-1]["args"]["delivered_kernel_step"]))
    assert out[0] == out[1] and len(out[0][0]) == out[0][1] == 12 * nsteps


@pytest.mark.parametrize("order", [(1, 2, 3, 9), (1, 9, 2, 3)])    # an unknown op's run after or between
def test_kernel_ch_runs_write_what_one_batch_per_op_writes(tmp_path, order):
    """A poll's KernelCh runs in one kernel_ch_runs call == kernel_ch_batch per run: the same KernelCh events under
    the same parents, each Coll stopped at its last KernelCh (two channels, split over two polls), a p2p group's
    records routed per part, and records of an unknown op counted."""
    from slicetrace.stamps.layout import KIND_CHANNEL
    from tests.unit.test_host import p2p_op
    out = []
    for per_run in (False, True):
        s = Settings(profile_dump_file=str(tmp_path / str(per_run) / "trace"))
        p = ChromePlugin(s)
        host = EventHost([LoadedPlugin(StepsPerRun(p) if per_run else p)], COMM)
        tags = [1, 2, 3]
        for t in tags:
            host.begin_op(coll_op(tag=t, n_programs=2, ts=1000 * t))
        host.begin_op(p2p_op(tag=4))
        for ch in (0, 1):                               # channel 0's records in one poll, channel 1's in the next
            rows = [chrec(t, ch, 1000 * t + 10, 1000 * t + 500 + 100 * ch) for t in order]   # 9: never begun
            if ch == 1:
                rows += [chrec(4, 0, 600, 700, send=1, peer=2), chrec(4, 1, 600, 800, send=0, peer=0)]
            allr = np.concatenate(rows)
            runs = [(t, KIND_CHANNEL, k, k + 1) for k, t in enumerate(order)]
            if ch == 1:
                runs.append((4, KIND_CHANNEL, 4, 6))
            host.batch(allr, runs)
        counts = host.counters()
        host.close()
        path = str(tmp_path / str(per_run) / f"trace_{COMM.comm_hash}_{COMM.rank}.json")
        assert check_trace(path) == []
        data = load(path)
        ends = {r["id"]: r["ts"] for r in data if r.get("cat") == "COLL" and r["ph"] == "e"}
        assert sorted(ends.values()) == [(1000 * t + 600) / 1000 for t in tags]
        out.append((_kernel_chs(data), counts["delivered_kernel_ch"], counts["no_parent"]))
    assert out[0] == out[1]
    assert len(out[0][0]) == out[0][1] == 8 and out[0][2] == 2


@pytest.mark.parametrize("p2p", [False, True])
def test_coll_and_p2p_records_from_templates_equal_the_general_path(tmp_path, p2p):
    """The Coll/P2p fast path writes what `pair` (json.dumps of the args) writes; a field the templates do not
    take (a count of None, a name that needs escaping) still gives valid records."""
    from slicetrace.sinks.chrome import _op_pair, _records
    from tests.unit.test_host import p2p_op
    p, host, path = make(tmp_path)
    host.begin_op(p2p_op(tag=1) if p2p else coll_op(tag=1, ts=1_234_567))
    ctx = host.plugins[0].ctx
    evs = [h for t in host._ops[1].tasks for h in t.handles]
    for ev in evs:
        fast = [json.loads(line.rstrip().rstrip(",")) for line in _op_pair(ev, 9_876_543)]
        slow = [json.loads(line.rstrip().rstrip(",")) for line in _records(ev, 9_876_543)]
        assert fast == slow and fast[0]["cat"] == ("P2P" if p2p else "COLL")
        ev.descr.func = 'odd "name"\n'
        ev.descr.count = None
        with pytest.raises(TypeError):
            _op_pair(ev, 9_876_543)
    host.close()
    data = load(path)
    problems = check_trace(path)        # valid JSON throughout; the analyzer flags only the null Count
    assert ctx.done and problems and all("'args.Count' must be an integer, not None" in p for p in problems)
    assert {r["name"] for r in data if r.get("cat") in ("COLL", "P2P")} == {'odd "name"\n'}
    assert all(r["args"]["Count"] is None for r in data if r.get("ph") == "b" and r.get("cat") in ("COLL", "P2P"))


def test_without_a_dump_file_kernel_steps_reuse_one_chunk_and_are_all_counted(monkeypatch, tmp_path):
    """No trace file: each filled chunk is counted and reused at once (one chunk's memory however long the run);
    with a file, chunks are kept up to the pool size and written then."""
    from slicetrace.sinks import chrome_store
    monkeypatch.setattr(chrome_store, "_CHUNK", 64)
    for dump in (None, str(tmp_path / "t")):
        p = ChromePlugin(Settings(profile_dump_file=dump, pool_sizes={"KERNEL_STEP": 1000}))
        host = EventHost([LoadedPlugin(p)], COMM)
        ctx = host.plugins[0].ctx
        host.begin_op(coll_op(n_programs=1))
        for k in range(10):
            host.steps(1, recs(1, 50, t0=1000 + 10_000 * k))     # 500 rows: 7 chunks of 64 and a part
        chunks = len(ctx.free) + (ctx.cur is not None) + len(ctx.full)
        if dump is None:
            assert chunks == 1 and ctx.written["KERNEL_STEP"] == 448 and ctx.stored == 52
        else:
            assert chunks == 8 and ctx.written["KERNEL_STEP"] == 0 and ctx.stored == 500
        host.channel(1, chrec(1, stop=10**6))
        host.close()
        assert p.counters(ctx)["plugin_written_KERNEL_STEP"] == 500
    data = load(f"{dump}_{COMM.comm_hash}_{COMM.rank}.json")
    assert len([r for r in data if r.get("name") == "KernelStep"]) == 500


@pytest.mark.parametrize("p2p", [False, True])
def test_coll_and_p2p_records_carry_their_api_parents_id_on_both_paths(tmp_path, p2p):
    """With the API events traced, a Coll/P2p event has a parent (its Coll API / P2p API event): the general path
    writes that parent's id as ParentId, as the templates do (without a parent both write -1)."""
    from slicetrace.sinks.chrome import _op_pair, _records
    from tests.unit.test_host import p2p_op
    p, host, path = make(tmp_path, profile_event_mask=DEFAULT_MASK | int(T.COLL_API | T.P2P_API))
    host.begin_op(p2p_op(tag=1) if p2p else coll_op(tag=1, ts=1_234_567))
    evs = [h for t in host._ops[1].tasks for h in t.handles]
    assert evs
    for ev in evs:
        fast = [json.loads(line.rstrip().rstrip(",")) for line in _op_pair(ev, 9_876_543)]
        slow = [json.loads(line.rstrip().rstrip(",")) for line in _records(ev, 9_876_543)]
        assert fast == slow and fast[0]["cat"] == ("P2P" if p2p else "COLL")
        assert fast[0]["args"]["ParentId"] == ev.descr.parent.ids[0] >= 0
    host.close()
    data = load(path)
    api = {r["id"] for r in data if r.get("cat") == ("P2P_API" if p2p else "COLL_API") and r["ph"] == "b"}
    ops = [r for r in data if r.get("cat") == ("P2P" if p2p else "COLL") and r["ph"] == "b"]
    assert len(ops) == len(evs) and all(r["args"]["ParentId"] in api for r in ops)


def test_a_file_cut_short_before_finalize_still_names_its_process_and_step_tracks(tmp_path):
    # A rank killed mid-run never reaches finalize: the names were written there only, so Perfetto showed
    # "Process 1499387314" with numbered threads for the ranks a user most needs to find.
    _, host, path = make(tmp_path, pool_sizes={"KERNEL_STEP": 64})
    drive(host, SyntheticSource(nranks=4, nchannels=2, loops=4, seed=1), 6)
    ctx = host.plugins[0].ctx
    ctx.close_writer()                  # what the writer had queued is on disk; no finalize (the rank "died")
    recs = read_records(path)
    meta = {(r["name"], r["tid"]): r["args"] for r in recs if r.get("ph") == "M"}
    assert meta[("process_name", 0)] == {"name": "rank 1 (comm 4242)"} and meta[("process_sort_index", 0)]
    assert meta[("thread_name", 1)] == {"name": "ops"} and meta[("thread_name", 2)] == {"name": "proxy"}
    step_tids = {r["tid"] for r in recs if r.get("name") == "KernelStep"}
    assert step_tids and all(("thread_name", t) in meta for t in step_tids)
    # each track is named once, before its first slice
    names = [r["tid"] for r in recs if r.get("name") == "thread_name"]
    assert len(names) == len(set(names))
    first = {}
    for i, r in enumerate(recs):
        first.setdefault((r.get("name"), r.get("tid")), i)
    assert all(first[("thread_name", t)] < first[("KernelStep", t)] for t in step_tids)


def test_losses_are_in_the_process_name_where_a_viewer_shows_them(tmp_path):
    # Perfetto reads process and thread names of the "M" records only: the slicetrace_counters record was invisible.
    _, host, path = make(tmp_path)
    drive(host, SyntheticSource(nranks=4, nchannels=2, loops=4, seed=1), 3)
    host.drop("overrun", 7)
    host.close()
    data = load(path)
    names = [r["args"]["name"] for r in data if r.get("name") == "process_name"]
    assert names[0] == "rank 1 (comm 4242)"
    assert names[-1] == "rank 1 (comm 4242) lost: overrun 7"        # the viewer keeps the last
    assert data[-1]["name"] == "slicetrace_counters" and data[-1]["args"]["overrun"] == 7
    assert check_trace(path) == []
    _, host, clean = make(tmp_path / "clean")
    drive(host, SyntheticSource(nranks=4, nchannels=2, loops=4, seed=1), 3)
    host.close()
    assert [r["args"]["name"] for r in load(clean) if r.get("name") == "process_name"] == ["rank 1 (comm 4242)"]


def test_lost_counters_are_the_nonzero_counters_that_count_a_loss():
    c = {"overrun": 3, "unpaired": 0, "delivered_kernel_step": 9, "unrecorded_group": 2, "plugin_written_COLL": 4,
         "clock_offset_ns": -5, "ops_sampled_out": 8, "sampled_out": 6, "masked_out": 1, "plugin_dropped_COLL": 2}
    assert abi.lost_counters(c) == {"overrun": 3, "plugin_dropped_COLL": 2}
    assert abi.process_label(2, 9, {"overrun": 1234}) == "rank 2 (comm 9) lost: overrun 1,234"
    assert abi.process_label(2, 9, {}) == "rank 2 (comm 9)"
