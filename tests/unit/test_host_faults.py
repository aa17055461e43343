"""events.host / events.plugin under faults: plugins raising mid-batch on the per-record path, masks changed
after the op's snapshot, p2p parts sharing some channels, plugins changing the counters they are handed."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import State
from slicetrace.events.host import OpInfo, TaskInfo
from slicetrace.events.plugin import LoadedPlugin, PartialDelivery
from slicetrace.plan.schedule import plan_p2p, split_p2p
from slicetrace.stamps.layout import KIND_CHANNEL, KIND_STEP
from tests.unit.test_host import CH, COMM, KS, chrec, coll_op, host_of, recs
from tests.unit.test_plugin import RecPlugin, _ks_recs

LOSS = ("masked_out", "pool_full", "parent_dropped", "no_parent", "plugin_error", "plugin_disabled", "declined")


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.CRITICAL, logger="slicetrace")      # the isolation logs are tested in test_host


class Flaky(RecPlugin):
    """A per-record plugin (no batch methods) whose record_event_state / stop_event / start_event raise for the
    events of type `etype` numbered in `bad_state` / `bad_stop` / `bad_start` (1-based, per type)."""

    def __init__(self, etype, bad_state=(), bad_stop=(), bad_start=(), **kw):
        super().__init__(batch=False, **kw)
        self.etype, self.bad = int(etype), {"state": set(bad_state), "stop": set(bad_stop), "start": set(bad_start)}
        self.seen = {"state": 0, "stop": 0, "start": 0}

    def _hit(self, what, etype):
        if int(etype) == self.etype:
            self.seen[what] += 1
            if self.seen[what] in self.bad[what] or "all" in self.bad[what]:
                raise RuntimeError(f"flaky {what}")

    def start_event(self, ctx, descr):
        self._hit("start", descr.type)
        return super().start_event(ctx, descr)

    def record_event_state(self, handle, state, args):
        self._hit("state", handle[2])
        super().record_event_state(handle, state, args)

    def stop_event(self, handle, ts_ns):
        self._hit("stop", handle[2])
        super().stop_event(handle, ts_ns)


def _handles(p, etype):
    """(started handles of etype, those stopped, index of each stop in p.calls); RecPlugin numbers handles
    in start order."""
    started = [("h", i + 1, d.type) for i, d in enumerate(p.starts()) if d.type == etype]
    stops = {c[1]: i for i, c in enumerate(p.calls) if c[0] == "stop"}
    return started, [h for h in started if h in stops], stops


def _accounted(c, kind):
    return c.get(f"delivered_{kind}", 0) + sum(c.get(k, 0) for k in LOSS)


# ---- 1: the per-record path when a plugin call raises ----

def test_slow_path_stops_a_started_event_whose_state_raised_and_offers_the_rest():
    p = Flaky(T.KERNEL_STEP, bad_state=(2,), mask=KS)
    lp = LoadedPlugin(p)
    lp.init(COMM, 0)
    with pytest.raises(PartialDelivery) as ei:
        lp.kernel_step_batch("parent", _ks_recs(5))
    e = ei.value
    assert (e.kept, e.failed, e.left, e.errors) == (4, 1, 0, 1) and isinstance(e.__cause__, RuntimeError)
    assert [c[0] for c in p.calls] == ["start", "state", "stop"] + ["start", "stop"] + ["start", "state", "stop"] * 3


def test_slow_path_a_raising_start_or_stop_fails_only_its_record():
    p = Flaky(T.KERNEL_STEP, bad_start=(1,), bad_stop=(2,), mask=KS)     # records 1 and 3 fail
    lp = LoadedPlugin(p)
    lp.init(COMM, 0)
    with pytest.raises(PartialDelivery) as ei:
        lp.kernel_step_batch("parent", _ks_recs(4))
    assert (ei.value.kept, ei.value.failed, ei.value.errors) == (2, 2, 2)
    assert len(p.starts(T.KERNEL_STEP)) == 3                   # every record but the first got a start


def test_host_counts_each_kernel_step_where_it_went_and_stops_it_before_its_parent():
    p = Flaky(T.KERNEL_STEP, bad_state=(2,), mask=KS)
    h = host_of(p)
    h.begin_op(coll_op(n_programs=1))
    h.steps(1, recs(1, 5))
    h.channel(1, chrec(1))
    started, stopped, at = _handles(p, T.KERNEL_STEP)
    coll = [c for c in p.calls if c[0] == "stop" and c[1][2] == T.COLL]
    assert len(started) == 5 and stopped == started and len(coll) == 1
    assert max(at[s] for s in stopped) < p.calls.index(coll[0])
    c = h.counters()
    assert (c["delivered_kernel_step"], c["plugin_error"], c["pool_full"]) == (4, 1, 0)
    assert h.plugin_stats()[0]["failures"] == 1 and not h.disabled()


def test_host_kernel_ch_whose_state_raised_is_stopped_and_the_coll_completes_at_the_last():
    p = Flaky(T.KERNEL_CH, bad_state=(1,), mask=CH)
    h = host_of(p)
    h.begin_op(coll_op(n_programs=2))
    h.channel(1, np.concatenate([chrec(1, 0, stop=4000), chrec(1, 1, stop=6000)]))
    started, stopped, at = _handles(p, T.KERNEL_CH)
    (coll,) = [c for c in p.calls if c[0] == "stop" and c[1][2] == T.COLL]
    assert len(started) == 2 and stopped == started and max(at[s] for s in stopped) < p.calls.index(coll)
    assert coll[2] == 6000
    c = h.counters()
    assert (c["delivered_kernel_ch"], c["plugin_error"], c["declined"], c["no_parent"]) == (1, 1, 0, 0)


def test_a_plugin_raising_on_every_record_is_offered_only_its_failure_budget_then_disabled():
    p = Flaky(T.KERNEL_STEP, bad_state=("all",), mask=KS)
    h = host_of(p, max_failures=3)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 10))
    started, stopped, _ = _handles(p, T.KERNEL_STEP)
    assert len(started) == 3 and stopped == started
    assert h.disabled() == [p.name] and h.plugin_stats()[0]["failures"] == 3
    c = h.counters()
    assert (c["plugin_error"], c["plugin_disabled"], c.get("delivered_kernel_step", 0)) == (3, 7, 0)
    assert _accounted(c, "kernel_step") == 10


def test_a_poll_through_the_per_run_path_loses_only_the_records_that_failed():
    """The plugin takes KernelSteps only: the two KernelCh (stamped for the ops' ends) are counted masked_out;
    before, they vanished uncounted."""
    p = Flaky(T.KERNEL_STEP, bad_state=(1,), mask=KS)
    h = host_of(p)
    for t in (1, 2):
        h.begin_op(coll_op(tag=t))
    allr = np.concatenate([recs(1, 3), recs(2, 3), chrec(1), chrec(2)])
    h.batch(allr, [(1, KIND_STEP, 0, 3), (2, KIND_STEP, 3, 6), (1, KIND_CHANNEL, 6, 7), (2, KIND_CHANNEL, 7, 8)])
    started, stopped, _ = _handles(p, T.KERNEL_STEP)
    assert len(started) == 6 and stopped == started
    c = h.counters()
    assert (c["delivered_kernel_step"], c["plugin_error"]) == (5, 1) and c["masked_out"] == 2     # the KernelCh
    assert _accounted(c, "kernel_step") == 6 + 2


def test_a_batch_plugin_raising_in_one_run_of_a_poll_loses_that_run_only():
    """kernel_step_batch per run (no kernel_step_runs): each run is its own call, as in the reference."""
    p = RecPlugin(mask=KS)
    calls = []

    def batch(ctx, parent, rows):
        calls.append(len(rows))
        if len(calls) == 1:
            raise RuntimeError("first run")
        return len(rows)
    p.kernel_step_batch = batch
    h = host_of(p)
    for t in (1, 2):
        h.begin_op(coll_op(tag=t))
    h.batch(np.concatenate([recs(1, 3), recs(2, 4)]), [(1, KIND_STEP, 0, 3), (2, KIND_STEP, 3, 7)])
    c = h.counters()
    assert calls == [3, 4] and (c["delivered_kernel_step"], c["plugin_error"]) == (4, 3)
    assert h.plugin_stats()[0]["failures"] == 1


# ---- 2: a plugin that drops KernelStep after the op's mask snapshot ----

@pytest.mark.parametrize("path", ["per_call", "batch"])
def test_kernel_steps_no_plugin_takes_are_counted_masked_out(path):
    p = RecPlugin(mask=KS | CH)
    h = host_of(p)
    snap = h.op_mask()                       # the session's snapshot, taken before the op's events are built
    p.mask_obj.value = CH                    # then the plugin turns KernelStep off
    h.begin_op(coll_op(mask=snap))
    if path == "per_call":
        h.steps(1, recs(1, 7))
        h.channel(1, chrec(1))
    else:
        h.batch(np.concatenate([recs(1, 7), chrec(1)]), [(1, KIND_STEP, 0, 7), (1, KIND_CHANNEL, 7, 8)])
    c = h.counters()
    assert c["masked_out"] == 7 and p.of("batch") == [] and c["delivered_kernel_ch"] == 1
    assert _accounted(c, "kernel_step") == 7


def test_kernel_steps_another_plugin_takes_are_not_masked_out():
    a, b = RecPlugin(mask=KS, name="a"), RecPlugin(mask=KS, name="b")
    h = host_of(a, b)
    snap = h.op_mask()
    a.mask_obj.value = 0
    h.begin_op(coll_op(mask=snap))
    h.steps(1, recs(1, 5))
    c = h.counters()
    assert c["masked_out"] == 0 and c["delivered_kernel_step"] == 5 and a.of("batch") == []


# ---- 3: p2p parts of one group to one peer that share some channels but not all ----

def _group(shape, nranks=2, rank=0, nchannels=4):
    """Tasks and programs of a send/recv group as api.Communicator builds them (real split and planner)."""
    pieces, nprog = split_p2p(shape, rank, nranks, 4, lambda nb: nchannels)
    plan = plan_p2p([q for q, _ in pieces], nranks, rank, 4, 1 << 19, 1 << 19, nchannels)
    chans = [set() for _ in shape]
    for prog in plan.programs:
        chans[pieces[prog.params["part"]][1]].add(prog.channel)
    tasks = [TaskInfo("Send" if snd else "Recv", peer, snd, cnt, "ncclFloat32", n_programs=n,
                      channels=tuple(sorted(ch))) for (peer, snd, cnt, _), n, ch in zip(shape, nprog, chans)]
    return tasks, plan.programs


def _program_recs(tag, prog, t0):
    """One program's records: its KernelSteps, then its KernelCh (done last)."""
    peer, snd = prog.params["peer"], int(prog.params["is_send"])
    ks = recs(tag, len(prog.prims), prog.channel, send=snd, peer=peer, t0=t0)
    return ks, chrec(tag, prog.channel, t0 - 50, t0 + 100 * len(prog.prims) + 50, send=snd, peer=peer)


def test_the_planner_gives_parts_of_one_peer_channels_that_overlap_in_part():
    tasks, _ = _group(((1, True, 1000, 0), (1, True, 1 << 19, 0)))     # 4 KB then 2 MiB (2 pieces)
    assert [(t.n_programs, t.channels) for t in tasks] == [(1, (0,)), (2, (0, 2))]


@pytest.mark.parametrize("path", ["per_call", "batch"])
def test_parts_sharing_some_channels_complete_together_at_their_last_kernel_ch(path):
    tasks, progs = _group(((1, True, 1000, 0), (1, True, 1 << 19, 0)))
    p = RecPlugin(mask=KS | CH)
    h = host_of(p)
    h.begin_op(OpInfo(1, "send_recv", tasks, ts_ns=500))
    order = sorted(progs, key=lambda q: -q.channel)            # the big part's channel-2 program ends first
    polls = [_program_recs(1, q, 10_000 * (k + 1)) for k, q in enumerate(order)]
    p2p_stops = lambda: [c for c in p.calls if c[0] == "stop" and c[1][2] == T.P2P]     # noqa: E731
    for k, (ks, kc) in enumerate(polls):
        if path == "per_call":
            h.steps(1, ks)
            h.channel(1, kc)
        else:
            h.batch(np.concatenate([ks, kc]), [(1, KIND_STEP, 0, len(ks)), (1, KIND_CHANNEL, len(ks), len(ks) + 1)])
        if k < len(polls) - 1:
            assert p2p_stops() == [], f"a part completed after {k + 1} of {len(polls)} KernelCh records"
    last = int(polls[-1][1]["done_ns"][0])
    assert sorted(c[2] for c in p2p_stops()) == [last, last]
    lead_h, lead = next((("h", i + 1, d.type), d) for i, d in enumerate(p.starts()) if d.type == T.P2P)
    assert lead.count == 1000                                  # the group's first part takes their records
    n_ks = sum(len(ks) for ks, _ in polls)
    assert {c[1] for c in p.of("batch")} == {lead_h} and sum(len(c[2]) for c in p.of("batch")) == n_ks
    assert {d.parent for d in p.starts(T.KERNEL_CH)} == {lead_h}
    h.end_op(1, 10**9)
    c = h.counters()
    assert (c["delivered_kernel_ch"], c["delivered_kernel_step"]) == (3, n_ks)
    assert (c["no_parent"], c["missing_kernel_ch"], c["plugin_error"]) == (0, 0, 0)


def test_a_part_on_channels_of_its_own_keeps_its_records_beside_mates():
    tasks = [TaskInfo("Send", 1, True, 10, n_programs=1, channels=(0,)),
             TaskInfo("Send", 1, True, 10, n_programs=2, channels=(0, 1)),
             TaskInfo("Send", 1, True, 10, n_programs=1, channels=(3,))]
    p = RecPlugin(mask=CH)
    h = host_of(p)
    h.begin_op(OpInfo(1, "send_recv", tasks, ts_ns=500))
    h.channel(1, chrec(1, 3, stop=2000, send=1, peer=1))          # the third part alone: it completes now
    assert [c[2] for c in p.calls if c[0] == "stop" and c[1][2] == T.P2P] == [2000]
    for ch, stop in ((1, 3000), (0, 4000), (0, 5000)):
        h.channel(1, chrec(1, ch, stop=stop, send=1, peer=1))
    assert [c[2] for c in p.calls if c[0] == "stop" and c[1][2] == T.P2P] == [2000, 5000, 5000]
    c = h.counters()
    assert c["delivered_kernel_ch"] == 4 and c["no_parent"] == 0


# ---- 4: report_counters ----

def _counters_of_one_op(a, b):
    """What plugins a and b were handed by report_counters after one collective of 3 KernelSteps, and the host."""
    h = host_of(a, b)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 3))
    h.close()
    (_, got_a), = a.of("counters")
    (_, got_b), = b.of("counters")
    return got_a, got_b, h


