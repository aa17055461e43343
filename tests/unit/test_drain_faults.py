"""The drain under faults: a poll that never returns, and a ring lapped beyond what has been fetched."""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import slicetrace.session as session_mod
from slicetrace.config import Settings
from slicetrace.errors import CommTimeoutError
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.rendezvous import DictStore
from slicetrace.stamps.drain import Drain
from slicetrace.stamps.layout import FLAG_SEND, KIND_STEP, RingWriter, provisional_word
from tests.unit.test_drain import Recorder, _entry, gpu_program, rings
from tests.unit.test_plugin import RecPlugin

SLACK_S = 2.0        # scheduling slack on a loaded machine; a hang is what these tests catch


def _within(limit_s, fn, *args):
    """fn(*args) in a helper thread; fails (instead of hanging the suite) if it does not return in limit_s."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"{fn.__name__} still blocked after {limit_s} s"
    return out[0], time.monotonic() - t0


class Blocking(Recorder):
    """A consumer whose steps() hangs (a stuck plugin) until the test releases it."""

    def __init__(self):
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def steps(self, tag, recs):
        self.entered.set()
        self.release.wait(60)
        super().steps(tag, recs)


def _blocked_drain():
    v = rings(1, 64)
    sink = Blocking()
    d = Drain(v, sink, interval_us=100)
    w = RingWriter(v, 0)
    s = w.start(KIND_STEP, 0, 1, 0, 64, 1, 1, 2)
    w.complete(s, KIND_STEP, 0, 1, 0, 64, 1, 3)
    d.op_submitted(1, lambda: True, v.header["reserved"].copy())
    return sink, d


def test_stop_and_flush_return_in_time_while_the_drain_thread_is_stuck_in_a_consumer():
    sink, d = _blocked_drain()
    d.start()
    try:
        assert sink.entered.wait(10)
        ok, _ = _within(0.3 + SLACK_S, d.flush, 0.3)       # the join is a hang guard only
        assert ok is False and not d.idle() and d.error is None and sink.ended == []    # not done, said so
        _within(0.5 + SLACK_S, d.stop, 0.5)
        assert isinstance(d.error, CommTimeoutError) and d.alive
        msg = str(d.error)
        assert "drain thread" in msg and "timeout_s=0.5" in msg and "steps (test_drain_faults.py" in msg
        assert sink.ended == [] and not sink.drops          # nothing settled behind the stuck thread's back
    finally:
        sink.release.set()
    d._thread.join(10)
    assert not d.alive and len(sink.step_calls) == 1      # the stuck call finished; the thread then ended
    d.stop(5.0)                                             # a later stop settles what is left
    assert sink.ended == [1] and isinstance(d.error, CommTimeoutError)


def test_stop_gives_up_on_a_flush_stuck_in_another_thread():
    """No drain thread (inline polling): the poller holding the lock is a caller's flush."""
    sink, d = _blocked_drain()
    flusher = threading.Thread(target=d.flush, args=(60,), daemon=True)
    flusher.start()
    try:
        assert sink.entered.wait(10)
        _within(0.3 + SLACK_S, d.stop, 0.3)
        assert isinstance(d.error, CommTimeoutError) and "another poller" in str(d.error) and not d.alive
    finally:
        sink.release.set()
    flusher.join(10)
    assert not flusher.is_alive() and sink.ended == [1]


def test_a_flush_waiting_for_an_op_that_never_completes_backs_off():
    """A dead peer: the op's KernelCh start and a step are read, a second step never completes, nor does the op.
    Before, flush polled every ~20 us for its whole timeout (15,831 done_fn calls in 2 s); now it backs off."""
    v, calls = rings(1, 64), []
    w, d = RingWriter(v, 0), Drain(v, Recorder())
    d.op_submitted(1, lambda: calls.append(1) is None and False)        # never done
    w.channel(False, 0, 1, 0, 100)
    s = w.start(KIND_STEP, FLAG_SEND, 1, 0, 64, 1, 110, 111)
    w.complete(s, KIND_STEP, FLAG_SEND, 1, 0, 64, 1, 120)
    w.start(KIND_STEP, FLAG_SEND, 1, 2, 64, 1, 130, 131)             # re-read at every poll: not progress
    ok, took = _within(0.5 + SLACK_S, d.flush, 0.5)
    assert ok is False and took >= 0.5 and not d.idle()
    assert len(calls) < 400, len(calls)         # ~250 at its 2 ms pauses; 2,000+ at 20 us


