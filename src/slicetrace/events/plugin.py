"""Profiler plugins: the Protocol and version adapters (loading from a spec: events/loading.py).

A plugin declares `version`, an int 1..8 (8 = NCCL profiler v7 + KernelStep). The host always talks to a
`LoadedPlugin`, which presents the native v8 interface and adapts it down for older plugins the way NCCL's
profiler_v*.cc adapters do: v1..v3 init gets no communicator (None); after init the bits its adapter clears
(abi.VERSION_CLEARED) are cleared from its ActivationMask, once, and the host reads only the types the version
knows from it; events of unknown types get a None handle without calling the plugin, unknown states are dropped,
v1..v3 state args carry only ProxyCtrl's count, and descriptors are rewritten (fields a version lacks zeroed, and
Coll/P2p comm_hash below 8, as v1..v3's adapters do; v4-: Coll/P2p parent := parent_group; v1: enum codes instead
of strings).

Plugins without `kernel_step_batch` (`kernel_ch_batch`) but with `kernel_step_runs` (`kernel_ch_runs`) get each batch
as one run; plugins with neither get the per-event slow path (reference semantics of the batch call):

    for each record: h = start_event(ctx, KernelStepDescr(...))        # KernelChDescr(ts=start_ns, p_timer=start_clk)
                     record_event_state(h, KERNEL_STEP_STOP, StateArgs(p_timer=done_clk, ts_ns=done_ns))
                     stop_event(h, done_ns)                            # KERNEL_CH_STOP, stop_clk, stop_ns

A call that raises fails only its record (a started event is still stopped, before its parent is); the rest are
still offered, and the batch call then raises PartialDelivery so the host counts each record where it went.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import replace
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ..errors import PluginError
from .abi import (NATIVE_VERSION, VERSION_CLEARED, VERSION_STATES, VERSION_TYPES, ActivationMask, CollApiDescr,
                  CollDescr, CommInfo, Descriptor, EventType, GroupApiDescr, GroupDescr, KernelChDescr,
                  KernelLaunchDescr, KernelStepDescr, P2pApiDescr, P2pDescr, ProxyCtrlDescr, State, StateArgs,
                  check_version)

log = logging.getLogger("slicetrace")

# v1 descriptors carry uint8 enums (NCCL's ncclFunc_t, ncclDataType_t, algorithm and protocol indices).
V1_FUNC = {"Broadcast": 0, "Reduce": 1, "AllGather": 2, "ReduceScatter": 3, "AllReduce": 4, "SendRecv": 5,
           "Send": 6, "Recv": 7, "AlltoAll": 8}
V1_DATATYPE = {"ncclInt8": 0, "ncclUint8": 1, "ncclInt32": 2, "ncclUint32": 3, "ncclInt64": 4, "ncclUint64": 5,
               "ncclFloat16": 6, "ncclFloat32": 7, "ncclFloat64": 8, "ncclBfloat16": 9}
V1_ALGO = {"TREE": 0, "RING": 1, "COLLNET_DIRECT": 2, "COLLNET_CHAIN": 3, "NVLS": 4, "NVLS_TREE": 5, "PAT": 6}
V1_PROTO = {"LL": 0, "LL128": 1, "SIMPLE": 2}
V1_UNKNOWN = 255

_KS = EventType.KERNEL_STEP
_KS_STOP = State.KERNEL_STEP_STOP
_KCH = EventType.KERNEL_CH
_KCH_STOP = State.KERNEL_CH_STOP
_CTRL_FIRST, _CTRL_LAST = State.PROXY_CTRL_IDLE, State.PROXY_CTRL_APPEND_END
_T = EventType
# Type bit by descriptor class: `int & IntFlag` runs IntFlag.__rand__ (Python code) on every event.
_BIT_OF = {c: int(t) for c, t in (
    (GroupApiDescr, _T.GROUP_API), (CollApiDescr, _T.COLL_API), (P2pApiDescr, _T.P2P_API),
    (KernelLaunchDescr, _T.KERNEL_LAUNCH), (GroupDescr, _T.GROUP), (CollDescr, _T.COLL), (P2pDescr, _T.P2P),
    (KernelChDescr, _T.KERNEL_CH), (KernelStepDescr, _T.KERNEL_STEP), (ProxyCtrlDescr, _T.PROXY_CTRL))}


class Failure(NamedTuple):
    """What `comm_failed` is told: when (host CLOCK_MONOTONIC ns, the trace's clock), the error's class name
    (PeerError, CommTimeoutError, MismatchError) and whole message, and the op it belongs to (its function as
    the trace names it, e.g. AllReduce or SendRecv, and SeqNum) where known: the op that raised it, or an earlier
    op whose completion failed (cuda); else None (found outside an op, or said again to a later op)."""
    ts_ns: int
    error: str
    message: str
    op: str | None = None
    seq: int | None = None


@runtime_checkable
class Plugin(Protocol):
    """What a profiler plugin implements (NCCL's ncclProfiler_t, in Python).

    Optional: `kernel_step_batch(ctx, parent_handle, recs) -> int` (records kept; recs is a read-only
    abi.KERNEL_STEP_DTYPE array shared by all plugins, possibly a strided view: take its bytes through
    np.ascontiguousarray), `kernel_step_runs(ctx, parents, recs, starts, stops) ->
    int` (one drain poll at once: rows starts[k]:stops[k] of recs belong to parents[k]; the same as
    kernel_step_batch per run, which is what plugins without it get; a batch method that returns None is taken to
    keep every record, logged once), `kernel_ch_batch(ctx, parent_handle, recs) -> int`
    (native version only; whole KernelCh events, abi.KERNEL_CH_DTYPE, start and stop in one row),
    `kernel_ch_runs(ctx, parents, recs, starts, stops) -> int` (kernel_ch_batch for a poll's collectives at once;
    either *_runs method works without its *_batch, which it then replaces as one run per batch)
    and `report_counters(ctx, counters)`, called once right before `finalize` with the host's drop and delivery
    counters (the final ones) so a trace can carry its loss accounting. A plugin that wants them while the job runs
    (a metrics file that alerts on losses) also implements `live_counters(ctx, read)`: called once, in init's
    turn, with `read() -> dict`, the same counters as they are at that moment; read may be called from any thread
    of the plugin's, never waits for a callback of the host's (it may then read a poll's counts half-updated: each
    counter never goes down), costs the host nothing until called, and is not to be called after finalize.
    Optional, slicetrace's extension (no NCCL profiler version has it; any version may implement it):
    `comm_failed(ctx, failure)`, a `Failure`, called when an operation of the communicator raised PeerError
    (CommTimeoutError, an abort) or MismatchError, once per error, before finalize, so that the plugin's output
    says why the rank stopped; nothing calls it while ops succeed. `event_unfinished(handle, missing)`, called
    right before stop_event of a Coll/P2p that ended (end_op, close) without `missing` of its KernelCh records
    (counted missing_kernel_ch: interrupted, or the records were lost); never for one that completed.
    Optional (native version only): `unrecorded_handle(ctx) -> handle`, a promise that start_event returns
    that very handle, with no side effect, for every parent type (API, KernelLaunch, Group, Coll, P2p) outside
    the plugin's live mask, and that stop_event/record_event_state on it do nothing; the host then skips those
    calls (auto-included parents). KernelCh and KernelStep are offered by the op's mask snapshot (a mask change
    applies from the next op); a record the plugin answers with that handle counts as declined.
    """
    name: str
    version: int

    def init(self, comm: CommInfo | None, mask: ActivationMask) -> Any: ...      # None for versions 1..3
    def start_event(self, ctx: Any, descr: Descriptor) -> Any: ...
    def stop_event(self, handle: Any, ts_ns: int) -> None: ...
    def record_event_state(self, handle: Any, state: State, args: StateArgs) -> None: ...
    def finalize(self, ctx: Any) -> None: ...


class LoadedPlugin:
    """One plugin behind the native (v8) interface; adapts older versions. Not thread-safe (the host locks)."""

    def __init__(self, plugin: Any, source: str = ""):
        for attr in ("init", "start_event", "stop_event", "record_event_state", "finalize"):
            if not callable(getattr(plugin, attr, None)):
                raise PluginError(f"profiler plugin {source or plugin!r} has no callable {attr}(); a plugin "
                                  f"implements init, start_event, stop_event, record_event_state, finalize")
        version = check_version(getattr(plugin, "version", None), repr(source or plugin))
        self.plugin = plugin
        self.source = source
        self.name = str(getattr(plugin, "name", source or type(plugin).__name__))
        self.version: int = version
        self.known_types: int = int(VERSION_TYPES[version])
        self.known_states: frozenset[State] = VERSION_STATES[version]
        self.cleared: int = VERSION_CLEARED[version]
        batch = getattr(plugin, "kernel_step_batch", None)
        self.knows_ks = bool(self.known_types & int(_KS))
        self.has_batch = self.knows_ks and callable(batch)
        # Each *_runs method stands alone: without its *_batch, a batch goes to it as one run.
        self.has_runs = self.knows_ks and callable(getattr(plugin, "kernel_step_runs", None))
        native = version == NATIVE_VERSION
        self.has_ch_batch = native and callable(getattr(plugin, "kernel_ch_batch", None))
        self.has_ch_runs = native and callable(getattr(plugin, "kernel_ch_runs", None))
        self._mask = ActivationMask(0)
        self.ctx: Any = None
        self.passthrough: Any = None      # the plugin's unrecorded_handle(ctx), if it declares one
        self.rank = 0
        self.initialized = False
        self.error_budget = 1 << 62       # exceptions left before the host disables it (set by the host)
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"LoadedPlugin({self.name!r}, version={self.version})"

    def init(self, comm: CommInfo, mask: int = 0, counters: Any = None) -> None:
        """Call the plugin's init (and live_counters with `counters`, the host's reader, if it has it); raises
        whatever they raise (the host unloads the plugin then)."""
        self._mask.value = int(mask)
        self.rank = comm.rank
        self.ctx = self.plugin.init(comm if self.version >= 4 else None, self._mask)   # v1..v3: init(ctx, mask)
        self.initialized = True
        try:
            asked = self._mask.value
            if asked.__class__ is not int:
                asked = self._int_mask(asked)
            if asked & self.cleared:
                self._mask.value = asked & ~self.cleared
            if asked & int(_KS) and not self.knows_ks:       # cleared: else an empty output
                log.warning("slicetrace: profiler plugin %r (version %d) asked for KernelStep, which its version "
                            "does not have (it needs version %d); it gets no KernelStep events", self.name,
                            self.version, NATIVE_VERSION)
            fn = getattr(self.plugin, "unrecorded_handle", None)
            if callable(fn) and self.version == NATIVE_VERSION:
                self.passthrough = fn(self.ctx)
            live = getattr(self.plugin, "live_counters", None)
            if counters is not None and callable(live):
                live(self.ctx, counters)
        except BaseException:                   # its init returned (files open): finalize before it is unloaded
            try:
                self.finalize()
            except Exception:
                log.exception("slicetrace: profiler plugin %r failed in finalize", self.name)
            raise

    @property
    def mask(self) -> int:
        """The plugin's live mask as the host acts on it: the types its version knows. Other bits stay in the
        plugin's mask (as in NCCL: only init clears some) but turn nothing on, nor add parents."""
        m = self._mask.value
        if m.__class__ is not int:
            m = self._int_mask(m)
        return m & self.known_types

    def _int_mask(self, m: Any) -> int:
        """A mask the plugin set to a numpy integer or an IntFlag, as an int; anything else (a float, None) turns it
        off, with one error logged: the user's next op must not raise for it."""
        try:
            v = int(operator.index(m))
        except TypeError:
            v = 0
            self._warn_once("mask", "profiler plugin %r set its activation mask to %r; accepted: an int of "
                            "EventType bits. Its mask is now 0 (no events)", self.name, m)
        self._mask.value = v
        return v

    def _warn_once(self, key: str, fmt: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.error("slicetrace: " + fmt, *args)

    def _kept(self, what: str, ret: Any, n: int) -> int:
        """A batch method's answer: None (a method without return) keeps all n, logged once."""
        if ret is None:
            self._warn_once(what, "profiler plugin %r: %s returned None; taken as keeping every record (return "
                            "how many it kept)", self.name, what)
            return n
        return int(ret)

    def knows(self, etype: int) -> bool:
        return bool(self.known_types & etype)

    def start_event(self, descr: Descriptor) -> Any:
        bit = _BIT_OF.get(type(descr))
        if not self.known_types & (int(descr.type) if bit is None else bit):
            return None
        if self.version < NATIVE_VERSION:
            descr = self._adapt(descr)
        return self.plugin.start_event(self.ctx, descr)

    def _adapt(self, d: Descriptor) -> Descriptor:
        v = self.version
        if isinstance(d, (CollDescr, P2pDescr)):
            kw: dict[str, Any] = {"comm_hash": 0}     # v4+: init has it; NCCL's v1..v3 adapters zero it too
            if v < 7:
                kw["user_tag"] = 0
                if isinstance(d, CollDescr):
                    kw.update(kernel_variant="", is_sym_coll=False)
            if v <= 4:      # NCCL's v4 adapter: legacy Group parenting (the parentGroup field is v5's)
                kw.update(parent=d.parent_group, parent_group=None)
                if v <= 3 and isinstance(d, P2pDescr):
                    kw["n_channels"] = 0                # p2p nChannels is v4's
            d = replace(d, **kw)
            if v == 1:
                d = _to_v1(d)
        elif isinstance(d, (CollApiDescr, P2pApiDescr)) and v < 7:
            d = replace(d, user_tag=0)                # user_tag is v7's (v5/v6 API descriptors lack it)
        elif isinstance(d, KernelChDescr) and v <= 3:
            d = replace(d, p_timer=0)
        return d

    def stop_event(self, handle: Any, ts_ns: int) -> None:
        self.plugin.stop_event(handle, ts_ns)

    def record_event_state(self, handle: Any, state: State, args: StateArgs) -> None:
        if state in self.known_states:
            if self.version <= 3:       # NCCL's v1..v3 adapters pass zeroed args but ProxyCtrl's appendedProxyOps
                args = StateArgs(appended_proxy_ops=args.appended_proxy_ops if _CTRL_FIRST <= state <= _CTRL_LAST
                                 else 0, ts_ns=args.ts_ns)
            self.plugin.record_event_state(handle, state, args)

    def kernel_step_batch(self, parent: Any, recs: np.ndarray) -> int:
        """Deliver KernelStep records under `parent`; returns how many the plugin kept."""
        if not self.knows_ks:
            return 0
        if self.has_batch:
            return self._kept("kernel_step_batch", self.plugin.kernel_step_batch(self.ctx, parent, recs), len(recs))
        if self.has_runs:
            return self.kernel_step_runs([parent], recs, [0], [len(recs)])
        ctx, rank, p = self.ctx, self.rank, self.plugin
        return _one_by_one(self, lambda d: p.start_event(ctx, d), p.record_event_state, p.stop_event, _KS_STOP, (
            (KernelStepDescr(_KS, parent, rank, wn, ch, bool(snd), peer, step, size, wc, rc, dc), dc, dn)
            for ch, snd, peer, step, size, wc, rc, dc, wn, rn, dn in recs.tolist()), len(recs))

    def kernel_step_runs(self, parents: list, recs: np.ndarray, starts: list[int], stops: list[int]) -> int:
        """Rows starts[k]:stops[k] of recs under parents[k], for several parents at once; returns how many were
        kept. Plugins without kernel_step_runs get kernel_step_batch per run (its reference semantics)."""
        if self.has_runs:
            return self._kept("kernel_step_runs", self.plugin.kernel_step_runs(self.ctx, parents, recs, starts, stops),
                              sum(stops) - sum(starts))
        return _per_run(self, self.kernel_step_batch, parents, recs, starts, stops)

    def kernel_ch_batch(self, parent: Any, recs: np.ndarray) -> int:
        """Deliver whole KernelCh events (abi.KERNEL_CH_DTYPE) under `parent`; returns how many were kept."""
        if self.has_ch_batch:
            return self._kept("kernel_ch_batch", self.plugin.kernel_ch_batch(self.ctx, parent, recs), len(recs))
        if self.has_ch_runs:
            return self.kernel_ch_runs([parent], recs, [0], [len(recs)])
        rank = self.rank
        return _one_by_one(self, self.start_event, self.record_event_state, self.plugin.stop_event, _KCH_STOP, (
            (KernelChDescr(_KCH, parent, rank, t0, ch, c0), c1, t1) for ch, _, _, c0, c1, t0, t1 in recs.tolist()),
            len(recs))

    def kernel_ch_runs(self, parents: list, recs: np.ndarray, starts: list[int], stops: list[int]) -> int:
        """kernel_ch_batch for several parents at once (rows starts[k]:stops[k] under parents[k]); plugins
        without kernel_ch_runs get kernel_ch_batch per run."""
        if self.has_ch_runs:
            return self._kept("kernel_ch_runs", self.plugin.kernel_ch_runs(self.ctx, parents, recs, starts, stops),
                              sum(stops) - sum(starts))
        return _per_run(self, self.kernel_ch_batch, parents, recs, starts, stops)

    def report_counters(self, counters: dict[str, int]) -> None:
        fn = getattr(self.plugin, "report_counters", None)
        if callable(fn):
            fn(self.ctx, counters)

    @property
    def hears_failures(self) -> bool:
        return self.initialized and callable(getattr(self.plugin, "comm_failed", None))

    def comm_failed(self, ts_ns: int, error: str, message: str, op: str | None, seq: int | None) -> None:
        """Tell the plugin, if it has comm_failed, of an op's error (a Failure)."""
        if self.hears_failures:
            self.plugin.comm_failed(self.ctx, Failure(ts_ns, error, message, op, seq))

    def finalize(self) -> None:
        if self.initialized:
            self.initialized = False
            self.plugin.finalize(self.ctx)


class PartialDelivery(Exception):
    """A per-record or per-run delivery in which plugin calls raised (the first is the __cause__): `kept` records
    went through, `failed` had a call raise, `left` were not offered (the failure budget ran out), `errors` =
    exceptions raised. Every started event was stopped."""

    def __init__(self, kept: int, failed: int, left: int, errors: int):
        super().__init__(f"{failed} record(s) failed, {left} not offered, {kept} kept")
        self.kept, self.failed, self.left, self.errors = kept, failed, left, errors


def _per_run(lp: LoadedPlugin, batch: Any, parents: list, recs: np.ndarray, starts: list[int],
             stops: list[int]) -> int:
    """A *_runs call as one batch(parent, rows) call per run (its reference semantics); returns the rows kept.
    A run that raises costs only its own rows (PartialDelivery)."""
    kept = failed = left = errors = 0
    first: BaseException | None = None
    for p, a, b in zip(parents, starts, stops):
        if lp.error_budget <= 0:                  # the host disables the plugin at this failure: offer no more
            left += b - a
            continue
        try:
            kept += min(max(int(batch(p, recs[a:b])), 0), b - a)
        except PartialDelivery as e:
            kept, failed, left, errors = kept + e.kept, failed + e.failed, left + e.left, errors + e.errors
            first = first or e.__cause__
        except Exception as e:
            failed, errors, first = failed + b - a, errors + 1, first or e
            lp.error_budget -= 1
    if errors:
        raise PartialDelivery(kept, failed, left, errors) from first
    return kept


def _one_by_one(lp: LoadedPlugin, start: Any, state: Any, stop: Any, stop_state: State, events: Any,
                n: int) -> int:
    """The reference semantics of a batch call: per (descriptor, stop clock, stop ns), start_event, the *Stop
    state, stop_event; returns how many the plugin started. A raising call fails only its record, and a started
    event is always stopped (its parent stops later); calls stop once lp.error_budget exceptions were raised."""
    kept = failed = done = errors = 0
    first: BaseException | None = None
    pt = lp.passthrough
    for descr, p_timer, ts in events:
        done += 1
        bad = 0
        try:
            h = start(descr)
            if h is None or h is pt:          # refused, or "not recorded" (unrecorded_handle): declined, not kept
                continue
            try:
                state(h, stop_state, StateArgs(p_timer=p_timer, ts_ns=ts))
            except Exception as e:
                bad, first = 1, first or e
            finally:
                stop(h, ts)
        except Exception as e:
            bad, first = bad + 1, first or e
        if not bad:
            kept += 1
            continue
        failed, errors = failed + 1, errors + bad
        lp.error_budget -= bad
        if lp.error_budget <= 0:
            break
    if errors:
        raise PartialDelivery(kept, failed, n - done, errors) from first
    return kept


def _to_v1(d: Descriptor) -> Descriptor:
    if isinstance(d, CollDescr):
        return replace(d, func=V1_FUNC.get(d.func, V1_UNKNOWN), datatype=V1_DATATYPE.get(d.datatype, V1_UNKNOWN),
                       algo=V1_ALGO.get(d.algo, V1_UNKNOWN), proto=V1_PROTO.get(d.proto, V1_UNKNOWN))
    if isinstance(d, P2pDescr):
        return replace(d, func=V1_FUNC.get(d.func, V1_UNKNOWN), datatype=V1_DATATYPE.get(d.datatype, V1_UNKNOWN))
    return d
