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
    asked: list[float] = []
    monkeypatch.setattr(waits.time, "sleep", asked.append)
    cursor = np.zeros(2, np.uint64)
    b, far = waits.Backoff(cursor), time.monotonic() + 60
    for _ in range(12):
        b.sleep(0, far)
    cursor[1] += 3                          # the drain thread moved on
    b.sleep(0, far)
    b.sleep(5, far)                         # this flush's own poll made progress
    assert asked[:8] == [20e-6 * 2 ** i for i in range(7)] + [0.002]
    assert max(asked) == waits.FLUSH_MAX_PAUSE_S == 0.002 and asked[-2:] == [20e-6, 20e-6]
