"""Guarded plugin calls and the begin-side events of an op (API, Group, KernelLaunch, Coll/P2p starts).

The event host's half that talks to plugins one event at a time: a plugin that raises is logged once, counted
and disabled after `max_failures`; a child of a None (dropped) parent is dropped and counted; types a plugin
does not record take its `unrecorded_handle` without a call. EventHost (host.py) holds the state these use.
"""
from __future__ import annotations

import logging
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

from .abi import (CollApiDescr, CollDescr, EventType, GroupApiDescr, GroupDescr, KernelChDescr,
                  KernelLaunchDescr, P2pApiDescr, P2pDescr, ProxyCtrlDescr, State, StateArgs)
from .ops import OFF as _OFF
from .ops import PartialDelivery, _Op, _Slot

log = logging.getLogger("slicetrace")
T = EventType
_B = SimpleNamespace(**{t.name: int(t) for t in T})   # bits as ints: IntFlag arithmetic runs Python code
_GA, _CA, _PA, _KL = _B.GROUP_API, _B.COLL_API, _B.P2P_API, _B.KERNEL_LAUNCH
_PARENTS = _GA | _CA | _PA | _KL | _B.GROUP      # the types above Coll/P2p
_DELIVERED = {t: f"delivered_{t.name.lower()}" for t in T}


def _tag(info: Any, ti: Any) -> int:
    """A task's user tag: its own (each send/recv of a group has one), else its op's."""
    return info.user_tag if ti.user_tag is None else ti.user_tag


# By descriptor class: hashing an IntFlag member runs Python code.
_DELIVERED_CLS = {c: _DELIVERED[t] for c, t in (
    (GroupApiDescr, T.GROUP_API), (CollApiDescr, T.COLL_API), (P2pApiDescr, T.P2P_API),
    (KernelLaunchDescr, T.KERNEL_LAUNCH), (GroupDescr, T.GROUP), (CollDescr, T.COLL), (P2pDescr, T.P2P),
    (KernelChDescr, T.KERNEL_CH), (ProxyCtrlDescr, T.PROXY_CTRL))}


