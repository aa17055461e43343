"""events.host: parent emission, parent handles, completion, routing, drop counters, isolation, fan-out."""
from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from slicetrace.events import abi
from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import State
from slicetrace.events.abi import KERNEL_STEP_DTYPE
from slicetrace.events.host import EventHost, OpInfo, TaskInfo, to_kernel_steps
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.stamps.layout import FLAG_SEND, KIND_CHANNEL, KIND_STEP, PAIRED_DTYPE
from tests.unit.test_plugin import RecPlugin

COMM = abi.CommInfo(77, "t", 1, 4, 1)
KS = int(T.KERNEL_STEP)
CH = int(T.KERNEL_CH)


def host_of(*plugins, max_failures=16):
    return EventHost([LoadedPlugin(p) for p in plugins], COMM, max_failures)


def recs(tag, n, channel=0, kind=KIND_STEP, send=0, peer=2, t0=1000):
    r = np.zeros(n, PAIRED_DTYPE)
    r["op"], r["channel"], r["kind"], r["flags"], r["peer"] = tag, channel, kind, FLAG_SEND * send, peer
    r["step"], r["size"] = np.arange(n) * 2, 4096
    base = t0 + 100 * np.arange(n)
    r["wait_ns"], r["ready_ns"], r["done_ns"] = base, base + 10, base + 50
    r["wait"], r["ready"], r["done"] = base - 7, base + 3, base + 43
    return r


def chrec(tag, channel=0, start=900, stop=5000, send=0, peer=0):
    r = recs(tag, 1, channel, KIND_CHANNEL, send, peer)
    r["ready_ns"], r["done_ns"], r["ready"], r["done"] = start, stop, start - 7, stop - 7
    return r


def coll_op(tag=1, n_programs=1, mask=None, ts=500):
    return OpInfo(tag, "all_reduce", [TaskInfo("AllReduce", -1, False, 100, "ncclFloat32", 0, 1, 2, n_programs)],
                  seq_number=3, mask=mask, ts_ns=ts)


def p2p_op(tag=1, mask=None):
    return OpInfo(tag, "send_recv", [TaskInfo("Send", 2, True, 10, "ncclInt8", n_programs=1),
                                     TaskInfo("Recv", 0, False, 10, "ncclInt8", n_programs=1)], mask=mask, ts_ns=500)


def test_kernel_step_mask_emits_every_parent_with_handles_passed_down():
    p = RecPlugin(mask=KS)
    h = host_of(p)
    assert h.op_mask() == abi.effective_mask(KS)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 4))
    h.channel(1, chrec(1))
    types = [d.type for d in p.starts()]
    assert types == [T.GROUP_API, T.COLL_API, T.GROUP, T.COLL]       # no KernelCh: not asked for
    by_type = {d.type: d for d in p.starts()}
    assert by_type[T.GROUP_API].parent is None
    assert by_type[T.COLL_API].parent == ("h", 1, T.GROUP_API)
    coll = by_type[T.COLL]
    assert coll.parent == ("h", 2, T.COLL_API) and coll.parent_group == ("h", 3, T.GROUP)
    assert (coll.func, coll.seq_number, coll.count, coll.n_channels, coll.comm_hash, coll.ts_ns) == \
        ("AllReduce", 3, 100, 1, 77, 500)
    (_, parent, got), = p.of("batch")
    assert parent == ("h", 4, T.COLL) and len(got) == 4 and got.dtype == abi.KERNEL_STEP_DTYPE