def test_each_plugin_gets_its_own_copy_of_the_counters():
    class Greedy(RecPlugin):
        def report_counters(self, ctx, counters):
            super().report_counters(ctx, counters)
            counters.clear()
            counters["mine"] = 1

    a, b = Greedy(mask=KS, name="a"), RecPlugin(mask=KS, name="b")
    got_a, got_b, h = _counters_of_one_op(a, b)
    assert got_b == got_a and got_b["delivered_kernel_step"] == 3 and "mine" not in got_b
    assert h.counters()["delivered_kernel_step"] == 6 and "mine" not in h.counters()


def test_each_plugin_reports_what_it_was_offered_and_kept_not_the_other_plugins():
    """With two plugins each trace said delivered_kernel_step = both plugins' sum (twice the records it held),
    and a record one plugin's pool dropped was a loss in the other's trace too."""
    a, b = RecPlugin(mask=KS | int(T.COLL), name="a"), RecPlugin(mask=KS, name="b", keep=1, none_for=int(T.COLL))
    got_a, got_b, h = _counters_of_one_op(a, b)
    assert (got_a["delivered_kernel_step"], got_a["pool_full"], got_a.get("delivered_coll")) == (3, 0, 1)
    assert (got_b["delivered_kernel_step"], got_b["pool_full"]) == (1, 2)
    assert (got_a["declined"], got_b["declined"], got_b.get("delivered_coll", 0)) == (0, 1, 0)  # b declined its Coll
    total = h.counters()
    assert (total["delivered_kernel_step"], total["pool_full"], total["delivered_coll"]) == (4, 2, 1)


