"""Plugins that misbehave in ways a Python author easily does (a numpy mask, a batch method without return, one
plugin listed under two names, a callback stuck in the drain thread) must not break, stall or miscount the
user's operations; a mask limit keeps the parents NCCL's rule adds. In-process."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from slicetrace.config import Settings
from slicetrace.errors import PluginError
from slicetrace.events import host as host_mod
from slicetrace.events.abi import CommInfo, EventType, effective_mask, parse_mask
from slicetrace.events.host import EventHost
from slicetrace.events.loading import load_plugins
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, drive
from tests.unit.test_close_stuck import Stuck, _all_reduce, _gpu
from tests.unit.test_gpu_writer_session import GpuLike
from tests.unit.test_plugin import RecPlugin

T = EventType
COMM = CommInfo(1, "x", 1, 4, 0)


@pytest.mark.parametrize("value, want", [(np.uint64(int(T.COLL | T.KERNEL_STEP)), int(T.COLL | T.KERNEL_STEP)),
                                         (T.COLL | T.KERNEL_STEP, int(T.COLL | T.KERNEL_STEP)),
                                         (float(int(T.COLL)), 0), (None, 0), ("Coll", 0)])
def test_a_mask_that_is_not_an_int_never_raises_in_the_users_op(value, want):
    """Before, np.uint64 raised OverflowError and a float or None TypeError from op_mask(): the user's collective
    raised on that rank while its peers waited."""
    p = RecPlugin(mask=int(T.COLL))
    h = EventHost([LoadedPlugin(p)], COMM)
    p.mask_obj.value = value
    assert h.op_mask() == effective_mask(want)
    assert type(h.plugins[0].mask) is int
    assert drive(h, SyntheticSource(nchannels=2), 3) > 0      # ops go on, with or without events
    h.close()


def test_a_bad_mask_set_in_init_is_no_unload_and_a_failing_unrecorded_handle_is_finalized():
    """Before, either unloaded the plugin without finalize although its init had returned (its files open)."""
    bad = RecPlugin(name="strmask")
    bad.want = "Coll|KernelStep"
    failing = RecPlugin(name="uh")
    failing.unrecorded_handle = lambda ctx: 1 / 0
    h = EventHost([LoadedPlugin(bad), LoadedPlugin(failing)], COMM)
    assert [lp.name for lp in h.plugins] == ["strmask"] and h.plugins[0].mask == 0
    assert h.counters()["plugin_init_failed"] == 1
    assert [c[0] for c in failing.calls] == ["finalize"]
    h.close()
    assert bad.calls[-1][0] == "finalize"


class NoReturn(RecPlugin):
    """Keeps every KernelStep it is handed and forgets `return`."""

    def _batch(self, ctx, parent, recs):
        self.kept = getattr(self, "kept", 0) + len(recs)


def test_a_batch_method_without_return_keeps_its_records_and_is_not_disabled():
    """Before, every record counted plugin_error and the plugin was disabled after 16 polls (records lost)."""
    p = NoReturn(mask=int(T.KERNEL_STEP))
    h = EventHost([LoadedPlugin(p)], COMM)
    fed = drive(h, SyntheticSource(nchannels=2), 40)
    c = h.counters()
    assert c["delivered_kernel_step"] == p.kept == fed and c["plugin_error"] == 0 and h.disabled() == []
    h.close()


def test_one_plugin_listed_under_two_names_is_refused():
    """Before, the check compared the spec item with the plugin's name: two example plugins wrote one file."""
    with pytest.raises(PluginError, match="listed twice"):
        load_plugins("example,slicetrace.sinks.chrome:ChromePlugin", Settings())
    assert len(load_plugins("example,linkstats", Settings())) == 2


def test_a_mask_limit_keeps_the_parents_of_what_it_keeps(tmp_path, monkeypatch):
    """comm.profiling(True, mask='KernelStep'): before, the limit stripped Coll/P2p and the API events that
    KernelStep needs (every KernelStep then had no parent)."""
    s = _gpu(tmp_path, monkeypatch, GpuLike, [RecPlugin(mask=int(T.KERNEL_STEP))])
    try:
        s.mask_limit = parse_mask("KernelStep")
        m = s.op_mask_for(1 << 20)
        assert m & T.KERNEL_STEP and m & T.COLL and m & T.P2P and m & T.COLL_API
        s.mask_limit = parse_mask("Coll|KernelCh")         # a type left out stays off
        m = s.op_mask_for(1 << 20)
        assert m & T.COLL and not m & T.KERNEL_STEP
    finally:
        s.close()


def test_a_plugin_stuck_in_the_drain_thread_does_not_stall_the_users_ops(tmp_path, monkeypatch):
    """cuda's drain thread holds the event host while it calls a plugin; before, the user's next op waited on it
    without a bound (forever for a callback that never returns)."""
    monkeypatch.setattr(host_mod, "BEHIND_WAIT_S", 0.2, raising=False)
    p = Stuck()
    s = _gpu(tmp_path, monkeypatch, GpuLike, [p], timeout_s=5, clock_resync_s=0.05)     # a resync before each op
    _all_reduce(s, 1)
    assert s.drain.flush(10)
    p.block = True
    _all_reduce(s, 2)
    assert p.entered.wait(10)                   # the drain thread is inside the plugin, holding the host
    done: list = []
    th = threading.Thread(target=lambda: done.extend((_all_reduce(s, 3), time.sleep(0.1), _all_reduce(s, 4),
                                                      s.host.counters())), daemon=True)
    th.start()
    th.join(30)
    stalled = th.is_alive()
    p.release.set()
    th.join(30)
    assert not stalled, "the user's ops (or the counters) waited on a plugin callback"
    assert done[-1]["consumer_behind"] == 2 and "clock_offset_ns" in done[-1]
    assert s.host.counters()["consumer_behind"] == 2
    n_coll = sum(1 for c in p.calls if c[0] == "start" and c[1].type == T.COLL)
    assert s.drain.flush(10)
    _all_reduce(s, 5)                           # the plugin is back: ops are profiled again
    assert s.drain.flush(10)
    assert sum(1 for c in p.calls if c[0] == "start" and c[1].type == T.COLL) == n_coll + 1
    s.close()


def test_a_plugin_asking_for_types_its_version_lacks_is_told(caplog):
    """A copy of linkstats declaring version 7 asked for KernelStep, which v7 lacks: the bit was stripped without a
    word and the plugin wrote an empty table."""
    import logging
    p = RecPlugin(version=7, mask=int(T.KERNEL_STEP | T.COLL))
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        h = EventHost([LoadedPlugin(p)], COMM)
    assert h.plugins[0].mask == int(T.COLL)
    assert "(version 7) asked for KernelStep, which its version does not have (it needs version 8)" in caplog.text
    h.close()


@pytest.mark.parametrize("asked", [T.KERNEL_STEP | T.COLL, np.int64(int(T.KERNEL_STEP | T.COLL))])
def test_a_plugin_asking_for_kernel_step_as_an_event_type_or_numpy_int_is_told_too(caplog, asked):
    """The README's way to ask (`mask.value = EventType.COLL | EventType.KERNEL_STEP`) and a numpy int got the v7
    plugin no warning: only a plain int was checked."""
    import logging

    class P(RecPlugin):
        def init(self, comm, mask):
            mask.value = asked
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        h = EventHost([LoadedPlugin(P(version=7))], COMM)
    assert h.plugins[0].mask == int(T.COLL)
    assert "(version 7) asked for KernelStep, which its version does not have (it needs version 8)" in caplog.text
    h.close()