def test_coll_completes_at_its_last_kernel_ch_not_at_end_op():
    p = RecPlugin(mask=CH | KS)
    h = host_of(p)
    h.begin_op(coll_op(n_programs=2))
    h.channel(1, chrec(1, 0, 900, 4000))
    coll = next(c[1] for c in p.of("start") if c[1].type == T.COLL)
    stops = lambda: [c for c in p.of("stop") if c[1][2] == T.COLL]   # noqa: E731
    assert stops() == []
    h.channel(1, chrec(1, 1, 950, 6000))
    assert [c[2] for c in stops()] == [6000]
    h.end_op(1, 9999)
    assert [c[2] for c in stops()] == [6000]
    kch = [c[1] for c in p.of("start") if c[1].type == T.KERNEL_CH]
    assert [(d.channel_id, d.p_timer, d.ts_ns, d.parent[2]) for d in kch] == [(0, 893, 900, T.COLL),
                                                                            (1, 943, 950, T.COLL)]
    states = [(c[2], c[3].p_timer, c[3].ts_ns) for c in p.of("state")]
    assert states == [(State.KERNEL_CH_STOP, 3993, 4000), (State.KERNEL_CH_STOP, 5993, 6000)]
    assert coll is not None and h.counters()["missing_kernel_ch"] == 0


def test_end_op_completes_open_tasks_and_counts_missing_kernel_ch():
    p = RecPlugin(mask=KS)
    h = host_of(p)
    h.begin_op(coll_op(n_programs=3))
    h.channel(1, chrec(1, 0, 900, 4000))
    h.end_op(1, 7000)
    assert [c[2] for c in p.of("stop") if c[1][2] == T.COLL] == [7000]
    assert h.counters()["missing_kernel_ch"] == 2
    h.steps(1, recs(1, 5))
    assert h.counters()["no_parent"] == 5


@pytest.mark.parametrize("mask,missing", [(int(T.COLL), 0), (int(T.KERNEL_CH), 3), (KS, 3)])
def test_missing_kernel_ch_counts_only_ops_that_stamp_channels(mask, missing):
    """Without KernelCh or KernelStep in an op's mask no KernelCh record is stamped: none is missing."""
    p = RecPlugin(mask=mask)
    h = host_of(p)
    h.begin_op(coll_op(n_programs=3))
    h.end_op(1, 7000)
    assert [c[2] for c in p.of("stop") if c[1][2] == T.COLL] == [7000]
    assert h.counters()["missing_kernel_ch"] == missing


def test_p2p_records_route_by_peer_and_direction():
    p = RecPlugin(mask=KS)
    h = host_of(p)
    h.begin_op(p2p_op())
    mixed = np.concatenate([recs(1, 3, send=1, peer=2), recs(1, 2, send=0, peer=0), recs(1, 4, send=1, peer=3)])
    h.steps(1, mixed)
    p2p = {d.func: d for d in p.starts(T.P2P)}
    assert p2p["Send"].peer == 2 and p2p["Recv"].peer == 0
    batches = {c[1]: c[2] for c in p.of("batch")}
    send_h = next(k for k in batches if len(batches[k]) == 3)
    assert set(batches[send_h]["is_send"]) == {1} and len(batches) == 2
    assert h.counters()["no_parent"] == 4           # peer 3 matches no task
    h.channel(1, chrec(1, send=1, peer=2, stop=8000))
    assert [c[2] for c in p.of("stop") if c[1][2] == T.P2P] == [8000]   # only the send part completed


def test_unknown_tags_and_masked_out_records_are_counted():
    p = RecPlugin(mask=CH | KS)
    h = host_of(p)
    h.steps(42, recs(42, 3))
    h.channel(42, chrec(42))
    h.begin_op(coll_op(mask=int(abi.effective_mask(CH))))    # op snapshot without KernelStep
    h.steps(1, recs(1, 6))
    c = h.counters()
    assert c["no_parent"] == 4 and c["masked_out"] == 6 and p.of("batch") == []


def _one_coll_counters(p) -> dict:
    """The host's counters after one collective of 7 KernelSteps and a KernelCh, delivered to plugin p."""
    h = host_of(p)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 7))
    h.channel(1, chrec(1))
    return h.counters()


def test_children_of_a_declined_parent_of_the_plugins_own_types_are_dropped_and_counted():
    """A Coll the plugin asked for and declined (a full pool, sampling): its children go too, counted, as NCCL's
    example plugin drops children whose parent it could not track."""
    p = RecPlugin(mask=int(T.COLL) | CH | KS, none_for=int(T.COLL))
    c = _one_coll_counters(p)
    assert c["parent_dropped"] == 7 + 1 and c["declined"] == 1
    assert p.of("batch") == [] and p.starts(T.KERNEL_CH) == []