def test_a_flushs_pauses_double_from_20_us_to_2_ms_and_restart_on_progress(monkeypatch):
    """Pauses doubling to 16 ms made a flush return up to ~9 ms after its op completed (a cuda flush without a
    sync); they stop at 2 ms now, and start again at 20 us once a poll moves."""
    import time

    import numpy as np
    from slicetrace.stamps import waits
    import types
    asked: list[float] = []                 # waits' own clock stubbed: other threads keep the real time.sleep
    monkeypatch.setattr(waits, "time", types.SimpleNamespace(sleep=asked.append, monotonic=time.monotonic))
    cursor = np.zeros(2, np.uint64)
    b, far = waits.Backoff(cursor), time.monotonic() + 60
    for _ in range(12):
        b.sleep(0, far)
    cursor[1] += 3                          # the drain thread moved on
    b.sleep(0, far)
    b.sleep(5, far)                         # this flush's own poll made progress
    assert asked[:8] == [20e-6 * 2 ** i for i in range(7)] + [0.002]
    assert max(asked) == waits.FLUSH_MAX_PAUSE_S == 0.002 and asked[-2:] == [20e-6, 20e-6]


class QuickDrain(Drain):
    def stop(self, timeout_s=0.3):          # the session's 5 s, shortened
        super().stop(timeout_s)


def test_close_counts_the_kernelch_start_a_stuck_drain_holds_as_undrained(monkeypatch):
    """The drain thread read a program's KernelCh start and 3 steps, then a plugin hung in steps(); the stop
    record came after. stop and fence give up. Before, close counted only the stop (undrained 1): the held start
    was neither delivered nor counted, 4 of 5 records accounted for."""
    monkeypatch.setattr(session_mod, "load_plugins", lambda spec, s, source: [LoadedPlugin(RecPlugin())])
    s = session_mod.Session(Settings(backend="null", nchannels=1, profiler_plugin="rec", timeout_s=0.3), 0, 1,
                            DictStore({}), "held")
    v, sink = rings(1, 64), Blocking()
    w, s.drain = RingWriter(v, 0), QuickDrain(v, sink, interval_us=100)
    s._reserved = v.header["reserved"]
    s.drain.op_submitted(1, lambda: False)             # still running
    w.channel(False, 0, 1, 0, 100)
    for i in range(3):
        w.complete(w.start(KIND_STEP, FLAG_SEND, 1, i, 64, 1, 110, 111), KIND_STEP, FLAG_SEND, 1, i, 64, 1, 120)
    s.drain.start()
    try:
        assert sink.entered.wait(10)
        w.channel(True, 0, 1, 0, 200)
        assert len(s.drain._open) == 1 and int(v.header["reserved"][0]) == 5       # the start, held
        _within(0.3 + 0.3 + 1.0 + SLACK_S, s.close)        # flush, stop and fence give up
        assert s.undrained == 2                            # the stop in the ring and the start held
    finally:
        sink.release.set()
        s.drain._thread.join(10)
    assert not s.drain.alive and sum(len(r) for _, r in sink.step_calls) == 3   # 3 + 2 = 5: all accounted for


def _device(nch, slots=64):
    """Host rings the drain reads, 'device' rings the writer fills, and a fetch that copies and logs."""
    v, dev, sink, calls = rings(nch, slots), rings(nch, slots), Recorder(), []

    def fetch(lo, hi):
        calls.append((lo.tolist(), hi.tolist()))
        for c in range(nch):
            for s in range(int(lo[c]) + 1, int(hi[c]) + 1):
                i = s & (slots - 1)
                v.started[c][i], v.completed[c][i] = dev.started[c][i], dev.completed[c][i]

    return v, dev, sink, Drain(v, sink, fetch=fetch), calls


