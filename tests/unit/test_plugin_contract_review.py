"""Plugin contract details from a review: a mask change applies from the next op (KernelCh and KernelStep of an
op already begun are delivered by its snapshot and written), v7-only fields stay hidden from older plugins,
API descriptors carry the caller's stream, and NCCL's parent rules and per-version states."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import slicetrace
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.abi import EventType as T
from slicetrace.events.abi import State
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.sinks.chrome import ChromePlugin
from slicetrace.stamps.layout import KIND_CHANNEL
from tests.helpers.plugins import NoopPlugin
from tests.unit.test_chrome import PerEvent
from tests.unit.test_host import chrec, coll_op, p2p_op, recs
from tests.unit.test_plugin import RecPlugin

COMM = abi.CommInfo(77, "t", 1, 4, 1)


class ChPerEvent(PerEvent):
    """The chrome plugin with its KernelStep batch calls but no kernel_ch_batch: KernelCh goes per record."""
    name = "ch-per-event"

    def __init__(self, inner):
        super().__init__(inner)
        self.kernel_step_batch, self.kernel_step_runs = inner.kernel_step_batch, inner.kernel_step_runs


def _trace(path, tag):
    return [e for e in json.load(open(f"{path}_{COMM.comm_hash}_{COMM.rank}.json")) if e.get("name") == tag]


def _mask_off_after_begin(tmp_path, wrap, mask, off, deliver):
    """An op begun with `mask`; the plugin then drops `off` from its live mask; `deliver(host)` hands records."""
    path = str(tmp_path / "t")
    p = ChromePlugin(Settings(profile_dump_file=path, profile_event_mask=int(mask)))
    h = EventHost([LoadedPlugin(wrap(p))], COMM)
    h.begin_op(coll_op())
    h._slots[0].lp._mask.value = int(mask) & ~int(off)      # as exampleProfilerStart would, mid-op
    deliver(h)
    c = h.counters()
    h.close()
    return c, path


@pytest.mark.parametrize("how", ["channel", "batch", "per-event"])
def test_kernel_ch_of_an_op_begun_before_a_mask_change_is_written(tmp_path, how):
    """NCCL snapshots the mask per task: KernelCh of an op enqueued while it was on is still emitted. Before, the
    example plugin dropped them by its live mask (all three paths) yet the host counted them delivered."""
    def deliver(h):
        if how == "batch":
            r = chrec(1)
            h.batch(r, [(1, KIND_CHANNEL, 0, 1)])
        else:
            h.channel(1, chrec(1))
    c, path = _mask_off_after_begin(tmp_path, ChPerEvent if how == "per-event" else (lambda p: p),
                                    T.COLL | T.KERNEL_CH, T.KERNEL_CH, deliver)
    assert c["delivered_kernel_ch"] == 1 and c["declined"] == 0
    kch = _trace(path, "KernelCh")
    assert [e["ph"] for e in kch] == ["b", "e"] and kch[0]["args"]["Channel"] == 0


def test_kernel_steps_of_an_op_begun_before_a_mask_change_are_written_on_both_paths(tmp_path):
    """Before: the batch path wrote 5 of 5, the per-event path 0 of 5, and both counted 5 delivered."""
    got = []
    for slow in (False, True):
        c, path = _mask_off_after_begin(tmp_path / str(slow), PerEvent if slow else (lambda p: p),
                                        T.COLL | T.KERNEL_STEP, T.KERNEL_STEP, lambda h: h.steps(1, recs(1, 5)))
        got.append((c["delivered_kernel_step"], len(_trace(path, "KernelStep"))))
    assert got == [(5, 5), (5, 5)]


class Unrecorded(NoopPlugin):
    """Native, declares unrecorded_handle, no kernel_ch_batch, and answers every KernelCh with that handle."""
    name = "unrec"

    def init(self, comm, mask):
        mask.value = int(T.COLL | T.KERNEL_CH)
        self.pt = object()
        return None

    def unrecorded_handle(self, ctx):
        return self.pt

    def start_event(self, ctx, descr):
        return self.pt if descr.type == T.KERNEL_CH else object()


def test_a_kernel_ch_answered_with_the_unrecorded_handle_counts_declined():
    """The handle means "not recorded": before, the per-record path counted such KernelCh delivered."""
    h = EventHost([LoadedPlugin(Unrecorded())], COMM)
    h.begin_op(coll_op(n_programs=2))
    h.channel(1, np.concatenate([chrec(1, 0), chrec(1, 1)]))
    c = h.counters()
    h.close()
    assert c.get("delivered_kernel_ch", 0) == 0 and c["declined"] == 2


def test_api_descriptors_carry_the_user_tag_from_v7_only():
    """user_tag is a v7 field; before, v5/v6 plugins saw it on CollApi and P2pApi (only Coll/P2p were cleared)."""
    got = {}
    for version in (5, 6, 7, 8):
        p = RecPlugin(version=version, mask=int(T.COLL_API | T.P2P_API))
        h = EventHost([LoadedPlugin(p)], COMM)
        for op in (coll_op(1), p2p_op(2)):
            op.user_tag = 1234
            h.begin_op(op)
        h.close()
        got[version] = [d.user_tag for d in p.starts(T.COLL_API) + p.starts(T.P2P_API)]
    assert got == {5: [0] * 3, 6: [0] * 3, 7: [1234] * 3, 8: [1234] * 3}


class StreamRecorder(NoopPlugin):
    """Records the stream of every CollApi, P2pApi and KernelLaunch descriptor."""
    name = "streamrec"
    seen: list = []

    def __init__(self, settings=None):
        pass

    def init(self, comm, mask):
        mask.value = int(T.COLL_API | T.P2P_API | T.KERNEL_LAUNCH)
        return None

    def start_event(self, ctx, descr):
        if isinstance(descr, (abi.CollApiDescr, abi.P2pApiDescr, abi.KernelLaunchDescr)):
            StreamRecorder.seen.append((type(descr).__name__, descr.stream))
        return object()


def test_api_and_kernel_launch_descriptors_carry_the_callers_stream():
    """Before, OpInfo was built with stream=None whatever stream the op was given."""
    StreamRecorder.seen = []
    s = object()                         # the null backend takes any stream object, as given
    c = slicetrace.init(backend="null", profiler_plugin="tests.unit.test_plugin_contract_review:StreamRecorder")
    try:
        c.all_reduce(np.ones(8, np.float32), stream=s)
        c.all_gather(np.ones(8, np.float32))
        c.flush_profiler()
    finally:
        c.close()
    assert StreamRecorder.seen == [("CollApiDescr", s), ("KernelLaunchDescr", s),
                                   ("CollApiDescr", None), ("KernelLaunchDescr", None)]


@pytest.mark.parametrize("child, parents", [
    (T.PROXY_STEP, T.PROXY_OP), (T.NET_PLUGIN, T.PROXY_OP | T.PROXY_STEP),
    (T.CE_SYNC, T.CE_COLL), (T.CE_BATCH, T.CE_COLL)])
def test_nccl_adds_proxy_and_ce_parents(child, parents):
    """NCCL: ProxyOp if ProxyOp|ProxyStep|NetPlugin, ProxyStep if ProxyStep|NetPlugin, CeColl if any Ce* bit."""
    e = abi.effective_mask(int(child))
    assert e & int(parents) == int(parents)


@pytest.mark.parametrize("version", [1, 2])
def test_v1_v2_plugins_are_not_shown_proxy_op_states(version):
    """NCCL's v1/v2 adapters, like v3's, forward only ProxyCtrl and ProxyStep states."""
    p = RecPlugin(version=version)
    lp = LoadedPlugin(p)
    lp.init(COMM, 0)
    for st in (State.PROXY_OP_SEND_POSTED, State.PROXY_OP_RECV_DONE, State.PROXY_STEP_SEND_WAIT,
               State.PROXY_CTRL_IDLE):
        lp.record_event_state(("h",), st, abi.StateArgs())
    assert [c[2] for c in p.of("state")] == [State.PROXY_STEP_SEND_WAIT, State.PROXY_CTRL_IDLE]


@settings(max_examples=30, deadline=None)
@given(chans=hs.lists(hs.integers(1, 3), min_size=1, max_size=6), programs=hs.lists(hs.integers(1, 3), min_size=6,
       max_size=6), seed=hs.integers(0, 2**16))
def test_a_polls_kernel_ch_runs_end_their_ops_as_one_call_per_run_does(tmp_path_factory, chans, programs, seed):
    """EventHost.batch's KernelCh runs (one row per run, the 1-channel case, or several) against channel() per run:
    the same Coll stop times (each op's latest KernelCh done), the same KernelCh records in the trace, the same
    counters, also where an op expects more KernelCh records than the poll brings."""
    rng = np.random.default_rng(seed)
    rows = [chrec(tag, channel=c, start=int(rng.integers(600, 900)), stop=int(rng.integers(1000, 9000)))
            for tag, k in enumerate(chans, 1) for c in range(k)]
    r = np.concatenate(rows)
    runs, a = [], 0
    for tag, k in enumerate(chans, 1):
        runs.append((tag, KIND_CHANNEL, a, a + k))
        a += k
    out = {}
    for how in ("batch", "channel"):
        path = str(tmp_path_factory.mktemp(how) / "t")
        h = EventHost([LoadedPlugin(ChromePlugin(Settings(profile_dump_file=path,
                                                          profile_event_mask=int(T.COLL | T.KERNEL_CH))))], COMM)
        for tag in range(1, len(chans) + 1):
            h.begin_op(coll_op(tag, n_programs=programs[tag - 1]))
        if how == "batch":
            h.batch(r, runs)
        else:
            for tag, _, x, y in runs:
                h.channel(tag, r[x:y])
        c = h.counters()
        h.close(ts_ns=99_999)
        out[how] = (c, _trace(path, "AllReduce"), _trace(path, "KernelCh"))
    assert out["batch"] == out["channel"]