def test_a_declined_parent_nccl_added_for_the_children_leaves_them_without_a_parent():
    """NCCL starts the children of an untracked (NULL) parent with parentObj NULL: a plugin that asks for KernelCh
    and KernelStep and returns None for the Coll NCCL added (as NCCL's Inspector does for what it does not
    record) still gets them. Before, every one was dropped as parent_dropped."""
    p = RecPlugin(mask=CH | KS, none_for=int(T.COLL))
    c = _one_coll_counters(p)
    assert c["parent_dropped"] == 0 and c["declined"] == 1 and c["delivered_kernel_step"] == 7
    assert [b[1] for b in p.of("batch")] == [None] and len(p.of("batch")[0][2]) == 7
    assert [d.parent for d in p.starts(T.KERNEL_CH)] == [None]
    p = RecPlugin(mask=CH | KS, none_for=int(T.COLL))      # the same through a drain poll's runs (EventHost.batch)
    h = host_of(p)
    h.begin_op(coll_op())
    h.batch(np.concatenate([recs(1, 7), chrec(1)]), [(1, KIND_STEP, 0, 7), (1, KIND_CHANNEL, 7, 8)])
    assert [b[1] for b in p.of("batch")] == [None] and h.counters()["delivered_kernel_step"] == 7


def test_pool_full_is_the_difference_between_records_and_kept():
    p = RecPlugin(mask=KS, keep=3)
    h = host_of(p)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 10))
    c = h.counters()
    assert c["pool_full"] == 7 and c["delivered_kernel_step"] == 3


def test_drain_reasons_are_counted_by_name():
    h = host_of(RecPlugin(mask=KS))
    for reason, n in (("overrun", 5), ("unpaired", 2), ("sampled_out", 9), ("consumer_behind", 1), ("overrun", 1)):
        h.drop(reason, n)
    c = h.counters()
    assert (c["overrun"], c["unpaired"], c["sampled_out"], c["consumer_behind"]) == (6, 2, 9, 1)


def test_a_raising_plugin_is_isolated_logged_once_and_disabled(caplog):
    bad, good = RecPlugin(mask=KS, raise_in="kernel_step_batch", name="bad"), RecPlugin(mask=KS, name="good")
    h = host_of(bad, good, max_failures=3)
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        for tag in range(1, 6):
            h.begin_op(coll_op(tag))
            h.steps(tag, recs(tag, 4))
            h.channel(tag, chrec(tag))
    c = h.counters()
    assert c["plugin_error"] == 3 * 4 and h.disabled() == ["bad"]
    assert c["delivered_kernel_step"] == 5 * 4 and len(good.of("batch")) == 5
    assert len([r for r in caplog.records if "raised in kernel_step_batch" in r.getMessage()]) == 1
    assert any("disabled after 3 exceptions" in r.getMessage() for r in caplog.records)
    assert h.op_mask() == abi.effective_mask(KS)           # only the good plugin's mask remains
    h.close()
    assert bad.of("finalize") and good.of("finalize")


def test_disabled_plugin_records_are_counted():
    bad = RecPlugin(mask=KS, raise_in="stop_event")
    h = host_of(bad, max_failures=2)
    h.begin_op(coll_op(1))                  # CollApi + GroupApi stops raise -> disabled
    h.steps(1, recs(1, 5))
    c = h.counters()
    assert h.disabled() == [bad.name] and c["plugin_disabled"] == 5 and c["plugin_error"] == 2


def test_init_failure_unloads_the_plugin():
    bad, good = RecPlugin(raise_in="init"), RecPlugin(mask=KS)
    h = host_of(bad, good)
    assert [lp.plugin for lp in h.plugins] == [good] and h.counters()["plugin_init_failed"] == 1


def test_fan_out_honours_each_plugins_mask():
    a, b = RecPlugin(mask=int(T.COLL), name="a"), RecPlugin(mask=KS | CH, name="b")
    h = host_of(a, b)
    assert h.op_mask() == abi.effective_mask(KS | CH)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 4))
    h.channel(1, chrec(1))
    assert a.of("batch") == [] and a.starts(T.KERNEL_CH) == [] and len(a.starts(T.COLL)) == 1
    assert len(b.of("batch")) == 1 and len(b.starts(T.KERNEL_CH)) == 1
    assert h.counters()["delivered_coll"] == 2


