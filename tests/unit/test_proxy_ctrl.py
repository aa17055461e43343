"""ProxyCtrl: the drain's states (stamps/ctrl.py), transitions only, in a valid order, one check each when off;
the example plugin's spans of them."""
from __future__ import annotations

import json
import threading
import time

from slicetrace.analyze import check_trace
from slicetrace.analyze.perfetto import convert
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import State
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.sinks.chrome import ChromePlugin
from slicetrace.stamps import ctrl
from slicetrace.stamps.drain import Drain
from slicetrace.stamps.layout import RingWriter
from tests.unit.test_drain import Recorder, rings, write_op

IDLE, ACTIVE, SLEEP, WAKEUP, APPEND, APPEND_END = (ctrl.IDLE, ctrl.ACTIVE, ctrl.SLEEP, ctrl.WAKEUP, ctrl.APPEND,
                                                   ctrl.APPEND_END)


class CtrlRecorder(Recorder):
    """A consumer that also takes ProxyCtrl states, and counts how often the drain asked whether to."""

    def __init__(self, on=True):
        super().__init__()
        self.on, self.asked, self.states = on, 0, []
        self.lock = threading.Lock()

    def proxy_ctrl_on(self):
        self.asked += 1
        return self.on

    def proxy_ctrl(self, state, ts_ns, appended=0):
        with self.lock:
            self.states.append((state, ts_ns, appended))

    def names(self):
        with self.lock:
            return [s for s, _, _ in self.states]


def _in_time_order(states, polls_append=True):
    """Each span's end after its start, the states of the long-lived event and the Sleeps in time order; a poll
    that appended ops and delivered goes Active at its start, so its Append lies inside (polls_append: each
    Active came from such a poll)."""
    starts = {}
    for s, t, _ in states:
        if s in (SLEEP, APPEND):
            starts[s] = t
        elif s in (WAKEUP, APPEND_END):
            assert t >= starts.pop(SLEEP if s == WAKEUP else APPEND)
    main = [t for s, t, _ in states if s not in (APPEND, APPEND_END)]
    assert main == sorted(main)
    appends = [t for s, t, _ in states if s == APPEND]
    assert appends == sorted(appends)
    active = [t for s, t, _ in states if s == ACTIVE]
    assert all(t in appends for t in active) or not polls_append


def _submit(d, w, tag):
    """An op as the session submits it: expected (its records may appear from now), written, submitted."""
    d.expect(tag, channels=True)
    write_op(w, tag, 3)
    d.op_submitted(tag, lambda: True)


def test_state_numbers_are_nccls():
    """The drain may not import events.abi (layers): its copies of the numbers must be the ABI's."""
    assert (IDLE, ACTIVE, SLEEP, WAKEUP, APPEND, APPEND_END) == (
        State.PROXY_CTRL_IDLE, State.PROXY_CTRL_ACTIVE, State.PROXY_CTRL_SLEEP, State.PROXY_CTRL_WAKEUP,
        State.PROXY_CTRL_APPEND, State.PROXY_CTRL_APPEND_END)


def test_polls_say_append_then_active_and_idle_once_not_per_idle_poll():
    v, sink = rings(1), CtrlRecorder()
    d, w = Drain(v, sink), RingWriter(v, 0)
    _submit(d, w, 1)
    _submit(d, w, 2)
    d.poll_once()
    for _ in range(4):                  # nothing more: one Idle, however many polls find nothing
        d.poll_once()
    _submit(d, w, 3)
    d.poll_once()
    assert sink.names() == [APPEND, APPEND_END, ACTIVE, IDLE, APPEND, APPEND_END, ACTIVE]
    assert [a for s, _, a in sink.states if s == APPEND_END] == [2, 1]      # the ops each poll took
    _in_time_order(sink.states)
    assert sink.ended == [1, 2, 3] and not sink.drops


