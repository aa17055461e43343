"""The event host: activation masks, parent links, completion, drop accounting and fan-out to plugins.

Per op and plugin, the host snapshots the plugin's effective mask (parents included, limited to what the
plugin's version knows and to the op's mask) in `begin_op`, emits API/Group/Coll/P2p starts, then turns drained
records into KernelCh events and KernelStep batches. A Coll/P2p stops when its last KernelCh record arrived
(ts = that record's done_ns), or at `end_op`. Children of a None (dropped) parent handle are dropped and
counted. A plugin that raises never breaks communication: the error is logged once, counted, and the plugin
is disabled after `max_failures` exceptions.

Threads: begin_op runs on the user thread, channel/steps/end_op/drop/proxy_ctrl on the drain thread. One lock
serialises them, so plugins are called by one thread at a time.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np

from ..stamps.layout import FLAG_SEND
from .abi import (KERNEL_STEP_DTYPE, CollApiDescr, CollDescr, CommInfo, EventType, GroupApiDescr, GroupDescr,
                  KernelChDescr, KernelLaunchDescr, P2pApiDescr, P2pDescr, ProxyCtrlDescr, State, StateArgs,
                  effective_mask)
from .plugin import LoadedPlugin

log = logging.getLogger("slicetrace")
T = EventType
DROP_REASONS = ("overrun", "unpaired", "no_parent", "parent_dropped", "pool_full", "consumer_behind",
                "sampled_out", "plugin_error", "plugin_disabled", "masked_out", "declined", "missing_kernel_ch",
                "plugin_init_failed")
P2P_FUNCS = ("Send", "Recv")
_B = SimpleNamespace(**{t.name: int(t) for t in T})   # bits as ints: IntFlag arithmetic runs Python code
_OFF = object()          # event type not emitted to this plugin (not in its mask)
_DELIVERED = {t: f"delivered_{t.name.lower()}" for t in T}


@dataclass(slots=True)
class TaskInfo:
    """One Coll (the op's only task) or one p2p part (routed by (peer, is_send))."""
    func: str = "AllReduce"
    peer: int = -1
    is_send: bool = False
    count: int = 0
    datatype: str = "ncclFloat32"
    root: int = 0
    send_buff: int = 0
    recv_buff: int = 0
    n_programs: int = 1      # KernelCh records that complete this task (0: completes at end_op)


@dataclass(slots=True)
class OpInfo:
    tag: int
    func: str
    tasks: list[TaskInfo] = field(default_factory=list)
    seq_number: int = 0
    user_tag: int = 0
    mask: int | None = None  # snapshot of host.op_mask(); None = take it in begin_op
    ts_ns: int = 0
    n_warps: int = 1
    stream: Any = None
    group_depth: int = 1


class _Slot:
    __slots__ = ("lp", "failures", "disabled")

    def __init__(self, lp: LoadedPlugin):
        self.lp, self.failures, self.disabled = lp, 0, False


class _Task:
    __slots__ = ("info", "p2p", "key", "handles", "left", "last_done", "done")

    def __init__(self, info: TaskInfo, nslots: int):
        self.info = info
        self.p2p = info.func in P2P_FUNCS
        self.key = info.peer * 2 + int(bool(info.is_send))
        self.handles: list[Any] = [_OFF] * nslots
        self.left = info.n_programs
        self.last_done = 0
        self.done = False


class _Op:
    __slots__ = ("info", "pmasks", "tasks", "groups", "open")

    def __init__(self, info: OpInfo, pmasks: list[int]):
        self.info, self.pmasks = info, pmasks
        self.tasks = [_Task(t, len(pmasks)) for t in info.tasks]
        self.groups: list[Any] = [_OFF] * len(pmasks)
        self.open = len(self.tasks)


def to_kernel_steps(recs: np.ndarray) -> np.ndarray:
    """PAIRED_DTYPE KernelStep records -> abi.KERNEL_STEP_DTYPE (vectorised, one pass per field)."""
    out = np.empty(len(recs), KERNEL_STEP_DTYPE)
    out["channel"] = recs["channel"]
    out["is_send"] = recs["flags"] & FLAG_SEND
    for dst, src in (("peer", "peer"), ("step", "step"), ("size", "size"), ("wait_clk", "wait"),
                     ("ready_clk", "ready"), ("done_clk", "done"), ("wait_ns", "wait_ns"),
                     ("ready_ns", "ready_ns"), ("done_ns", "done_ns")):
        out[dst] = recs[src]
    out.flags.writeable = False          # shared by every plugin of the fan-out
    return out


class EventHost:
    def __init__(self, plugins: list[LoadedPlugin], comm: CommInfo, max_failures: int = 16):
        self.comm = comm
        self.max_failures = max(1, int(max_failures))
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._ops: dict[int, _Op] = {}
        self._proxy: list[Any] = []
        self._closed = False
        self._slots: list[_Slot] = []
        for lp in plugins:
            try:
                lp.init(comm, 0)
            except Exception:
                # NCCL unloads a plugin whose init fails; communication goes on without it.
                log.exception("slicetrace: profiler plugin %r failed in init and is unloaded", lp.name)
                self._counts["plugin_init_failed"] += 1
                continue
            self._slots.append(_Slot(lp))
        self._proxy = [_OFF] * len(self._slots)

    @property
    def plugins(self) -> list[LoadedPlugin]:
        return [s.lp for s in self._slots]

    def disabled(self) -> list[str]:
        return [s.lp.name for s in self._slots if s.disabled]

    # ---- masks ----
    def _pmask(self, s: _Slot) -> int:
        return 0 if s.disabled else effective_mask(s.lp.mask) & s.lp.known_types

    def op_mask(self) -> int:
        """Mask snapshot for a new op: union of the plugins' live masks, parents included."""
        m = 0
        for s in self._slots:
            m |= self._pmask(s)
        return m

    # ---- guarded plugin calls ----
    def _fail(self, s: _Slot, what: str, n: int) -> None:
        s.failures += 1
        self._counts["plugin_error"] += n
        if s.failures == 1:
            log.exception("slicetrace: profiler plugin %r raised in %s (logged once; %d failures disable it)",
                          s.lp.name, what, self.max_failures)
        if s.failures >= self.max_failures and not s.disabled:
            s.disabled = True
            log.warning("slicetrace: profiler plugin %r disabled after %d exceptions", s.lp.name, s.failures)

    def _start(self, i: int, descr: Any, parent: Any) -> Any:
        """Start one event for plugin i under `parent` (a handle, None = dropped parent, or _OFF = none)."""
        s = self._slots[i]
        if parent is None:
            self._counts["parent_dropped"] += 1
            return None
        if s.disabled:
            self._counts["plugin_disabled"] += 1
            return None
        descr.parent = None if parent is _OFF else parent
        try:
            h = s.lp.start_event(descr)
        except Exception:
            self._fail(s, "start_event", 1)
            return None
        if h is None:
            self._counts["declined"] += 1
        else:
            self._counts[_DELIVERED[descr.type]] = self._counts.get(_DELIVERED[descr.type], 0) + 1
        return h

    def _stop(self, i: int, h: Any, ts_ns: int) -> None:
        s = self._slots[i]
        if h is None or h is _OFF or s.disabled:
            return
        try:
            s.lp.stop_event(h, ts_ns)
        except Exception:
            self._fail(s, "stop_event", 1)

    def _state(self, i: int, h: Any, state: State, args: StateArgs) -> None:
        s = self._slots[i]
        if h is None or h is _OFF or s.disabled:
            return
        try:
            s.lp.record_event_state(h, state, args)
        except Exception:
            self._fail(s, "record_event_state", 1)

    # ---- ops ----
    def begin_op(self, info: OpInfo) -> None:
        with self._lock:
            if self._closed:
                return
            if info.mask is None:
                info.mask = self.op_mask()
            op = _Op(info, [self._pmask(s) & info.mask for s in self._slots])
            old = self._ops.pop(info.tag, None)
            if old is not None:           # a tag reused before its end_op: close the old op first
                self._finish(old, info.ts_ns)
            for i in range(len(self._slots)):
                if op.pmasks[i]:
                    self._emit_begin(i, op)
            self._ops[info.tag] = op

    def _emit_begin(self, i: int, op: _Op) -> None:
        pm, info, rank, ts = op.pmasks[i], op.info, self.comm.rank, op.info.ts_ns
        ga = _OFF
        if pm & _B.GROUP_API:
            ga = self._start(i, GroupApiDescr(T.GROUP_API, None, rank, ts, group_depth=info.group_depth), _OFF)
        apis: list[Any] = []
        for t in op.tasks:
            api = _OFF
            if t.p2p and pm & _B.P2P_API:
                api = self._start(i, P2pApiDescr(T.P2P_API, None, rank, ts, func=t.info.func, count=t.info.count,
                                                 datatype=t.info.datatype, stream=info.stream,
                                                 user_tag=info.user_tag), ga)
            elif not t.p2p and pm & _B.COLL_API:
                api = self._start(i, CollApiDescr(T.COLL_API, None, rank, ts, func=t.info.func, count=t.info.count,
                                                  datatype=t.info.datatype, root=t.info.root, stream=info.stream,
                                                  user_tag=info.user_tag), ga)
            apis.append(api)
            self._stop(i, api, ts)        # API events stop once enqueued (NCCL semantics)
        if pm & _B.KERNEL_LAUNCH:
            kl = self._start(i, KernelLaunchDescr(T.KERNEL_LAUNCH, None, rank, ts, stream=info.stream), ga)
            self._stop(i, kl, ts)
        grp = _OFF
        if pm & _B.GROUP:
            grp = self._start(i, GroupDescr(T.GROUP, None, rank, ts), _OFF)
        op.groups[i] = grp
        old_parenting = self._slots[i].lp.version <= 4
        for t, api in zip(op.tasks, apis):
            ti = t.info
            if t.p2p and pm & _B.P2P:
                d: Any = P2pDescr(T.P2P, None, rank, ts, func=ti.func, buff=ti.send_buff or ti.recv_buff,
                                  datatype=ti.datatype, count=ti.count, peer=ti.peer, n_channels=ti.n_programs,
                                  parent_group=None if grp is _OFF else grp, user_tag=info.user_tag,
                                  comm_hash=self.comm.comm_hash)
            elif not t.p2p and pm & _B.COLL:
                d = CollDescr(T.COLL, None, rank, ts, seq_number=info.seq_number, func=ti.func,
                              send_buff=ti.send_buff, recv_buff=ti.recv_buff, count=ti.count, root=ti.root,
                              datatype=ti.datatype, n_channels=ti.n_programs, n_warps=info.n_warps,
                              parent_group=None if grp is _OFF else grp, user_tag=info.user_tag,
                              comm_hash=self.comm.comm_hash)
            else:
                continue
            t.handles[i] = self._start(i, d, grp if old_parenting else api)
        if ga is not _OFF:
            self._stop(i, ga, ts)

    def _route(self, op: _Op, recs: np.ndarray) -> Iterator[tuple[_Task, np.ndarray]]:
        tasks = op.tasks
        if len(tasks) == 1 and not tasks[0].p2p:
            yield tasks[0], recs
            return
        key = recs["peer"].astype(np.int64) * 2 + (recs["flags"] & FLAG_SEND)
        matched = 0
        for t in tasks:
            sel = key == t.key
            n = int(sel.sum())
            if n:
                matched += n
                yield t, (recs if n == len(recs) else recs[sel])
        if matched < len(recs):
            self._counts["no_parent"] += len(recs) - matched

    def channel(self, tag: int, recs: np.ndarray) -> None:
        """KernelCh records (PAIRED_DTYPE, kind == KIND_CHANNEL) of op `tag`."""
        if not len(recs):
            return
        with self._lock:
            op = self._ops.get(tag)
            if op is None:
                self._counts["no_parent"] += len(recs)
                return
            rank = self.comm.rank
            for t, sub in self._route(op, recs):
                if t.done:
                    self._counts["no_parent"] += len(sub)
                    continue
                for i, pm in enumerate(op.pmasks):
                    if not pm & _B.KERNEL_CH:
                        continue
                    parent = t.handles[i]
                    for ch, ready, done, ready_ns, done_ns in zip(
                            sub["channel"].tolist(), sub["ready"].tolist(), sub["done"].tolist(),
                            sub["ready_ns"].tolist(), sub["done_ns"].tolist()):
                        h = self._start(i, KernelChDescr(T.KERNEL_CH, None, rank, ready_ns, ch, ready), parent)
                        self._state(i, h, State.KERNEL_CH_STOP, StateArgs(p_timer=done, ts_ns=done_ns))
                        self._stop(i, h, done_ns)
                t.last_done = max(t.last_done, int(sub["done_ns"].max()))
                t.left -= len(sub)
                if t.left <= 0 and t.info.n_programs > 0:
                    self._complete(op, t, t.last_done)
            if op.open == 0:
                self._finish(op, max(t.last_done for t in op.tasks))
                self._ops.pop(tag, None)

    def steps(self, tag: int, recs: np.ndarray) -> None:
        """KernelStep records (PAIRED_DTYPE, kind == KIND_STEP) of op `tag`, one batch per call."""
        n_all = len(recs)
        if not n_all:
            return
        with self._lock:
            op = self._ops.get(tag)
            if op is None:
                self._counts["no_parent"] += n_all
                return
            if not op.info.mask & _B.KERNEL_STEP:
                self._counts["masked_out"] += n_all
                return
            c = self._counts
            for t, sub in self._route(op, recs):
                n = len(sub)
                if t.done:
                    c["no_parent"] += n
                    continue
                ks = None
                for i, pm in enumerate(op.pmasks):
                    if not pm & _B.KERNEL_STEP:
                        continue
                    s, parent = self._slots[i], t.handles[i]
                    if parent is None or parent is _OFF:
                        c["parent_dropped"] += n
                        continue
                    if s.disabled:
                        c["plugin_disabled"] += n
                        continue
                    if ks is None:
                        ks = to_kernel_steps(sub)
                    try:
                        kept = min(max(int(s.lp.kernel_step_batch(parent, ks)), 0), n)
                    except Exception:
                        self._fail(s, "kernel_step_batch", n)
                        continue
                    c["delivered_kernel_step"] = c.get("delivered_kernel_step", 0) + kept
                    c["pool_full"] += n - kept

    def _complete(self, op: _Op, t: _Task, ts_ns: int) -> None:
        t.done = True
        op.open -= 1
        for i in range(len(self._slots)):
            self._stop(i, t.handles[i], ts_ns)

    def _finish(self, op: _Op, ts_ns: int) -> None:
        """Complete every open task of op (counting missing KernelCh records) and stop its Group."""
        for t in op.tasks:
            if not t.done:
                self._counts["missing_kernel_ch"] += max(t.left, 0)
                self._complete(op, t, max(ts_ns, t.last_done))
        for i in range(len(self._slots)):
            self._stop(i, op.groups[i], ts_ns)

    def end_op(self, tag: int, ts_ns: int) -> None:
        """Every record of op `tag` was delivered or counted lost; completes whatever is still open."""
        with self._lock:
            op = self._ops.pop(tag, None)
            if op is not None:
                self._finish(op, ts_ns)

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + int(n)

    def proxy_ctrl(self, state: State, ts_ns: int | None = None) -> None:
        """A drain-thread state (ProxyCtrl Idle/Active/Sleep/Wakeup) for plugins whose live mask has ProxyCtrl."""
        ts = time.monotonic_ns() if ts_ns is None else ts_ns
        with self._lock:
            if self._closed:
                return
            for i, s in enumerate(self._slots):
                if not self._pmask(s) & _B.PROXY_CTRL:
                    continue
                if self._proxy[i] is _OFF:
                    self._proxy[i] = self._start(i, ProxyCtrlDescr(T.PROXY_CTRL, None, self.comm.rank, ts), _OFF)
                self._state(i, self._proxy[i], State(state), StateArgs(ts_ns=ts))

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def plugin_stats(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"name": s.lp.name, "version": s.lp.version, "failures": s.failures, "disabled": s.disabled}
                    for s in self._slots]

    def close(self, ts_ns: int | None = None) -> None:
        """Complete open ops, then hand counters to and finalize every plugin. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ts = time.monotonic_ns() if ts_ns is None else ts_ns
            for op in list(self._ops.values()):
                self._finish(op, ts)
            self._ops.clear()
            for i in range(len(self._slots)):
                self._stop(i, self._proxy[i], ts)
            counts = dict(self._counts)
            for s in self._slots:
                for what, fn in (("report_counters", lambda: s.lp.report_counters(counts)),
                                 ("finalize", s.lp.finalize)):
                    try:
                        fn()
                    except Exception:
                        log.exception("slicetrace: profiler plugin %r failed in %s", s.lp.name, what)