def test_each_op_snapshots_the_mask_at_begin_op():
    p = RecPlugin(mask=KS)
    h = host_of(p)
    h.begin_op(coll_op(1))
    p.mask_obj.value = int(T.COLL)          # plugin turns KernelStep off mid-op
    h.steps(1, recs(1, 2))
    h.begin_op(coll_op(2))
    h.steps(2, recs(2, 2))
    assert len(p.of("batch")) == 1 and h.counters()["masked_out"] == 2


@pytest.mark.parametrize("version", [4, 7])
def test_old_versions_through_the_host(version):
    p = RecPlugin(version=version, mask=int(abi.ALL_TYPES))
    h = host_of(p)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 3))
    h.channel(1, chrec(1))
    types = {d.type for d in p.starts()}
    assert T.KERNEL_STEP not in types and p.of("batch") == []
    if version == 4:
        assert types == {T.GROUP, T.COLL, T.KERNEL_CH}
        assert p.starts(T.COLL)[0].parent == ("h", 1, T.GROUP)
    else:
        assert T.COLL_API in types and p.starts(T.COLL)[0].parent[2] == T.COLL_API


def test_slow_path_through_the_host():
    p = RecPlugin(mask=KS, batch=False)
    h = host_of(p)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 3))
    assert len(p.starts(T.KERNEL_STEP)) == 3 and h.counters()["delivered_kernel_step"] == 3


def test_to_kernel_steps_converts_every_field_and_is_read_only():
    r = recs(1, 3, channel=5, send=1, peer=3)
    k = to_kernel_steps(r)
    assert list(k["channel"]) == [5] * 3 and list(k["is_send"]) == [1] * 3 and list(k["peer"]) == [3] * 3
    for a, b in (("step", "step"), ("size", "size"), ("wait_clk", "wait"), ("ready_clk", "ready"),
                 ("done_clk", "done"), ("wait_ns", "wait_ns"), ("ready_ns", "ready_ns"), ("done_ns", "done_ns")):
        assert (k[a] == r[b]).all(), a
    with pytest.raises(ValueError):
        k["step"][0] = 1
    assert k.dtype == KERNEL_STEP_DTYPE and np.shares_memory(k, r)       # a view of the drain's rows, no copy


def test_proxy_ctrl_states_and_close_is_idempotent():
    """NCCL's shapes: Idle/Active are states of one event that lasts to close; Sleep..Wakeup and
    Append..AppendEnd(appended) are events of their own."""
    p = RecPlugin(mask=int(T.PROXY_CTRL))
    h = host_of(p)
    S = State
    for st, ts, n in ((S.PROXY_CTRL_ACTIVE, 10, 0), (S.PROXY_CTRL_IDLE, 20, 0), (S.PROXY_CTRL_SLEEP, 30, 0),
                      (S.PROXY_CTRL_WAKEUP, 40, 0), (S.PROXY_CTRL_APPEND, 50, 0), (S.PROXY_CTRL_APPEND_END, 60, 3),
                      (S.PROXY_CTRL_ACTIVE, 70, 0)):
        h.proxy_ctrl(st, ts, n)
    long_h, sleep_h, append_h = [("h", k, T.PROXY_CTRL) for k in (1, 2, 3)]
    assert [d.ts_ns for d in p.starts(T.PROXY_CTRL)] == [10, 30, 50]
    assert [(c[1], c[2], c[3].ts_ns, c[3].appended_proxy_ops) for c in p.of("state")] == [
        (long_h, S.PROXY_CTRL_ACTIVE, 10, 0), (long_h, S.PROXY_CTRL_IDLE, 20, 0), (sleep_h, S.PROXY_CTRL_SLEEP, 30, 0),
        (sleep_h, S.PROXY_CTRL_WAKEUP, 40, 0), (append_h, S.PROXY_CTRL_APPEND, 50, 0),
        (append_h, S.PROXY_CTRL_APPEND_END, 60, 3), (long_h, S.PROXY_CTRL_ACTIVE, 70, 0)]
    assert [c[1:] for c in p.of("stop")] == [(sleep_h, 40), (append_h, 60)]
    h.drop("overrun", 4)
    h.close(ts_ns=99)
    h.close()
    assert [c[1:] for c in p.of("stop")][-1] == (long_h, 99)
    assert len(p.of("finalize")) == 1 and p.of("counters")[0][1]["overrun"] == 4


