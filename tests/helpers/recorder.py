"""A profiler plugin that keeps every event it is given, for tests that check what a plugin receives.

`Recorder` takes KernelStep/KernelCh through the batch entry points; `SlowRecorder` has no batch methods, so the
host hands it every record through start_event/record_event_state/stop_event (the per-event path). Both ask for
settings.profile_event_mask (default Coll|P2p|KernelCh|KernelStep) and register themselves in RECORDERS by
(rank, name), so code in the rank process can read what was delivered after comm.flush_profiler().
"""
from __future__ import annotations

import numpy as np

from slicetrace.events.abi import (KERNEL_CH_DTYPE, KERNEL_STEP_DTYPE, CollDescr, EventType, KernelChDescr,
                                   KernelStepDescr, P2pDescr, State)

DEFAULT_MASK = int(EventType.COLL | EventType.P2P | EventType.KERNEL_CH | EventType.KERNEL_STEP)
RECORDERS: dict[tuple[int, str], "Recorder"] = {}
# KernelStep rows as the tests keep them: the plugin's row plus the id of the Coll/P2p it came under
STEP_DTYPE = np.dtype([("op", "<i8")] + [(n, KERNEL_STEP_DTYPE.fields[n][0]) for n in KERNEL_STEP_DTYPE.names])
CH_DTYPE = np.dtype([("op", "<i8")] + [(n, KERNEL_CH_DTYPE.fields[n][0]) for n in KERNEL_CH_DTYPE.names])


class _Ev:
    __slots__ = ("id", "descr", "stop_ns", "states", "row")

    def __init__(self, eid: int, descr):
        self.id, self.descr, self.stop_ns, self.states, self.row = eid, descr, None, [], None


class Recorder:
    version, name = 8, "recorder"

    def __init__(self, settings=None):
        m = getattr(settings, "profile_event_mask", None)
        self.ask = DEFAULT_MASK if m is None else int(m)
        self.events: list[_Ev] = []          # every event started, in order
        self.steps: list[np.ndarray] = []    # STEP_DTYPE blocks (batch path)
        self.chs: list[np.ndarray] = []      # CH_DTYPE blocks (batch path)
        self.counters: dict | None = None
        self.finalized = False

    def init(self, comm, mask):
        mask.value = self.ask
        self.mask = mask                     # the host reads it at every op: tests may change it
        RECORDERS[(comm.rank, self.name)] = self
        return self

    def start_event(self, ctx, descr):
        ev = _Ev(len(self.events), descr)
        self.events.append(ev)
        return ev

    def stop_event(self, handle, ts_ns):
        if handle.stop_ns is not None:
            raise AssertionError(f"event {handle.descr!r} stopped twice")
        handle.stop_ns = ts_ns

    def record_event_state(self, handle, state, args):
        handle.states.append((State(state), args.p_timer, args.ts_ns))

    def kernel_step_batch(self, ctx, parent, recs):
        self.steps.append(_tagged(STEP_DTYPE, parent, recs))
        return len(recs)

    def kernel_ch_batch(self, ctx, parent, recs):
        self.chs.append(_tagged(CH_DTYPE, parent, recs))
        return len(recs)

    def report_counters(self, ctx, counters):
        self.counters = dict(counters)

    def finalize(self, ctx):
        self.finalized = True

    # ---- what the test reads (in the rank process) ----
    def take(self) -> dict:
        """Ops (Coll/P2p), KernelCh and KernelStep rows delivered since the last take(), as plain data."""
        ops, steps, chs = [], list(self.steps), list(self.chs)
        for ev in self.events:
            d = ev.descr
            if isinstance(d, (CollDescr, P2pDescr)):
                ops.append(dict(id=ev.id, cat="COLL" if isinstance(d, CollDescr) else "P2P", func=d.func,
                                count=d.count, root=getattr(d, "root", -1), peer=getattr(d, "peer", -1),
                                seq=getattr(d, "seq_number", -1), start_ns=d.ts_ns, stop_ns=ev.stop_ns,
                                parent=_id(d.parent)))
            elif isinstance(d, KernelStepDescr):
                steps.append(_per_event_step(ev))
            elif isinstance(d, KernelChDescr):
                chs.append(_per_event_ch(ev))
            else:
                ops.append(dict(id=ev.id, cat=type(d).__name__, parent=_id(d.parent), start_ns=d.ts_ns,
                                stop_ns=ev.stop_ns))
        self.events, self.steps, self.chs = [], [], []
        return dict(refused=getattr(self, "refused", 0), ops=ops,
                    steps=np.concatenate(steps) if steps else np.zeros(0, STEP_DTYPE),
                    chs=np.concatenate(chs) if chs else np.zeros(0, CH_DTYPE))


class Faulty(Recorder):
    """Refuses every 4th Coll/P2p (start_event answers None), raises in every 3rd KernelStep batch and keeps
    only the first half of the batch after it: what the host must count, and nothing else lost."""
    name = "faulty"

    def __init__(self, settings=None):
        super().__init__(settings)
        self.parents = self.batches = self.refused = 0

    def start_event(self, ctx, descr):
        if isinstance(descr, (CollDescr, P2pDescr)):
            self.parents += 1
            if self.parents % 4 == 0:
                self.refused += 1
                return None
        return super().start_event(ctx, descr)

    def kernel_step_batch(self, ctx, parent, recs):
        self.batches += 1
        if self.batches % 3 == 0:
            raise RuntimeError("injected by the test")
        keep = (len(recs) + 1) // 2 if self.batches % 3 == 1 else len(recs)
        return super().kernel_step_batch(ctx, parent, recs[:keep])


class SlowRecorder(Recorder):
    """No batch entry points: every KernelStep and KernelCh comes as its own event."""
    kernel_step_batch = None
    kernel_ch_batch = None
    name = "slow_recorder"


def _id(handle) -> int:
    return -1 if handle is None else handle.id


def _tagged(dtype, parent, recs) -> np.ndarray:
    out = np.zeros(len(recs), dtype)
    out["op"] = _id(parent)
    for n in recs.dtype.names:
        out[n] = recs[n]
    return out


def _one_stop(ev: _Ev, state: State, what: str) -> int:
    """The clock of an event's one stop state; it must also have been stopped."""
    stops = [s for s in ev.states if s[0] == state]
    if len(stops) != 1 or ev.stop_ns is None:
        raise AssertionError(f"{what} {ev.descr!r}: states {ev.states}, stop {ev.stop_ns}")
    return stops[0][1]


def _per_event_step(ev: _Ev) -> np.ndarray:
    d = ev.descr
    _one_stop(ev, State.KERNEL_STEP_STOP, "KernelStep")
    row = np.zeros(1, STEP_DTYPE)
    off = d.ts_ns - d.wait                 # this path carries the host ns of the wait (ts_ns) and done (stop) only
    row[0] = (_id(d.parent), d.channel_id, d.is_send, d.peer, d.step, d.size, d.wait, d.ready, d.done,
              d.ts_ns, d.ready + off, ev.stop_ns)
    return row


def _per_event_ch(ev: _Ev) -> np.ndarray:
    d = ev.descr
    stop = _one_stop(ev, State.KERNEL_CH_STOP, "KernelCh")
    row = np.zeros(1, CH_DTYPE)
    row[0] = (_id(d.parent), d.channel_id, 0, -1, d.p_timer, stop, d.ts_ns, ev.stop_ns)
    return row