def test_off_costs_one_check_per_transition_and_says_nothing():
    v, sink = rings(1), CtrlRecorder(on=False)
    d, w = Drain(v, sink), RingWriter(v, 0)
    _submit(d, w, 1)
    d.poll_once()                       # Append and Active: one check each
    assert sink.asked == 2
    for _ in range(5):                  # Idle once, then idle polls ask nothing
        d.poll_once()
    assert sink.asked == 3
    _submit(d, w, 2)
    d.poll_once()
    assert sink.asked == 5 and sink.states == [] and sink.ended == [1, 2]


def test_a_poll_that_raised_does_not_make_the_next_append_recount_its_ops():
    """A plugin raising in end_op ends that poll early (its ops stay tracked): the next Append counts only the
    ops submitted since, as each op is appended once."""
    class Raising(CtrlRecorder):
        def __init__(self):
            super().__init__()
            self.fail = 1

        def end_op(self, tag, ts):
            if self.fail:
                self.fail -= 1
                raise RuntimeError("plugin failed")
            super().end_op(tag, ts)

    v, sink = rings(1), Raising()
    d, w = Drain(v, sink), RingWriter(v, 0)
    _submit(d, w, 1)
    _submit(d, w, 2)
    try:
        d.poll_once()
    except RuntimeError:
        pass
    else:
        raise AssertionError("the consumer's error did not reach the poller")
    _submit(d, w, 3)
    d.poll_once()
    assert [a for s, _, a in sink.states if s == APPEND_END] == [2, 1]
    assert sink.ended == [1, 2, 3]


def test_consumer_without_proxy_ctrl_is_left_alone():
    v, sink = rings(1), Recorder()
    d, w = Drain(v, sink), RingWriter(v, 0)
    _submit(d, w, 1)
    d.poll_once()
    d.poll_once()
    assert sink.ended == [1] and not sink.drops