def test_proxy_ctrl_follows_the_live_mask():
    """ProxyCtrl rereads the plugin's live mask per event (NCCL): off, nothing and proxy_ctrl_on() is False; an
    end whose start the plugin never got is not shown to it, one it got is, even if the mask changed since."""
    p = RecPlugin(mask=int(T.COLL))
    h = host_of(p)
    assert not h.proxy_ctrl_on()
    h.proxy_ctrl(State.PROXY_CTRL_SLEEP, 10)
    p.mask_obj.value = int(T.COLL | T.PROXY_CTRL)
    assert h.proxy_ctrl_on()
    h.proxy_ctrl(State.PROXY_CTRL_WAKEUP, 20)           # its Sleep came before the mask had ProxyCtrl
    h.proxy_ctrl(State.PROXY_CTRL_APPEND, 30)
    p.mask_obj.value = int(T.COLL)
    h.proxy_ctrl(State.PROXY_CTRL_APPEND_END, 40, 2)
    h.proxy_ctrl(State.PROXY_CTRL_IDLE, 50)
    assert [(c[2], c[3].ts_ns) for c in p.of("state")] == [(State.PROXY_CTRL_APPEND, 30),
                                                           (State.PROXY_CTRL_APPEND_END, 40)]
    assert len(p.starts(T.PROXY_CTRL)) == 1 and [c[2] for c in p.of("stop")] == [40]
    h.close()


def test_close_completes_open_ops():
    p = RecPlugin(mask=KS)
    h = host_of(p)
    h.begin_op(coll_op())
    h.close(ts_ns=12345)
    assert [c[2] for c in p.of("stop") if c[1][2] == T.COLL] == [12345]


def test_user_thread_and_drain_thread_concurrently():
    p = RecPlugin(mask=KS | CH)
    h = host_of(p)
    n_ops, started = 300, threading.Semaphore(0)

    def drain():
        for tag in range(1, n_ops + 1):
            started.acquire()
            h.steps(tag, recs(tag, 8))
            h.channel(tag, chrec(tag))
            h.end_op(tag, 10_000)
    t = threading.Thread(target=drain)
    t.start()
    for tag in range(1, n_ops + 1):
        h.begin_op(coll_op(tag))
        started.release()
    t.join(30)
    c = h.counters()
    assert not t.is_alive() and c["delivered_kernel_step"] == 8 * n_ops and c["delivered_coll"] == n_ops
    assert c["no_parent"] == 0 and c["missing_kernel_ch"] == 0


class RunsPlugin(RecPlugin):
    """RecPlugin that also takes a whole poll's KernelSteps in one kernel_step_runs call."""

    def kernel_step_runs(self, ctx, parents, recs, starts, stops):
        self.calls.append(("runs", list(parents), recs.copy(), list(starts), list(stops)))
        return sum(stops) - sum(starts)


def _poll(n_ops, per_op=3):
    """One poll's records as the drain hands them over: every op's KernelSteps, then every KernelCh."""
    steps = [recs(t, per_op, t0=1000 * t) for t in range(1, n_ops + 1)]
    chans = [chrec(t, 0, 1000 * t - 50, 1000 * t + 900) for t in range(1, n_ops + 1)]
    allr = np.concatenate(steps + chans)
    runs = [(t, KIND_STEP, (t - 1) * per_op, t * per_op) for t in range(1, n_ops + 1)]
    runs += [(t, KIND_CHANNEL, n_ops * per_op + t - 1, n_ops * per_op + t) for t in range(1, n_ops + 1)]
    return allr, runs


