"""The example plugin: events -> one Chrome-trace JSON file per rank (Perfetto opens it).

File: `<profile_dump_file>_<commHash>_<rank>.json`, commHash in decimal (as NCCL's example plugin prints it);
no dump file = events are counted and discarded. Record names, categories and args follow NCCL's example
plugin (print_event.cc); KernelStep is ours (PR #2316).

Timeline: ts = host CLOCK_MONOTONIC ns / 1000 (µs, 3 decimals = exact ns). Every rank on a host shares that
clock, so per-rank files merge into one trace; pid = rank ("rank N"). Coll/P2p/KernelCh/API events are async
b/e pairs (same cat + id; ids are rank << 32 | n, unique across merged files). KernelSteps are "X" slices from
wait to done on one thread per (channel, direction, peer), tid = 1e6 + channel*131072 + is_send*65536 + peer,
named e.g. "ch 3 send->1"; slices of one connection are sequential, so they render without overlap.

Pools (sizes from settings.pool_sizes): a pool bounds the events of one type *in flight*; a slot is retired
when its event stops, so only events beyond the pool size still in flight are dropped (and counted). Completed
records are buffered (KernelSteps as numpy column chunks) and appended to the file whenever a buffer reaches
its pool size, so memory stays bounded on long runs. The last record, "slicetrace_counters", carries the host's
drop/delivery counters (handed over by `report_counters` before `finalize`) and this plugin's own drops.
"""
from __future__ import annotations

import json
import os
from collections import deque
from typing import Any

import numpy as np

from ..config import DEFAULT_POOL_SIZES, Settings
from ..events.abi import (KERNEL_CH_DTYPE, KERNEL_STEP_DTYPE, ActivationMask, CollApiDescr, CollDescr, CommInfo,
                          EventType, GroupApiDescr, GroupDescr, KernelChDescr, KernelLaunchDescr, KernelStepDescr,
                          P2pApiDescr, P2pDescr, ProxyCtrlDescr, State, StateArgs)
from .chrome_text import CH_LINES, STEP_LINE, RowFormat, metadata, pair, us

T = EventType
DEFAULT_MASK = int(T.COLL | T.P2P | T.KERNEL_CH | T.KERNEL_STEP)      # 65606
_KCH = int(T.KERNEL_CH)
POOL_OF: dict[Any, str] = {T.GROUP_API: "GROUP_API", T.COLL_API: "COLL_API", T.P2P_API: "P2P_API",
           T.KERNEL_LAUNCH: "KERNEL_LAUNCH", T.GROUP: "GROUP", T.COLL: "COLL", T.P2P: "P2P",
           T.KERNEL_CH: "KERNEL_CH", T.KERNEL_STEP: "KERNEL_STEP", T.PROXY_CTRL: "PROXY_CTRL"}
_BY_CLASS = {cls: (POOL_OF[t], int(t)) for cls, t in (
    (GroupApiDescr, T.GROUP_API), (CollApiDescr, T.COLL_API), (P2pApiDescr, T.P2P_API),
    (KernelLaunchDescr, T.KERNEL_LAUNCH), (GroupDescr, T.GROUP), (CollDescr, T.COLL), (P2pDescr, T.P2P),
    (KernelChDescr, T.KERNEL_CH), (KernelStepDescr, T.KERNEL_STEP), (ProxyCtrlDescr, T.PROXY_CTRL))}
_CHUNK = 65536                  # KernelStep rows per column chunk
_SLOW_ROWS = 4096
_BIG_BATCH = 512                # rows per pending batch from which a fold copies batches one by one
_FORMAT_ROWS = 16384
_FORMATS: dict[str, RowFormat] = {}


class _Ev:
    __slots__ = ("ctx", "type", "pool", "id", "descr", "gpu_stop", "stopped", "ids")

    def __init__(self, ctx: "_Ctx", descr: Any, pool: str | None):
        self.ctx, self.type, self.pool, self.descr = ctx, descr.type, pool, descr
        self.id = ctx.next_id
        ctx.next_id += 1
        self.gpu_stop = 0
        self.stopped = False
        # what a child's ParentId/SeqNum columns show (read once per child batch, so computed here)
        self.ids = (-1, -1) if pool is None else (self.id, descr.seq_number if isinstance(descr, CollDescr) else -1)