def _wait_for(cond, what, timeout_s=60.0):
    """Poll cond() until it holds; a generous bound fails the test only when the drain thread is stuck."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"the drain thread never got to {what}"
        time.sleep(0.005)


def test_the_drain_thread_sleeps_with_no_op_and_wakes_for_one():
    v, sink = rings(1), CtrlRecorder()
    d, w = Drain(v, sink, interval_us=100), RingWriter(v, 0)
    d.start()
    try:
        _wait_for(lambda: SLEEP in sink.names(), "Sleep")
        _submit(d, w, 1)
        _wait_for(lambda: sink.names().count(SLEEP) == 2, "its second Sleep")
    finally:
        d.stop(30.0)
    assert d.error is None and not d.alive and sink.ended == [1]
    assert sink.names() == [IDLE, SLEEP, WAKEUP, APPEND, APPEND_END, ACTIVE, IDLE, SLEEP, WAKEUP]
    _in_time_order(sink.states, polls_append=False)     # the thread may poll between expect and the records


def _chrome_host(tmp_path, mask, **kw):
    p = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "t"), profile_event_mask=mask, **kw))
    comm = abi.CommInfo(4242, "t", 1, 2, 1)
    return EventHost([LoadedPlugin(p)], comm), str(tmp_path / "t_4242_1.json")


def _spans(path):
    with open(path) as f:
        return [(r["name"], r["ts"], r["dur"], r.get("args")) for r in json.load(f)
                if r.get("cat") == "PROXY" and r.get("ph") == "X" and r.get("tid") == 2]


def test_chrome_writes_a_span_per_state_that_nests_and_converts(tmp_path):
    host, path = _chrome_host(tmp_path, int(T.COLL | T.PROXY_CTRL))
    S = State
    for st, ts, n in ((S.PROXY_CTRL_ACTIVE, 1000, 0), (S.PROXY_CTRL_APPEND, 1500, 0),
                      (S.PROXY_CTRL_APPEND_END, 1700, 3), (S.PROXY_CTRL_IDLE, 2000, 0), (S.PROXY_CTRL_SLEEP, 2500, 0),
                      (S.PROXY_CTRL_WAKEUP, 4000, 0), (S.PROXY_CTRL_ACTIVE, 5000, 0)):
        host.proxy_ctrl(st, ts, n)
    host.close(ts_ns=9000)
    assert sorted(_spans(path), key=lambda s: s[1]) == [
        ("Active", 1.0, 1.0, None), ("Append", 1.5, 0.2, {"appended": 3}), ("Idle", 2.0, 3.0, None),
        ("Sleep", 2.5, 1.5, None), ("Active", 5.0, 4.0, None)]
    assert check_trace(path) == []
    assert convert([path], str(tmp_path / "t.pftrace"), partial=True)["slices"] == 5


def test_chrome_writes_the_spans_in_time_order_an_enclosing_one_first(tmp_path):
    """Spans were written as each ended (an Append before the Active around it, an Idle after the Sleep in it):
    Perfetto sorts them, but chrome://tracing's legacy importer and scripts read a file in its order. At one
    start, the longer (enclosing) span comes first."""
    host, path = _chrome_host(tmp_path, int(T.COLL | T.PROXY_CTRL))
    S = State
    for st, ts, n in ((S.PROXY_CTRL_ACTIVE, 1000, 0), (S.PROXY_CTRL_APPEND, 1000, 0),
                      (S.PROXY_CTRL_APPEND_END, 1200, 2), (S.PROXY_CTRL_IDLE, 2000, 0), (S.PROXY_CTRL_SLEEP, 2500, 0),
                      (S.PROXY_CTRL_WAKEUP, 4000, 0)):
        host.proxy_ctrl(st, ts, n)
    host.close(ts_ns=9000)
    assert _spans(path) == [("Active", 1.0, 1.0, None), ("Append", 1.0, 0.2, {"appended": 2}),
                            ("Idle", 2.0, 7.0, None), ("Sleep", 2.5, 1.5, None)]
    assert check_trace(path) == []


def test_chrome_keeps_the_last_pool_size_spans_and_none_without_the_bit(tmp_path):
    host, path = _chrome_host(tmp_path / "a", int(T.COLL | T.PROXY_CTRL), pool_sizes={"PROXY_CTRL": 3})
    for k in range(10):
        host.proxy_ctrl(State.PROXY_CTRL_APPEND, 1000 * k)
        host.proxy_ctrl(State.PROXY_CTRL_APPEND_END, 1000 * k + 10, k)
    host.close(ts_ns=20_000)
    assert [s[3]["appended"] for s in _spans(path)] == [7, 8, 9]
    host, path = _chrome_host(tmp_path / "b", int(T.COLL))
    host.proxy_ctrl(State.PROXY_CTRL_ACTIVE, 1000)
    host.close(ts_ns=2000)
    with open(path) as f:
        assert not [r for r in json.load(f) if r.get("cat") == "PROXY"]


def test_a_sleep_ends_at_its_wakeup_though_the_mask_lost_proxy_ctrl_in_between():
    """The Wakeup of a Sleep that was said goes to the host whatever the mask is by then (NCCL stops a started
    event through its handle): it left the Sleep open until the next Sleep or Append, or close."""
    from tests.unit.test_plugin import RecPlugin
    p = RecPlugin(mask=int(T.COLL | T.PROXY_CTRL))
    host = EventHost([LoadedPlugin(p)], abi.CommInfo(7, "t", 1, 2, 0))
    clock = iter(range(100, 10**6, 100)).__next__
    c, lock = ctrl.Ctrl(host, clock), threading.Lock()
    c.nap(lock, lambda: True)                           # Sleep at 100
    p.mask_obj.value = int(T.COLL)                      # ProxyCtrl off while the drain sleeps
    assert not host.proxy_ctrl_on()
    c.take_ops({1: "op"}, lock, False)                  # an op came: Wakeup at 200
    c.nap(lock, lambda: True)                           # off: no Sleep now, and so no Wakeup later
    c.take_ops({}, lock, True)
    host.close(ts_ns=10**7)
    sleep_h = p.starts(T.PROXY_CTRL)
    assert len(sleep_h) == 1 and sleep_h[0].ts_ns == 100
    assert [(s[2], s[3].ts_ns) for s in p.of("state")] == [(State.PROXY_CTRL_SLEEP, 100),
                                                           (State.PROXY_CTRL_WAKEUP, 200)]
    assert [s[2] for s in p.of("stop")] == [200]        # once, at its Wakeup (not at close)


def _counters(path):
    with open(path) as f:
        return next(r["args"] for r in json.load(f) if r.get("name") == "slicetrace_counters")


def test_chrome_counts_the_spans_its_ring_overwrote_and_those_it_wrote(tmp_path):
    """Every span made is in the file (plugin_written_PROXY_CTRL) or was overwritten by a newer one
    (plugin_overwritten_PROXY_CTRL, a loss the report lists): the ring dropped them uncounted."""
    host, path = _chrome_host(tmp_path, int(T.COLL | T.PROXY_CTRL), pool_sizes={"PROXY_CTRL": 3})
    host.proxy_ctrl(State.PROXY_CTRL_ACTIVE, 500)
    for k in range(10):
        host.proxy_ctrl(State.PROXY_CTRL_APPEND, 1000 * k + 600)
        host.proxy_ctrl(State.PROXY_CTRL_APPEND_END, 1000 * k + 610, k)
    host.proxy_ctrl(State.PROXY_CTRL_IDLE, 15_000)
    host.close(ts_ns=20_000)
    c = _counters(path)                      # 12 spans: 10 Appends, Active, Idle; the last 3 kept
    assert [s[0] for s in sorted(_spans(path), key=lambda s: s[1])] == ["Active", "Append", "Idle"]
    assert (c["plugin_written_PROXY_CTRL"], c["plugin_overwritten_PROXY_CTRL"]) == (3, 9)
    assert c["delivered_proxy_ctrl"] == 11   # events: the Idle/Active one and 10 Appends
    host, path = _chrome_host(tmp_path / "b", int(T.COLL | T.PROXY_CTRL))
    host.proxy_ctrl(State.PROXY_CTRL_ACTIVE, 500)
    host.close(ts_ns=900)
    c = _counters(path)
    assert (c["plugin_written_PROXY_CTRL"], c["plugin_overwritten_PROXY_CTRL"]) == (1, 0)


def test_the_threaded_drain_s_events_are_all_in_the_counters_record(tmp_path):
    """Stop's final poll (its Wakeup) and close's stops come before the counters record: it counts every ProxyCtrl
    event delivered (the Idle/Active one, each Sleep and Append), and each span made is in the file."""
    host, path = _chrome_host(tmp_path, int(T.COLL | T.PROXY_CTRL))
    v = rings(1)
    d, w = Drain(v, host, interval_us=100), RingWriter(v, 0)
    d.start()
    try:
        _wait_for(lambda: host.counters().get("delivered_proxy_ctrl", 0) >= 2, "Idle and Sleep")
        _submit(d, w, 1)                # an op the host never began: its records are counted no_parent
        _wait_for(lambda: host.counters().get("delivered_proxy_ctrl", 0) >= 4, "its Append and second Sleep")
    finally:
        d.stop(30.0)
    assert d.error is None and d.settled
    host.close()
    c, spans = _counters(path), [s[0] for s in _spans(path)]
    assert spans.count("Sleep") >= 2 and spans.count("Append") >= 1
    assert c["delivered_proxy_ctrl"] == spans.count("Sleep") + spans.count("Append") + 1
    assert (c["plugin_written_PROXY_CTRL"], c["plugin_overwritten_PROXY_CTRL"]) == (len(spans), 0)