def test_a_poll_of_collectives_reaches_a_plugin_in_one_call_before_any_parent_stops():
    runs_p, plain_p = RunsPlugin(mask=CH | KS, name="runs"), RecPlugin(mask=CH | KS, name="plain")
    h = host_of(runs_p, plain_p)
    for t in range(1, 5):
        h.begin_op(coll_op(tag=t))
    allr, runs = _poll(4)
    h.batch(allr, runs)
    (call,) = runs_p.of("runs")
    _, parents, got, starts, stops = call
    colls = [c[1] for c in runs_p.of("start") if c[1].type == T.COLL]
    coll_handles = [c for c in (("h", i, T.COLL) for i in range(1, 40)) if c in parents]
    assert len(parents) == 4 and parents == coll_handles and len(colls) == 4
    assert (starts, stops) == ([0, 3, 6, 9], [3, 6, 9, 12]) and got.dtype == abi.KERNEL_STEP_DTYPE
    assert list(got["wait_ns"][:12]) == list(allr["wait_ns"][:12])
    # the reference path: one kernel_step_batch per op, same parents and rows
    batches = plain_p.of("batch")
    assert [len(b[2]) for b in batches] == [3, 3, 3, 3]
    assert all((b[2] == got[a:z]).all() for b, a, z in zip(batches, starts, stops))
    for p in (runs_p, plain_p):                          # every KernelStep went out before the first Coll stop
        kinds = [c[0] for c in p.calls if c[0] in ("runs", "batch") or (c[0] == "stop" and c[1][2] == T.COLL)]
        assert kinds.index("stop") > max(i for i, k in enumerate(kinds) if k != "stop")
        assert kinds.count("stop") == 4
    c = h.counters()
    assert c["delivered_kernel_step"] == 2 * 12 and c["delivered_coll"] == 2 * 4


def test_a_poll_mixing_p2p_masked_and_unknown_ops_counts_each_run_as_before():
    p = RunsPlugin(mask=CH | KS)
    h = host_of(p)
    h.begin_op(coll_op(tag=1))
    h.begin_op(p2p_op(tag=2))
    h.begin_op(coll_op(tag=3, mask=int(T.COLL)))          # no KernelStep for this op
    r1, r2s, r2r, r3, r9 = recs(1, 3), recs(2, 2, send=1, peer=2), recs(2, 1, peer=0), recs(3, 4), recs(9, 5)
    allr = np.concatenate([r1, r2s, r2r, r3, r9])
    h.batch(allr, [(1, KIND_STEP, 0, 3), (2, KIND_STEP, 3, 6), (3, KIND_STEP, 6, 10), (9, KIND_STEP, 10, 15)])
    (call,) = p.of("runs")                               # the collective whole, each p2p part under its P2p
    _, parents, got, starts, stops = call
    descr = {("h", i + 1, c[1].type): c[1] for i, c in enumerate(p.of("start"))}     # handle -> what it started
    assert (starts, stops) == ([0, 3, 5], [3, 5, 6]) and p.of("batch") == []
    assert [(descr[q].type, descr[q].func) for q in parents] == [(T.COLL, "AllReduce"), (T.P2P, "Send"),
                                                                 (T.P2P, "Recv")]
    assert (got["is_send"][3:5] == 1).all() and got["peer"][5] == 0
    c = h.counters()
    assert c["delivered_kernel_step"] == 6 and c["masked_out"] == 4 and c["no_parent"] == 5


def test_a_plugin_raising_in_kernel_step_runs_is_counted_and_isolated():
    bad = RunsPlugin(mask=KS, name="bad")
    bad.kernel_step_runs = lambda *a: 1 / 0
    good = RunsPlugin(mask=KS, name="good")
    h = host_of(bad, good)
    for t in (1, 2):
        h.begin_op(coll_op(tag=t))
    allr, runs = _poll(2)
    h.batch(allr, runs)
    assert len(good.of("runs")) == 1 and h.counters()["delivered_kernel_step"] == 6
    assert h.plugin_stats()[0]["failures"] == 1