def test_a_rank_wide_count_of_a_per_plugin_name_is_added_to_each_plugins_own():
    """A plugin's report put its own pool_full over the rank's (a drop counted by the host itself vanished)."""
    a, b = RecPlugin(mask=KS, name="a"), RecPlugin(mask=KS, name="b", keep=1)
    h = host_of(a, b)
    h.drop("pool_full", 5)
    h.begin_op(coll_op())
    h.steps(1, recs(1, 3))
    h.close()
    (_, got_a), = a.of("counters")
    (_, got_b), = b.of("counters")
    assert (got_a["pool_full"], got_b["pool_full"], h.counters()["pool_full"]) == (5, 7, 7)


def test_a_record_after_a_raising_start_still_gets_its_stop_state():
    p = Flaky(T.KERNEL_STEP, bad_start=(1,), mask=KS)
    lp = LoadedPlugin(p)
    lp.init(COMM, 0)
    with pytest.raises(PartialDelivery):
        lp.kernel_step_batch("parent", _ks_recs(2))
    (_, _, state, args), = p.of("state")
    assert state == State.KERNEL_STEP_STOP and args.p_timer == 301


def test_a_plugin_disabled_mid_run_still_gets_the_stop_of_every_event_it_started():
    """Before: once disabled, its started Coll events were never stopped (an example-style plugin, which writes
    at stop, lost them while delivered_coll counted them); finalize ran on open events."""
    p = Flaky(T.KERNEL_STEP, bad_state=("all",), mask=KS | CH | int(T.COLL))
    h = host_of(p, max_failures=2)
    for seq in range(3):                                       # disabled during op 0's steps
        h.begin_op(coll_op(tag=seq + 1, n_programs=1))
        h.steps(seq + 1, recs(seq + 1, 4))
        h.channel(seq + 1, chrec(seq + 1))
    assert h.disabled() == [p.name]
    started, stopped, _ = _handles(p, T.COLL)
    assert len(started) == 1 and stopped == started           # op 0's Coll: started before, stopped after
    c = h.counters()
    # op 0: 2 KernelSteps failed, 2 and its KernelCh not offered; ops 1-2: the disabled plugin misses each one's
    # GroupApi, CollApi, Group, Coll, 4 KernelSteps and KernelCh (9 events, counted, not masked_out)
    assert (c["delivered_coll"], c["plugin_error"], c["plugin_disabled"], c["masked_out"]) == (1, 2, 3 + 2 * 9, 0)