class _Ctx:
    def __init__(self, plugin: "ChromePlugin", comm: CommInfo, mask: ActivationMask):
        self.comm, self.mask, self.rank = comm, mask, comm.rank
        self.sizes = dict(plugin.pool_sizes)
        self.path = (f"{plugin.dump}_{comm.comm_hash}_{comm.rank}.json" if plugin.dump else None)
        self.file: Any = None
        self.next_id = comm.rank << 32
        self.inflight = dict.fromkeys(POOL_OF.values(), 0)
        self.dropped = dict.fromkeys(POOL_OF.values(), 0)
        self.written = dict.fromkeys(POOL_OF.values(), 0)
        self.lines: dict[str, list[str]] = {p: [] for p in POOL_OF.values()}
        self.chunk_rows = min(_CHUNK, self.sizes["KERNEL_STEP"])
        self.full: list[_Chunk] = []            # filled chunks not yet written
        self.free: list[_Chunk] = []            # written chunks, reused (no fresh pages in steady state)
        self.cur: _Chunk | None = None
        self.stored = 0                         # KernelSteps buffered (<= the KERNEL_STEP pool size)
        self.pend: list[tuple] = []             # (recs, pid, seq) batches not yet copied into chunks
        self.pend_n = 0
        self.slow: list[tuple] = []             # per-event path rows, converted to a chunk in batches
        self.slow_parent: list[tuple[int, int]] = []
        self.chans: list[tuple[np.ndarray, int, int]] = []    # kernel_ch_batch: (rows, first id, parent id)
        self.chans_n = 0
        self.tids: set[tuple[int, int, int]] = set()
        self.proxy: deque[str] = deque(maxlen=self.sizes["PROXY_CTRL"])
        self.host_counters: dict[str, int] = {}
        self.passthrough = _Ev(self, _Passthrough, None)
        self.done = False

    # ---- output ----
    def write(self, text: Any) -> None:
        """Append str (utf-8) or bytes-like (formatted rows, ASCII) to the trace file."""
        if self.path is None:
            return
        if self.file is None:
            d = os.path.dirname(self.path)
            if d:
                os.makedirs(d, exist_ok=True)
            self.file = open(self.path, "wb")
            self.file.write(b"[\n")
        self.file.write(text.encode("utf-8") if isinstance(text, str) else text)

    def flush_lines(self, pool: str) -> None:
        buf = self.lines[pool]
        self.written[pool] += len(buf) // 2
        self.write("".join(buf))
        buf.clear()

    def flush_steps(self) -> None:
        self.fold()
        chunks = self.full + ([self.cur] if self.cur is not None and self.cur.fill else [])
        self.full, self.cur, self.stored = [], None, 0
        for c in chunks:
            self.written["KERNEL_STEP"] += c.fill
            if self.path is not None:
                self._write_steps(c.steps[:c.fill], c.pid[:c.fill], c.seq[:c.fill])
            c.fill = 0
        self.free.extend(chunks)

    def add_chans(self, recs: np.ndarray, pid: int) -> None:
        self.chans.append((recs, self.next_id, pid))
        self.next_id += len(recs)
        self.chans_n += len(recs)
        if self.chans_n >= self.sizes["KERNEL_CH"]:
            self.flush_chans()

    def flush_chans(self) -> None:
        """Batched KernelCh events -> b/e line pairs, formatted a block at a time like KernelSteps."""
        if not self.chans:
            return
        chans, self.chans, n = self.chans, [], self.chans_n
        self.chans_n = 0
        self.written["KERNEL_CH"] += n
        if self.path is None:
            return
        recs, lens = _concat([c[0] for c in chans], KERNEL_CH_DTYPE)
        ids = np.concatenate([np.arange(c[1], c[1] + len(c[0]), dtype=np.int64) for c in chans])
        pid = np.repeat(np.array([c[2] for c in chans], np.int64), lens)
        t0, t1 = recs["start_ns"], recs["stop_ns"]
        rank = np.full(n, self.rank, np.int64)
        cols = np.column_stack([ids, rank, t0 // 1000, t0 % 1000, recs["channel"].astype(np.int64),
                                recs["start_clk"].astype(np.int64), recs["stop_clk"].astype(np.int64), pid,
                                ids, rank, t1 // 1000, t1 % 1000])
        self._write_rows(CH_LINES, cols)

    def _write_steps(self, s: np.ndarray, pid: np.ndarray, seq: np.ndarray) -> None:
        n = len(s)
        ch, snd, peer = s["channel"].astype(np.int64), s["is_send"].astype(np.int64), s["peer"].astype(np.int64)
        tid = 1_000_000 + ch * 131072 + snd * 65536 + (peer & 0xFFFF)
        for t in (np.unique(tid) - 1_000_000).tolist():
            self.tids.add((t // 131072, (t >> 16) & 1, t & 0xFFFF))
        wait, done = s["wait_ns"], s["done_ns"]
        dur = np.maximum(done - wait, 0)
        cols = np.column_stack([
            np.full(n, self.rank, np.int64), tid, wait // 1000, wait % 1000, dur // 1000, dur % 1000, ch, snd, peer,
            s["step"].astype(np.int64), s["size"].astype(np.int64), s["wait_clk"].astype(np.int64),
            s["ready_clk"].astype(np.int64), s["done_clk"].astype(np.int64), seq, pid])
        self._write_rows(STEP_LINE, cols)

    def _write_rows(self, line: str, cols: np.ndarray) -> None:
        """One `line` per row of int64 `cols`, formatted a block of 16,384 rows at a time."""
        fmt = _FORMATS.get(line) or _FORMATS.setdefault(line, RowFormat(line))
        for a in range(0, len(cols), _FORMAT_ROWS):
            self.write(fmt(cols[a:a + _FORMAT_ROWS]))

    def add_slow(self, row: tuple, parent: Any) -> None:
        self.slow.append(row)
        self.slow_parent.append(_parent_ids(parent))
        if len(self.slow) >= _SLOW_ROWS:
            self.flush_slow()

    def flush_slow(self) -> None:
        if self.slow:
            par = np.array(self.slow_parent, np.int64).reshape(-1, 2)
            recs = np.array(self.slow, KERNEL_STEP_DTYPE)
            self.slow.clear()
            self.slow_parent.clear()
            self.fold()                         # keep arrival order
            self.copy_steps(recs, par[:, 0], par[:, 1])

    def add_steps(self, recs: np.ndarray, pid: Any, seq: Any) -> None:
        """Keep a reference to a read-only batch; batches are copied into chunks together (one copy per fold).
        pid, seq: the parent's ids (ints), or a list of (pid, seq) per run and a list of run lengths."""
        self.pend.append((recs, pid, seq))
        self.pend_n += len(recs)
        if self.pend_n >= self.chunk_rows or self.stored + self.pend_n >= self.sizes["KERNEL_STEP"] \
                or len(self.pend) >= 256:
            self.fold()

    def fold(self) -> None:
        if not self.pend:
            return
        pend, n, self.pend, self.pend_n = self.pend, self.pend_n, [], 0
        if len(pend) == 1 or n >= _BIG_BATCH * len(pend):   # one batch, or large ones (a GPU poll's): no concat
            for recs, pid, seq in pend:
                if type(pid) is list:
                    pid, seq = _per_row(pid, seq)
                self.copy_steps(recs, pid, seq)
            return
        recs, lens = _concat([p[0] for p in pend], KERNEL_STEP_DTYPE)
        ids: list = []
        runs: list = []
        for (_, pid, seq), k in zip(pend, lens):     # every batch's parents, expanded once for the fold
            if type(pid) is list:
                ids += pid
                runs += seq
            else:
                ids.append((pid, seq))
                runs.append(k)
        pid, seq = _per_row(ids, runs)
        self.copy_steps(recs, pid, seq)

    def copy_steps(self, recs: np.ndarray, pid: Any, seq: Any) -> None:
        n, pos, cap = len(recs), 0, self.sizes["KERNEL_STEP"]
        scalar = np.ndim(pid) == 0
        while pos < n:
            c = self.cur
            if c is None or c.fill == len(c.steps):
                if c is not None:
                    self.full.append(c)
                c = self.cur = self.free.pop() if self.free else _Chunk(self.chunk_rows)
            take = min(len(c.steps) - c.fill, n - pos, cap - self.stored)
            a, b = c.fill, c.fill + take
            c.rows[a:b] = _byte_rows(recs[pos:pos + take])    # structured item copies run ~15x slower
            c.pid[a:b] = pid if scalar else pid[pos:pos + take]
            c.seq[a:b] = seq if scalar else seq[pos:pos + take]
            c.fill, pos, self.stored = b, pos + take, self.stored + take
            if self.stored >= cap:              # the pool of completed records is full: write, don't drop
                self.flush_steps()


def _per_row(ids: list, lens: list) -> tuple[np.ndarray, np.ndarray]:
    """(pid, seq) per run and run lengths -> pid and seq per row."""
    a = np.repeat(np.array(ids, np.int64).reshape(-1, 2), lens, axis=0)
    return a[:, 0], a[:, 1]


def _concat(batches: list[np.ndarray], dtype: np.dtype) -> tuple[np.ndarray, list[int]]:
    """Record batches joined as bytes (concatenating structured arrays promotes their dtypes pairwise, slowly,
    in Python), and each batch's length."""
    recs = np.concatenate([_byte_rows(b) for b in batches]).view(dtype).reshape(-1)
    return recs, [len(b) for b in batches]


def _byte_rows(recs: np.ndarray) -> np.ndarray:
    """(n, itemsize) uint8 view of a 1-D record array, strided (a drain poll's KernelSteps) or not: copies of it
    move bytes, where numpy copies structured items field by field (4x slower)."""
    return recs[:, None].view(np.uint8)


class _Chunk:
    __slots__ = ("steps", "rows", "pid", "seq", "fill")

    def __init__(self, rows: int):
        self.steps = np.empty(rows, KERNEL_STEP_DTYPE)
        self.rows = _byte_rows(self.steps)
        self.pid = np.empty(rows, np.int64)
        self.seq = np.empty(rows, np.int64)
        self.fill = 0


class _PassthroughDescr:
    type = 0


_Passthrough = _PassthroughDescr()


_NO_IDS = (-1, -1)


def _parent_ids(parent: Any) -> tuple[int, int]:
    return parent.ids if type(parent) is _Ev else _NO_IDS


def _records(ev: _Ev, ts1: int) -> list[str]:
    d, t, ctx = ev.descr, ev.type, ev.ctx
    pid, _ = _parent_ids(d.parent)

    def p(name: str, cat: str, args: dict) -> list[str]:
        return pair(ev.id, ctx.rank, name, cat, d.ts_ns, ts1, args)

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


class ChromePlugin:
    """NCCL's example profiler plugin, native version 8 (v7 + KernelStep) with the KernelStep batch path."""
    name = "example"
    version = 8

    def __init__(self, settings: Settings | None = None):
        settings = settings if settings is not None else Settings()
        m = settings.profile_event_mask
        self.mask_value = DEFAULT_MASK if m is None else int(m)
        self.dump = settings.profile_dump_file
        self.pool_sizes = {**DEFAULT_POOL_SIZES, **dict(settings.pool_sizes)}

    def init(self, comm: CommInfo, mask: ActivationMask) -> _Ctx:
        mask.value = self.mask_value
        return _Ctx(self, comm, mask)

    def start_event(self, ctx: _Ctx, descr: Any) -> _Ev | None:
        pool, bit = _BY_CLASS.get(type(descr), (None, 0))    # by class: IntFlag arithmetic is slow
        if pool is None or not ctx.mask.value & bit:
            return ctx.passthrough      # a parent we do not record: children must still find a handle
        if pool == "PROXY_CTRL":
            return _Ev(ctx, descr, pool)          # ring of the last states, overwritten (no pool check)
        if ctx.inflight[pool] >= ctx.sizes[pool]:
            ctx.dropped[pool] += 1
            return None
        ctx.inflight[pool] += 1
        return _Ev(ctx, descr, pool)

    def unrecorded_handle(self, ctx: _Ctx) -> _Ev:
        """What start_event returns, without side effects, for types outside the live mask (the host skips them)."""
        return ctx.passthrough

    def record_event_state(self, handle: _Ev, state: State, args: StateArgs) -> None:
        if state == 22 or state == 32:            # KernelChStop, KernelStepStop (ints: enum compare is slow)
            handle.gpu_stop = args.p_timer
        elif handle.pool == "PROXY_CTRL":
            name = State(state).name.replace("PROXY_CTRL_", "").title()
            handle.ctx.proxy.append(f'{{"name":"{name}","cat":"PROXY","ph":"i","s":"t","pid":{handle.ctx.rank},'
                                    f'"tid":2,"ts":{us(args.ts_ns)}}},\n')

    def stop_event(self, handle: _Ev, ts_ns: int) -> None:
        pool = handle.pool
        if pool is None or handle.stopped or pool == "PROXY_CTRL":
            return
        handle.stopped = True
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
        buf.extend(_records(handle, ts_ns))
        if len(buf) >= 2 * ctx.sizes[pool]:
            ctx.flush_lines(pool)

    def kernel_step_batch(self, ctx: _Ctx, parent: Any, recs: np.ndarray) -> int:
        if not ctx.done:
            ctx.add_steps(recs, *_parent_ids(parent))
        return len(recs)

    def kernel_step_runs(self, ctx: _Ctx, parents: list, recs: np.ndarray, starts: list[int],
                         stops: list[int]) -> int:
        """kernel_step_batch for a whole poll: contiguous runs stay one pending batch with a parent per row."""
        n = sum(stops) - sum(starts)
        if ctx.done:
            return n
        ids = [p.ids if type(p) is _Ev else _NO_IDS for p in parents]     # _parent_ids, inlined: a call per op
        if stops[:-1] == starts[1:]:                # contiguous runs: one pending batch, parents per run
            ctx.add_steps(recs[starts[0]:stops[-1]], ids, [b - a for a, b in zip(starts, stops)])
        else:
            for (pid, seq), a, b in zip(ids, starts, stops):
                ctx.add_steps(recs[a:b], pid, seq)
        return n

    def kernel_ch_batch(self, ctx: _Ctx, parent: Any, recs: np.ndarray) -> int:
        """Whole KernelCh events: never in flight, so the pool only bounds the buffer (written when full)."""
        if not ctx.done and ctx.mask.value & _KCH:
            ctx.add_chans(recs, _parent_ids(parent)[0])
        return len(recs)

    def report_counters(self, ctx: _Ctx, counters: dict[str, int]) -> None:
        ctx.host_counters = dict(counters)

    def counters(self, ctx: _Ctx) -> dict[str, int]:
        """This plugin's own accounting: drops, unfinished (still in flight) and written events per pool."""
        out = {f"plugin_dropped_{p}": n for p, n in ctx.dropped.items()}
        out.update({f"plugin_unfinished_{p}": n for p, n in ctx.inflight.items()})
        out.update({f"plugin_written_{p}": n + (len(ctx.lines[p]) // 2)
                    + (ctx.stored + ctx.pend_n + len(ctx.slow) if p == "KERNEL_STEP" else 0)
                    + (ctx.chans_n if p == "KERNEL_CH" else 0)
                    for p, n in ctx.written.items()})
        return out

    def finalize(self, ctx: _Ctx) -> None:
        if ctx.done:
            return
        ctx.flush_slow()
        ctx.flush_steps()
        ctx.flush_chans()
        for pool in ctx.lines:
            ctx.flush_lines(pool)
        ctx.done = True
        if ctx.path is None:
            return
        ctx.write("".join(ctx.proxy))
        ctx.write(metadata(ctx.rank, ctx.tids))
        args = {**ctx.host_counters, **self.counters(ctx)}
        ctx.write(json.dumps({"name": "slicetrace_counters", "ph": "M", "pid": ctx.rank, "tid": 0, "args": args},
                             separators=(",", ":")) + "\n]\n")
        ctx.file.close()