@pytest.mark.parametrize("nch", [1, 2])
def test_a_lap_beyond_the_fetched_range_is_counted_once_and_the_rest_delivered_once(nch):
    """cuda: op 1 (10 seqs per channel) completed; op 2, still queued, reserved 200 more seqs on channel 0 (the
    64-slot ring is lapped: seqs 1..146 are lost, op 1's among them) and 20 on channel 1. The loss is counted at
    the first poll, although nothing past it is fetched until op 2 completes, and never again."""
    v, dev, sink, d, calls = _device(nch)
    done = {1: True, 2: False}

    def submit(tag):                # the host reserved the op's seqs before its launch
        v.header["reserved"][:] = dev.header["reserved"]
        d.op_submitted(tag, lambda: done[tag], v.header["reserved"].copy())

    for c in range(nch):
        gpu_program(dev, 1, 8, ch=c)                    # op 1: seqs 1..10 on each channel
    submit(1)
    for s in range(11, 211):        # op 2, channel 0: 200 KernelSteps, in seq order as one warp writes them
        _entry(dev, 0, s, KIND_STEP, FLAG_SEND, 2, s, 64, 1, s, s, s, provisional_word(s, 2))
    dev.header["reserved"][0] = 210
    if nch == 2:
        gpu_program(dev, 2, 18, ch=1)                   # channel 1: seqs 11..30
    submit(2)
    for _ in range(4):
        d.poll_once()
        assert sink.drops == Counter(overrun=146)       # was 146, 292, 438, ...: the cursor stayed at 0
    assert d.cursor[0] == 146 and sink.ended == [1]
    assert [int(r["channel"]) for _, rs in sink.step_calls for r in rs] == [1] * 8 * (nch - 1)   # op 1, once
    done[2] = True
    for _ in range(3):
        d.poll_once()
    assert sink.drops == Counter(overrun=146) and sink.ended == [1, 2] and d.idle()
    assert calls[-1] == ([146, 10][:nch], [210, 30][:nch])       # fetching resumed past the lost range
    steps = [(int(r["channel"]), t, int(r["step"])) for t, rs in sink.step_calls for r in rs]
    want = [(0, 2, s) for s in range(147, 211)]                    # the last N seqs of channel 0
    if nch == 2:
        want += [(1, 1, 2 * i) for i in range(8)] + [(1, 2, 2 * i) for i in range(18)]
    assert sorted(steps) == sorted(want)                          # each delivered once
    chans = sorted((int(r["channel"]), t) for t, rs in sink.channels for r in rs)
    assert chans == [(1, 1), (1, 2)][:2 * (nch - 1)]              # channel 0's KernelCh (op 1) was lapped
    written = 210 + 30 * (nch - 1)
    assert len(steps) + 2 * len(chans) + sink.drops["overrun"] == written


def _program(op, nsl, stop=True):
    """A cpu ring program's staged words: KernelCh start, nsl KernelSteps, and the stop unless the program raised."""
    from slicetrace.backend.cpu.stamper import tail
    from slicetrace.stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP
    t = 1000 * op
    recs = [t, t, t, op, 0, tail(0, KIND_CHANNEL, 0)]
    for i in range(nsl):
        recs += [t + i, t + i, t + i + 1, op, i, 4096 | tail(1, KIND_STEP, FLAG_SEND)]
    if stop:
        recs += [t + 99, t + 99, t + 99, op, 0, tail(0, KIND_CHANNEL, FLAG_CH_STOP)]
    return recs


@pytest.mark.parametrize("failed_last", [False, True])
def test_an_op_that_failed_mid_program_does_not_hold_back_the_ops_after_it(failed_last):
    """A failed program publishes its KernelCh start but no stop. Before, that start stayed open for good: no later
    op could end, flush_profiler() ran out its timeout and close() waited 10 s. Now, once the failed op's exact
    range has been read (the session passes its snapshot like any op's), the start is counted unpaired."""
    from slicetrace.backend.cpu.stamper import FastRingWriter
    from slicetrace.stamps.layout import RingViews, ring_bytes
    v = RingViews(bytearray(ring_bytes(1, 64)), 1, 64)
    w = FastRingWriter(v, 0)
    sink = Recorder()
    d = Drain(v, sink, fetch=lambda lo, hi: w.publish())
    ops = [(1, False), (2, True)] + ([] if failed_last else [(3, False), (4, False)])
    for op, failed in ops:                       # as Session.run and CpuBackend.submit do it
        d.expect(op)
        w.stage(_program(op, 3, stop=not failed))
        w.publish()
        d.op_submitted(op, lambda: True, v.header["reserved"].copy())
        d.poll_once()
    assert d.flush(5.0)
    assert sink.ended == [op for op, _ in ops]
    assert dict(sink.drops) == {"unpaired": 1}
    assert sum(len(r) for _, r in sink.step_calls) == 3 * len(ops)
    d.stop()