class Emitter:
    """Mixed into EventHost: expects self._slots, self._counts, self._skip_counts, self.comm, self.max_failures."""
    _slots: list[_Slot]
    _counts: dict[str, int]
    _skip_counts: dict[tuple, list[tuple[str, int]]]
    comm: Any
    max_failures: int

    def _fail(self, s: _Slot, what: str, n: int, errors: int = 1) -> None:
        """n records lost to `errors` exceptions of plugin s."""
        s.failures += errors
        s.lp.error_budget = self.max_failures - s.failures    # per-record delivery stops where this disables
        s.counts["plugin_error"] += n
        if s.failures == errors:            # the first failure (of one call's `errors`)
            log.exception("slicetrace: profiler plugin %r raised in %s (logged once; %d failures disable it)",
                          s.lp.name, what, self.max_failures)
        if s.failures >= self.max_failures and not s.disabled:
            s.disabled = True
            log.warning("slicetrace: profiler plugin %r disabled after %d exceptions", s.lp.name, s.failures)

    def _failed_batch(self, s: _Slot, what: str, n: int, err: Exception, kept_key: str, short_key: str) -> None:
        """A batch call for n records raised: per-record or per-run delivery (PartialDelivery) says which ones got
        through (kept_key), failed, were not kept (short_key) or not offered (the plugin is now disabled)."""
        if not isinstance(err, PartialDelivery):
            self._fail(s, what, n)
            return
        c = s.counts
        c[kept_key] = c.get(kept_key, 0) + err.kept
        c[short_key] += n - err.kept - err.failed - err.left
        c["plugin_disabled"] += err.left
        self._fail(s, what, err.failed, err.errors)

    def _admit(self, s: _Slot, parent: Any) -> bool:
        """A child of a dropped parent, or for a disabled plugin, is dropped and counted."""
        if parent is None:
            s.counts["parent_dropped"] += 1
            return False
        if s.disabled:
            s.counts["plugin_disabled"] += 1
            return False
        return True

    def _count_disabled(self, s: _Slot, op: _Op, real: int) -> None:
        """The begin-side events (types in `real`) of op that disabled plugin s would have got, counted
        plugin_disabled in bulk: the events _emit_begin would start for it, without a descriptor made."""
        n_p2p = op.n_p2p
        n_coll = len(op.tasks) - n_p2p
        s.counts["plugin_disabled"] += (
            (1 if real & _GA else 0) + (n_coll if real & _CA else 0) + (n_p2p if real & _PA else 0)
            + (1 if real & _KL else 0) + (1 if real & _B.GROUP else 0) + (n_coll if real & _B.COLL else 0)
            + (n_p2p if real & _B.P2P else 0))

    def _start(self, i: int, descr: Any, parent: Any) -> Any:
        """Start one event for plugin i under `parent` (a handle, None = dropped parent, or _OFF = none)."""
        s = self._slots[i]
        if not self._admit(s, parent):
            return None
        descr.parent = None if parent is _OFF else parent
        try:
            h = s.lp.start_event(descr)
        except Exception:
            self._fail(s, "start_event", 1)
            return None
        c = s.counts
        if h is None:
            c["declined"] += 1
        else:
            key = _DELIVERED_CLS.get(type(descr)) or _DELIVERED[descr.type]
            c[key] = c.get(key, 0) + 1
        return h

    def _skip(self, i: int, key: str, parent: Any) -> Any:
        """_start for a type outside the plugin's live mask when it declared `unrecorded_handle`: the plugin
        promised start_event would return that handle without side effects, so the call and its descriptor
        are skipped, counted under `key` (unrecorded_<type>: the plugin never saw it, so not delivered_<type>)."""
        s = self._slots[i]
        if not self._admit(s, parent):
            return None
        s.counts[key] = s.counts.get(key, 0) + 1
        return s.lp.passthrough

    def _stop(self, i: int, h: Any, ts_ns: int) -> None:
        s = self._slots[i]
        if h is None or h is _OFF or h is s.lp.passthrough:   # stop of passthrough: a no-op
            return
        try:        # a disabled plugin still gets the stop of each event it started (it may write at stop)
            s.lp.stop_event(h, ts_ns)
        except Exception:
            if s.disabled:
                s.counts["plugin_error"] += 1       # its event is lost; no more exceptions are logged or budgeted
            else:
                self._fail(s, "stop_event", 1)

    def _state(self, i: int, h: Any, state: State, args: StateArgs) -> None:
        s = self._slots[i]
        if h is None or h is _OFF or s.disabled:
            return
        try:
            s.lp.record_event_state(h, state, args)
        except Exception:
            self._fail(s, "record_event_state", 1)

    def _emit_begin(self, i: int, op: _Op, real: int, own: int = -1) -> None:
        """Starts of plugin i; types in pm but not in `real` take the plugin's passthrough handle (_skip). A parent
        whose type is not in the plugin's own mask `own` (one NCCL added for its children) that the plugin did not
        track (start returned None) leaves its children with no parent (NCCL passes them parentObj NULL) instead
        of dropping them."""
        pm, pt = op.pmasks[i], self._slots[i].lp.passthrough
        if pt is not None and not real & _PARENTS:
            self._emit_fast(i, op, pm, real, pt)
            return
        info, rank, ts = op.info, self.comm.rank, op.info.ts_ns

        def kept(h: Any, bit: int, parent: Any = _OFF) -> Any:      # parent None: dropped with it, not declined
            return _OFF if h is None and parent is not None and not own & bit else h
        ga = _OFF
        if pm & _GA:
            ga = kept(self._start(i, GroupApiDescr(T.GROUP_API, None, rank, ts, group_depth=info.group_depth), _OFF)
                      if real & _GA else self._skip(i, "unrecorded_group_api", _OFF), _GA)
        try:                          # a Ctrl-C inside a plugin call: the GroupApi stops all the same
            apis: list[Any] = []
            for t in op.tasks:
                api = _OFF
                ti = t.info
                if t.p2p and pm & _PA:
                    api = kept(self._start(i, P2pApiDescr(T.P2P_API, None, rank, ts, func=ti.func, count=ti.count,
                                                           datatype=ti.datatype, stream=info.stream,
                                                           user_tag=_tag(info, ti)), ga)
                               if real & _PA else self._skip(i, "unrecorded_p2p_api", ga), _PA, ga)
                elif not t.p2p and pm & _CA:
                    api = kept(self._start(i, CollApiDescr(T.COLL_API, None, rank, ts, func=ti.func, count=ti.count,
                                                            datatype=ti.datatype, root=ti.root, stream=info.stream,
                                                            user_tag=_tag(info, ti)), ga)
                               if real & _CA else self._skip(i, "unrecorded_coll_api", ga), _CA, ga)
                apis.append(api)
                self._stop(i, api, ts)        # API events stop once enqueued (NCCL semantics)
            if pm & _KL:
                kl = (self._start(i, KernelLaunchDescr(T.KERNEL_LAUNCH, None, rank, ts, stream=info.stream), ga)
                      if real & _KL else self._skip(i, "unrecorded_kernel_launch", ga))
                self._stop(i, kl, ts)
            grp = _OFF
            if pm & _B.GROUP:
                grp = kept(self._start(i, GroupDescr(T.GROUP, None, rank, ts), _OFF)
                           if real & _B.GROUP else self._skip(i, "unrecorded_group", _OFF), _B.GROUP)
            op.groups[i] = grp
            old_parenting = self._slots[i].lp.version <= 4
            for t, api in zip(op.tasks, apis):
                ti = t.info
                parent = grp if old_parenting else api
                if t.p2p and pm & _B.P2P:
                    if not real & _B.P2P:
                        t.handles[i] = self._skip(i, "unrecorded_p2p", parent)
                        continue
                elif not t.p2p and pm & _B.COLL:
                    if not real & _B.COLL:
                        t.handles[i] = self._skip(i, "unrecorded_coll", parent)
                        continue
                else:
                    continue
                t.handles[i] = kept(self._start(i, self._task_descr(info, ti, t.p2p, grp), parent),
                                    _B.P2P if t.p2p else _B.COLL, parent)
        finally:
            if ga is not _OFF:
                self._stop(i, ga, ts)

    def _emit_fast(self, i: int, op: _Op, pm: int, real: int, pt: Any) -> None:
        """_emit_begin when every API/Group/KernelLaunch parent is skipped (the example plugin's default): the
        same counts and handles, with the skips (unrecorded_<type>) counted in bulk."""
        c, info, tasks = self._slots[i].counts, op.info, op.tasks
        n_p2p = op.n_p2p
        key = (pm, real, n_p2p, len(tasks))
        adds = self._skip_counts.get(key)
        if adds is None:
            n_coll = len(tasks) - n_p2p
            adds = self._skip_counts[key] = [(k, n) for k, n in (
                ("unrecorded_group_api", 1 if pm & _GA else 0), ("unrecorded_coll_api", n_coll if pm & _CA else 0),
                ("unrecorded_p2p_api", n_p2p if pm & _PA else 0),
                ("unrecorded_kernel_launch", 1 if pm & _KL else 0), ("unrecorded_group", 1 if pm & _B.GROUP else 0),
                ("unrecorded_coll", n_coll if pm & _B.COLL and not real & _B.COLL else 0),
                ("unrecorded_p2p", n_p2p if pm & _B.P2P and not real & _B.P2P else 0)) if n]
        for k, n in adds:
            c[k] = c.get(k, 0) + n
        grp = pt if pm & _B.GROUP else _OFF
        op.groups[i] = grp
        for t in tasks:
            if t.p2p:
                if not pm & _B.P2P:
                    continue
                parent = pt if pm & _PA else _OFF
                if not real & _B.P2P:
                    t.handles[i] = pt                                     # what _skip hands out
                    continue
            else:
                if not pm & _B.COLL:
                    continue
                parent = pt if pm & _CA else _OFF
                if not real & _B.COLL:
                    t.handles[i] = pt
                    continue
            t.handles[i] = self._start(i, self._task_descr(info, t.info, t.p2p, grp), parent)

    def _task_descr(self, info: Any, ti: Any, p2p: bool, grp: Any) -> Any:
        """The Coll or P2p descriptor of one task (its parent is set by _start)."""
        # Positional (field order checked below): keywords and an EventType member each cost more than the rest.
        c, pg, tag = self.comm, None if grp is _OFF else grp, info.user_tag if ti.user_tag is None else ti.user_tag
        if p2p:     # type, parent, rank, ts_ns, func, buff, datatype, count, peer, n_channels, parent_group, ...
            return P2pDescr(_P2P, None, c.rank, info.ts_ns, ti.func, ti.send_buff or ti.recv_buff, ti.datatype,
                            ti.count, ti.peer, ti.n_programs, pg, tag, c.comm_hash)
        # type, parent, rank, ts_ns, seq_number, func, send_buff, recv_buff, count, root, datatype, n_channels,
        # n_warps, algo, proto, parent_group, user_tag, kernel_variant, is_sym_coll, comm_hash
        v = ti.variant      # a symmetric kernel: algo is its name past the function (NCCL's), no protocol
        return CollDescr(_COLL, None, c.rank, info.ts_ns, info.seq_number, ti.func, ti.send_buff, ti.recv_buff,
                         ti.count, ti.root, ti.datatype, ti.n_programs, info.n_warps,
                         v.partition("_")[2] if v else "RING", "" if v else "SIMPLE", pg, tag, v, bool(v), c.comm_hash)


_COLL, _P2P = T.COLL, T.P2P
assert [f.name for f in fields(P2pDescr)] == ["type", "parent", "rank", "ts_ns", "func", "buff", "datatype", "count",
                                             "peer", "n_channels", "parent_group", "user_tag", "comm_hash"]
assert [(f.name, f.default) for f in fields(CollDescr)][4:] == [
    ("seq_number", 0), ("func", ""), ("send_buff", 0), ("recv_buff", 0), ("count", 0), ("root", 0), ("datatype", ""),
    ("n_channels", 0), ("n_warps", 0), ("algo", "RING"), ("proto", "SIMPLE"), ("parent_group", None),
    ("user_tag", 0), ("kernel_variant", ""), ("is_sym_coll", False), ("comm_hash", 0)]