def test_an_interrupt_inside_a_plugin_start_leaves_no_event_open():
    """A Ctrl-C landing in a plugin's start_event during begin_op (the user catches it and goes on) left that op's
    GroupApi and Group started and never stopped, and no counter said so: the op is registered before its
    starts now (end_op or close ends what started) and the GroupApi stops whatever happens after it."""
    from slicetrace.events.abi import EventType as T
    from tests.unit.test_host import chrec, coll_op, host_of, recs
    from tests.unit.test_plugin import RecPlugin

    class Interrupted(RecPlugin):
        fire = False

        def start_event(self, ctx, d):
            if self.fire and d.type == T.COLL:
                self.fire = False
                raise KeyboardInterrupt
            return super().start_event(ctx, d)
    p = Interrupted(mask=int(T.GROUP_API | T.COLL | T.KERNEL_STEP))
    h = host_of(p)
    interrupted = []
    for tag in (1, 2, 3):
        p.fire = tag == 2
        try:
            h.begin_op(coll_op(tag))
        except KeyboardInterrupt:
            interrupted.append(tag)
            continue
        h.steps(tag, recs(tag, 3))
        h.channel(tag, chrec(tag))
        h.end_op(tag, 9999)
    h.close()
    assert interrupted == [2]
    stopped = {c[1][:2] for c in p.of("stop")}
    assert {("h", i) for i in range(1, p.n + 1)} - stopped == set()
    assert h.counters()["missing_kernel_ch"] == 1        # op 2 never ran: its expected KernelCh is counted
