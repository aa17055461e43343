"""The example plugin: events -> one Chrome-trace JSON file per rank (Perfetto opens it).

File: `<profile_dump_file>_<commHash>_<rank>.json`, commHash in decimal (as NCCL's example plugin prints it);
no dump file = events are counted and discarded. Record names, categories and args follow NCCL's example
plugin (print_event.cc); KernelStep is ours (PR #2316).

Timeline: ts = host CLOCK_MONOTONIC ns / 1000 (µs, 3 decimals = exact ns). Every rank on a host shares that
clock, so per-rank files merge into one trace; one process per rank and communicator ("rank N (comm H)"), pid
from both (chrome_text.trace_pid; the first record, "slicetrace_comm", carries the Rank, the run's nRanks and the
EventMask the plugin recorded with), then the process and track names (a KernelStep track's before its first
slice), so a file cut short (a rank killed) still names them. Coll/P2p/KernelCh/API events are async b/e pairs
(same cat + id; ids are chrome_text.id_base + n: unique across the merged files of every communicator, under
2**53). KernelSteps are "X" slices from wait to done on one thread per (channel, direction, peer),
tid = 1e6 + channel*131072 + is_send*65536 + peer, named e.g. "ch 3 send->1"; slices of one connection are
sequential, so they render without overlap. ProxyCtrl (the drain's states, stamps/ctrl.py) are "X" spans on the
"proxy" thread (tid 2), cat PROXY, the last PROXY_CTRL pool size of them (older ones are overwritten, counted
plugin_overwritten_PROXY_CTRL; PROXY_CTRL's written, lost and overwritten counters count spans,
delivered_proxy_ctrl events): NCCL's example plugin writes
one b/e span per ProxyCtrl event, named Idle (for Idle/Active), Sleep or Append (args.appended), so its long-lived
Idle/Active event is one span for the whole run; we write a span per state ("Idle" and "Active" between that
event's transitions, "Sleep" to Wakeup, "Append" to AppendEnd with args.appended), which nest, so the track shows
when the drain worked, idled and slept.

Pools (sizes from settings.pool_sizes): a pool bounds the events of one type *in flight*; a slot is retired
when its event stops, so only events beyond the pool size still in flight are dropped (and counted). Completed
records are buffered (KernelSteps as numpy column chunks) and appended to the file whenever a buffer reaches
its pool size, by a writer thread (sinks/chrome_writer.py: off the host's lock), so memory stays bounded on long
runs (with no dump file, KernelSteps are counted and their chunk reused every 65,536 rows). The last record,
"slicetrace_counters", carries the rank's drop counters with this plugin's deliveries and refusals (handed over by
`report_counters` before `finalize`) and its own drops. A failed write (a full disk) ends the file at its last
whole record, and finalize raises OSError saying what was lost. A rank that lost records is renamed before that
record, "rank N (comm H) lost: overrun 12, ...": Perfetto shows a process's name, never that record's args.
An op that failed (comm_failed, slicetrace's extension) is an instant "ERROR" event on the rank's process at once,
named by the error class and its message's first line (args: Error, Message, Op, SeqNum), and the process is
renamed at close "rank N (comm H) failed: PeerError" (with "; lost: ..." when it lost records too).
A Coll/P2p that ended without some of its KernelCh (the host's event_unfinished: interrupted, or the records lost)
has args {"UnfinishedKernelCh": N} on its "e" record, N the KernelCh missing; ops that complete have no args there.
"""
from __future__ import annotations

import json
import logging
from operator import sub
from typing import Any

import numpy as np

from ..config import DEFAULT_POOL_SIZES, Settings
from ..errors import ConfigError
from ..events.plugin import Failure
from ..events.abi import (ActivationMask, CollApiDescr, CollDescr, CommInfo, EventType, GroupApiDescr, GroupDescr,
                          KernelChDescr, KernelLaunchDescr, KernelStepDescr, P2pApiDescr, P2pDescr, ProxyCtrlDescr,
                          State, StateArgs, lost_counters)
from .chrome_ops import OpRows
from .chrome_store import POOL_OF, Ctx, Ev, parent_ids
from .chrome_text import (COLL_B, OP_E, P2P_B, failure_line, js, pair, process_meta, proxy_text,
                          unfinished_end)