def test_a_p2p_group_stops_at_its_last_task_end():
    """The Group of a send/recv stops when its last part's KernelCh arrived, at the latest of their done clocks."""
    p = RecPlugin(mask=CH)
    h = host_of(p)
    h.begin_op(p2p_op())
    h.channel(1, np.concatenate([chrec(1, send=1, peer=2, stop=8000), chrec(1, send=0, peer=0, stop=6000)]))
    stops = lambda etype: sorted(ts for _, handle, ts in p.of("stop") if handle[2] == etype)   # noqa: E731
    assert stops(T.GROUP) == [8000] and stops(T.P2P) == [6000, 8000]
    assert stops(T.GROUP_API) == [500]                   # API events stop once enqueued
    h.end_op(1, 9999)
    assert stops(T.GROUP) == [8000]                      # stopped once


def test_kernel_ch_of_a_disabled_plugin_is_counted_as_such_not_as_a_dropped_parent():
    bad = RecPlugin(mask=CH, raise_in="stop_event")
    h = host_of(bad, max_failures=2)
    h.begin_op(coll_op(1, n_programs=2))                 # CollApi + GroupApi stops raise -> disabled
    assert h.disabled() == [bad.name]
    h.channel(1, np.concatenate([chrec(1, 0), chrec(1, 1)]))
    c = h.counters()
    assert c["plugin_disabled"] == 2 and c["parent_dropped"] == 0 and c.get("delivered_kernel_ch", 0) == 0
    assert c["plugin_error"] == 2 + 2                    # and the Coll and Group stops, still called, raise
    assert bad.starts(T.KERNEL_CH) == []


def test_kernel_launch_is_a_child_of_the_group_api():
    p = RecPlugin(mask=int(T.KERNEL_LAUNCH))
    h = host_of(p)
    h.begin_op(coll_op())
    ga = [("h", i + 1, d.type) for i, d in enumerate(p.starts()) if d.type == T.GROUP_API]
    (kl,) = p.starts(T.KERNEL_LAUNCH)
    assert len(ga) == 1 and kl.parent == ga[0]
    p = RecPlugin(mask=int(T.KERNEL_LAUNCH) | int(T.GROUP_API), none_for=int(T.GROUP_API))
    h = host_of(p)
    h.begin_op(coll_op())                                # a declined GroupApi it asked for drops its KernelLaunch
    assert [d.type for d in p.starts()] == [T.GROUP_API]
    assert (h.counters()["declined"], h.counters()["parent_dropped"]) == (1, 1)
    p = RecPlugin(mask=int(T.KERNEL_LAUNCH), none_for=int(T.GROUP_API))
    h = host_of(p)
    h.begin_op(coll_op())                                # one NCCL added: the KernelLaunch comes, parent None
    assert [(d.type, d.parent) for d in p.starts() if d.type == T.KERNEL_LAUNCH] == [(T.KERNEL_LAUNCH, None)]
    assert (h.counters()["declined"], h.counters()["parent_dropped"]) == (1, 0)


def test_a_v4_plugin_declining_the_group_drops_its_coll():
    """v4 and older parent Coll/P2p by the Group: a declined Group drops the Coll, counted."""
    p = RecPlugin(version=4, mask=int(abi.ALL_TYPES), none_for=int(T.GROUP))
    h = host_of(p)
    h.begin_op(coll_op())
    assert [d.type for d in p.starts()] == [T.GROUP] and p.starts(T.COLL) == []
    c = h.counters()
    assert c["declined"] == 1 and c["parent_dropped"] == 1


def test_a_declined_parent_of_its_own_types_drops_the_whole_subtree_even_through_added_types():
    """CollApi asked for and declined: its Coll (a type NCCL added) is dropped with it, and so are the Coll's
    KernelCh and KernelSteps; the Coll's drop must not read as "declined by the plugin" (which would hand the
    grandchildren over with parent None)."""
    p = RecPlugin(mask=int(T.COLL_API) | CH | KS, none_for=int(T.COLL_API))
    c = _one_coll_counters(p)
    assert (c["declined"], c["parent_dropped"]) == (1, 1 + 1 + 7)
    assert p.of("batch") == [] and p.starts(T.KERNEL_CH) == [] and p.starts(T.COLL) == []