log = logging.getLogger("slicetrace")

T = EventType
DEFAULT_MASK = int(T.COLL | T.P2P | T.KERNEL_CH | T.KERNEL_STEP)      # 65606
# Offered after the op's mask snapshot, which the host decides by: the live mask may have changed since.
_LATE = int(T.KERNEL_CH | T.KERNEL_STEP)
_BY_CLASS = {cls: (POOL_OF[t], int(t)) for cls, t in (
    (GroupApiDescr, T.GROUP_API), (CollApiDescr, T.COLL_API), (P2pApiDescr, T.P2P_API),
    (KernelLaunchDescr, T.KERNEL_LAUNCH), (GroupDescr, T.GROUP), (CollDescr, T.COLL), (P2pDescr, T.P2P),
    (KernelChDescr, T.KERNEL_CH), (KernelStepDescr, T.KERNEL_STEP), (ProxyCtrlDescr, T.PROXY_CTRL))}


def _op_pair(ev: Ev, ts1: int) -> list[str]:
    """_records of a Coll or P2p event from one template each (what `pair` writes, without json.dumps per
    record); TypeError / ValueError for what the templates do not take."""
    d, ctx = ev.descr, ev.ctx
    t0 = d.ts_ns
    if t0 < 0 or ts1 < 0:
        raise ValueError("negative timestamp")
    pid = parent_ids(d.parent)[0]
    nm, rank, tpid = js(d.func), ctx.rank, ctx.pid
    if ev.pool == "COLL":
        b = COLL_B % (nm, ev.id, tpid, t0 // 1000, t0 % 1000, d.seq_number, ctx.comm.comm_hash, rank, d.count,
                      js(d.datatype), js(d.algo), js(d.proto), d.n_channels, pid)
        cat = "COLL"
    else:
        b = P2P_B % (nm, ev.id, tpid, t0 // 1000, t0 % 1000, ctx.comm.comm_hash, rank, d.peer, d.count,
                     js(d.datatype), d.n_channels, pid)
        cat = "P2P"
    return [b, OP_E % (nm, cat, ev.id, tpid, ts1 // 1000, ts1 % 1000)]


def _op_lines(ev: Ev, ts1: int) -> list[str]:
    """A Coll or P2p's b and e lines: the templates, or the general path for a field they do not take."""
    try:
        return _op_pair(ev, ts1)
    except (TypeError, ValueError):
        return _records(ev, ts1)


def _unfinished_pair(ev: Ev, ts1: int, missing: int) -> list[str]:
    """A Coll or P2p that ended `missing` KernelCh short (event_unfinished): its e record says so."""
    b, e = _op_lines(ev, ts1)
    return [b, unfinished_end(e, missing)]


def _records(ev: Ev, ts1: int) -> list[str]:
    d, t, ctx = ev.descr, ev.type, ev.ctx
    pid, _ = parent_ids(d.parent)

    def p(name: str, cat: str, args: dict) -> list[str]:
        return pair(ev.id, ctx.pid, name, cat, d.ts_ns, ts1, args)

    if t == T.COLL:
        return p(d.func, "COLL", {
            "SeqNum": d.seq_number, "CommHash": ctx.comm.comm_hash, "Rank": ctx.rank, "Count": d.count,
            "Datatype": d.datatype, "Algorithm": d.algo, "Protocol": d.proto, "nChannels": d.n_channels,
            "ParentId": pid})
    if t == T.P2P:
        return p(d.func, "P2P", {
            "CommHash": ctx.comm.comm_hash, "Rank": ctx.rank, "Peer": d.peer, "Count": d.count,
            "Datatype": d.datatype, "nChannels": d.n_channels, "ParentId": pid})
    if t == T.KERNEL_CH:
        return p("KernelCh", "GPU", {
            "Channel": d.channel_id, "StartGpuClk": d.p_timer, "StopGpuClk": ev.gpu_stop, "ParentId": pid})
    if t == T.GROUP_API:
        return p("Group API", "GROUP_API", {"groupApiId": ev.id, "groupDepth": d.group_depth})
    if t == T.COLL_API:
        return p(d.func, "COLL_API", {
            "count": d.count, "datatype": d.datatype, "root": d.root, "GraphCaptured": d.graph_captured,
            "Stream": d.stream})
    if t == T.P2P_API:
        return p(d.func, "P2P_API", {
            "count": d.count, "datatype": d.datatype, "GraphCaptured": d.graph_captured, "Stream": d.stream})
    if t == T.KERNEL_LAUNCH:
        return p("KernelLaunch", "KERNEL_LAUNCH", {"groupId": pid, "Stream": d.stream})
    if t == T.GROUP:
        return p("Group", "GROUP", {"groupId": ev.id})
    return []


class _CtrlEv(Ev):
    """A ProxyCtrl event: the state it is in (0: none) since `since` ns; `appended` for an Append span."""
    __slots__ = ("state", "since", "appended")


_CTRL_SPANS = {13: "Idle", 14: "Active", 15: "Sleep", 17: "Append"}      # Wakeup and AppendEnd only end a span


def _ctrl_span(ev: _CtrlEv, ts_ns: int) -> None:
    """ev's current state ends at ts_ns: its span goes into the ring of the last PROXY_CTRL pool size spans."""
    name, ctx = _CTRL_SPANS.get(ev.state), ev.ctx
    if name is None or ctx.done:
        return
    args = f',"args":{{"appended":{ev.appended}}}' if ev.state == 17 else ""
    if len(ctx.proxy) == ctx.proxy.maxlen:      # the append below drops the oldest span
        ctx.proxy_overwritten += 1
    ctx.proxy.append((ev.since, ts_ns, name, args))        # text at finalize, in time order (proxy_text)


def event_mask(settings: Settings) -> int:
    """The mask the example plugin asks for: SLICETRACE_PROFILE_EVENT_MASK's, else DEFAULT_MASK."""
    m = settings.profile_event_mask
    return DEFAULT_MASK if m is None else int(m)


class ChromePlugin:
    """NCCL's example profiler plugin, native version 8 (v7 + KernelStep) with the KernelStep batch path."""
    name = "example"
    version = 8

    def __init__(self, settings: Settings | None = None):
        settings = settings if settings is not None else Settings()
        self.mask_value = event_mask(settings)
        self.dump = settings.profile_dump_file
        self.pool_sizes = {**DEFAULT_POOL_SIZES, **dict(settings.pool_sizes)}

    def init(self, comm: CommInfo, mask: ActivationMask) -> Ctx:
        mask.value = self.mask_value
        ctx = Ctx(self, comm, mask)
        ctx.lines["COLL"], ctx.lines["P2P"] = OpRows(ctx, True), OpRows(ctx, False)    # formatted in blocks
        if ctx.path is not None:
            try:
                # now: a path that cannot be written is refused before any op; the record makes the trace say
                # its rank (the pid is per communicator), how many ranks the run had (report and convert check
                # peers against it) and the mask (without Coll/P2p, KernelSteps have no op to lie in)
                ctx.start(json.dumps({"name": "slicetrace_comm", "ph": "M", "pid": ctx.pid, "tid": 0,
                                      "args": {"Rank": comm.rank, "nRanks": comm.n_ranks, "CommHash": comm.comm_hash,
                                               "commName": comm.comm_name, "EventMask": int(mask.value)}},
                                     separators=(",", ":")) + ",\n" + process_meta(ctx.pid, comm.rank, comm.comm_hash))
            except OSError as e:
                raise ConfigError(f"profile_dump_file (SLICETRACE_PROFILE_DUMP_FILE)={self.dump!r}: cannot create "
                                  f"{ctx.path}: {e.strerror or e}; give a prefix in a writable folder") from e
        return ctx

    def start_event(self, ctx: Ctx, descr: Any) -> Ev | None:
        pool, bit = _BY_CLASS.get(type(descr), (None, 0))    # by class: IntFlag arithmetic is slow
        if pool is None or not (ctx.mask.value | _LATE) & bit:   # parents come at the snapshot: live mask = op's
            return ctx.passthrough      # a parent we do not record: children must still find a handle
        if pool == "PROXY_CTRL":
            ev = _CtrlEv(ctx, descr, pool)       # ring of the last spans, overwritten (no pool check)
            ev.state, ev.since, ev.appended = 0, descr.ts_ns, 0
            return ev
        if ctx.inflight[pool] >= ctx.sizes[pool]:
            ctx.dropped[pool] += 1
            return None
        ctx.inflight[pool] += 1
        return Ev(ctx, descr, pool)

    def unrecorded_handle(self, ctx: Ctx) -> Ev:
        """What start_event returns, without side effects, for parent types outside the live mask (the host skips
        them)."""
        return ctx.passthrough

    def record_event_state(self, handle: Ev, state: State, args: StateArgs) -> None:
        if state == 22 or state == 32:            # KernelChStop, KernelStepStop (ints: enum compare is slow)
            handle.gpu_stop = args.p_timer
        elif handle.pool == "PROXY_CTRL":
            if state == 18:                       # AppendEnd
                handle.appended = args.appended_proxy_ops
            _ctrl_span(handle, args.ts_ns)
            handle.state, handle.since = (0 if state == 16 or state == 18 else int(state)), args.ts_ns

    def stop_event(self, handle: Ev, ts_ns: int) -> None:
        pool = handle.pool
        if pool is None or handle.stopped:
            return
        handle.stopped = True
        if pool == "PROXY_CTRL":
            _ctrl_span(handle, ts_ns)
            return
        ctx = handle.ctx
        ctx.inflight[pool] -= 1                   # retire the slot: the pool window advances
        if ctx.done:
            return
        if pool == "KERNEL_STEP":
            d = handle.descr
            ctx.add_slow((d.channel_id, d.is_send, d.peer, d.step, d.size, d.wait, d.ready, handle.gpu_stop,
                          d.ts_ns, d.ts_ns + d.ready - d.wait, ts_ns), d.parent)
            return
        if ctx.path is None:
            ctx.written[pool] += 1
            return
        buf = ctx.lines[pool]
        if pool == "COLL" or pool == "P2P":
            if ctx.unfinished and handle.id in ctx.unfinished:     # {} unless an op ended short: one check
                buf.add_lines(_unfinished_pair(handle, ts_ns, ctx.unfinished.pop(handle.id)))
            elif not buf.add(handle, ts_ns):       # not for the block format (chrome_ops): its lines now
                buf.add_lines(_op_lines(handle, ts_ns))
        else:
            buf.extend(_records(handle, ts_ns))
        if len(buf) >= 2 * ctx.sizes[pool]:
            ctx.flush_lines(pool)

    def kernel_step_batch(self, ctx: Ctx, parent: Any, recs: np.ndarray) -> int:
        if not ctx.done:
            ctx.add_steps(recs, *parent_ids(parent))
        return len(recs)

    def kernel_step_runs(self, ctx: Ctx, parents: list, recs: np.ndarray, starts: list[int],
                         stops: list[int]) -> int:
        """kernel_step_batch for a whole poll: contiguous runs stay one pending batch with a parent per row."""
        n = sum(stops) - sum(starts)
        if ctx.done:
            return n
        ids = list(map(parent_ids, parents))
        if stops[:-1] == starts[1:]:                # contiguous runs: one pending batch, parents per run
            ctx.add_steps(recs[starts[0]:stops[-1]], ids, list(map(sub, stops, starts)))   # run lengths
        else:
            for (pid, seq), a, b in zip(ids, starts, stops):
                ctx.add_steps(recs[a:b], pid, seq)
        return n

    def kernel_ch_batch(self, ctx: Ctx, parent: Any, recs: np.ndarray) -> int:
        """Whole KernelCh events: never in flight, so the pool only bounds the buffer (written when full)."""
        if not ctx.done:
            ctx.add_chans(recs, parent_ids(parent)[0])
        return len(recs)

    def kernel_ch_runs(self, ctx: Ctx, parents: list, recs: np.ndarray, starts: list[int], stops: list[int]) -> int:
        """kernel_ch_batch for a whole poll: one pending batch with a parent per row."""
        n = sum(stops) - sum(starts)
        if ctx.done:
            return n
        ids = [parent_ids(p)[0] for p in parents]
        if stops[:-1] == starts[1:]:                # contiguous: one batch
            pid = np.array(ids, np.int64)
            if stops[-1] - starts[0] != len(ids):   # else a row per run (a 1-channel op's): no repeat to convert
                pid = np.repeat(pid, list(map(sub, stops, starts)))
            ctx.add_chans(recs[starts[0]:stops[-1]], pid)
        else:
            for pid, a, b in zip(ids, starts, stops):
                ctx.add_chans(recs[a:b], pid)
        return n

    def report_counters(self, ctx: Ctx, counters: dict[str, int]) -> None:
        ctx.host_counters = dict(counters)

    def comm_failed(self, ctx: Ctx, failure: Failure) -> None:
        """An op's error: its instant now (a rank killed later still says why it stopped), the name at close."""
        ctx.failed = ctx.failed or failure.error
        if ctx.path is not None and not ctx.done:
            ctx.write(failure_line(ctx.pid, failure))

    def event_unfinished(self, handle: Ev, missing: int) -> None:
        """slicetrace's extension, right before the stop of a Coll/P2p that ended without `missing` of its KernelCh
        (interrupted, or those records were lost): its e record carries args.UnfinishedKernelCh = missing, so
        check_trace takes a channel of it with KernelSteps and no KernelCh as one that never ended."""
        ctx = handle.ctx
        if (handle.pool == "COLL" or handle.pool == "P2P") and not handle.stopped and ctx.path is not None:
            ctx.unfinished[handle.id] = int(missing)

    def counters(self, ctx: Ctx) -> dict[str, int]:
        """This plugin's own accounting: drops, unfinished (still in flight) and written events per pool."""
        out = {f"plugin_dropped_{p}": n for p, n in ctx.dropped.items()}
        out.update({f"plugin_unfinished_{p}": n for p, n in ctx.inflight.items()})
        out.update({f"plugin_lost_{p}": n for p, n in ctx.lost.items()})
        out["plugin_overwritten_PROXY_CTRL"] = ctx.proxy_overwritten     # spans (PROXY_CTRL's written, lost too)
        out.update({f"plugin_written_{p}": n + (len(ctx.lines[p]) // 2) + ctx.pending(p)
                    + (ctx.stored + ctx.pend_n + len(ctx.slow) if p == "KERNEL_STEP" else 0)
                    + (ctx.chans_n if p == "KERNEL_CH" else 0)
                    for p, n in ctx.written.items()})
        return out

    def finalize(self, ctx: Ctx) -> None:
        if ctx.done:
            return
        try:
            ctx.flush_slow()
            ctx.flush_steps()
            ctx.flush_chans()
            for pool in ctx.lines:
                ctx.flush_lines(pool)
            ctx.close_writer()          # the counters below count what it wrote
            if ctx.path is None:
                return
            ctx.write(proxy_text(ctx.pid, ctx.proxy), "PROXY_CTRL", len(ctx.proxy))     # written (or lost) in spans
            args = {**ctx.host_counters, **self.counters(ctx)}
            lost = lost_counters(args)
            if lost or ctx.failed:
                ctx.write(process_meta(ctx.pid, ctx.rank, ctx.comm.comm_hash, lost, ctx.failed))
            ctx.write(json.dumps({"name": "slicetrace_counters", "ph": "M", "pid": ctx.pid, "tid": 0,
                                  "args": args}, separators=(",", ":")) + "\n]\n")
            if ctx.error is None:           # where the trace went (bench prints it; launch() and init() users)
                log.info("slicetrace example plugin rank %d: wrote %s (%d KernelSteps, %d B)", ctx.rank, ctx.path,
                         ctx.written["KERNEL_STEP"], ctx.good)
        finally:
            ctx.done = True             # a failed write (disk full) is not retried, and the file is closed anyway
            ctx.close_writer()          # finalize raised before its own call: the thread still ends
            if ctx.file is not None:
                ctx.file.close()
        if ctx.error is not None:       # the caller (the host logs it) must learn that the trace is cut short
            raise ctx.failure() from ctx.error
