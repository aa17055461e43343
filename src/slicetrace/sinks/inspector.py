"""NCCL Inspector's output (the `inspector` built-in): a JSON line per completed collective, which NCCL's Inspector
tooling (its perf_summary_exporter -> parquet, Kibana) reads as it reads the Inspector plugin's logs.

One file per process, `<dir>/<hostname>-pid<pid>.log`, which every communicator of the process appends to (as
NCCL's Inspector). A line is {"header", "metadata", "coll_perf"} in Inspector's v4.0 format:
* coll_exec_time_us: from the first start to the last stop of the op's KernelCh records (its channel programs;
  timing source "kernel_gpu" on cuda, whose clocks are the GPU's, "kernel_cpu" on cpu, whose KernelCh are timed on
  the host); an op without them (its mask had no KernelCh, or one rank: no channel program) from its Coll event's
  start to its stop ("collective_cpu"); a count of 0 (no kernel ran, nothing moved) "collective_cpu" with 0 us and
  bandwidths 0, as Inspector's for a zero time. Rounded to the microsecond; the bandwidths come from the nanosecond
  span.
* coll_msg_size_bytes: count x element size, for AllGather and ReduceScatter x n_ranks (the whole buffer, as
  nccl-tests' `size` and `slicetrace bench`'s; plan.traffic.message_bytes); coll_algobw_gbs = bytes / time and
  coll_busbw_gbs = algbw x nccl-tests' factor (plan.traffic.busbw_factor).
* coll_sn: the Coll event's SeqNum (NCCL's seqNumber: per communicator and collective function).
Point-to-point operations (send, recv, all_to_all) are not in the output: Inspector reports collectives only.

SLICETRACE_INSPECTOR_DUMP_INTERVAL_US=0 (the default) writes every collective; > 0 samples as Inspector's dump
thread does: per communicator, the latest completed collective at most once per interval, and the last one at
close. SLICETRACE_INSPECTOR_VERBOSE=1 adds event_trace_sn / event_trace_ts with the per-channel kernel events.

The callbacks only buffer: lines are formatted and appended by a thread per file (chrome_writer.Writer), in blocks,
at least once a second while collectives complete, and at close. A write that fails (a full disk) cuts the file
back to its last whole line, later lines are counted lost, and finalize raises OSError saying how many. A writer
that falls behind (a hung or very slow filesystem) holds at most _QUEUED lines: a block past that is dropped and
counted (plugin_dropped_COLL), never waited for, as the example plugin's full pools drop.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from importlib import metadata
from typing import Any

import numpy as np

from ..config import Settings, inspector_dir, inspector_dir_named
from ..errors import ConfigError
from ..events.abi import DATATYPE_NAMES, FUNC_NAMES, ActivationMask, CollDescr, CommInfo, EventType, lost_counters
from ..plan.traffic import BUSBW_FACTOR, busbw_factor, message_bytes
from .chrome_store import write_all
from .chrome_writer import Writer

log = logging.getLogger("slicetrace")
MASK = int(EventType.COLL | EventType.KERNEL_CH)         # what NCCL's Inspector asks for
FORMAT_VERSION = "v4.0"
_OP = {v: k for k, v in FUNC_NAMES.items()}               # "AllGather" -> "all_gather"
_ITEMSIZE = {nccl: 2 if name == "bfloat16" else np.dtype(name).itemsize for name, nccl in DATATYPE_NAMES.items()}
_BATCH = 1024               # lines per write job
_FLUSH_NS = 1_000_000_000   # ... or what completed in the last second, whichever comes first
_QUEUED = 64 * _BATCH       # lines its writer may be behind: ~0.6 KiB each (measured), verbose ~0.1 KiB a channel more
_AT_EXIT_S = 5.0            # finalize's wait at the interpreter's exit (session._finish_at_exit's budget)
_HEAD = ('{"header":{"id":"0x%x","rank":%d,"n_ranks":%d,"nnodes":%d},"metadata":{"inspector_output_format_version":'
         '"' + FORMAT_VERSION + '","git_rev":%s,"rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":')
_TAIL = (',"hostname":%s,"pid":%d},"coll_perf":{"coll":%s,"coll_sn":%d,"coll_msg_size_bytes":%d,'
         '"coll_exec_time_us":%d,"coll_timing_source":"%s","coll_algobw_gbs":%r,"coll_busbw_gbs":%r')
_rev: list[str] = []


def git_rev() -> str:
    """metadata.git_rev: slicetrace's version (Inspector writes NCCL's git revision there)."""
    if not _rev:
        try:
            _rev.append(f"slicetrace-{metadata.version('slicetrace')}")
        except metadata.PackageNotFoundError:       # a source tree on PYTHONPATH
            _rev.append("slicetrace-unknown")
    return _rev[0]


class _Coll:
    """A Coll event in flight: its descriptor, the span of its KernelCh records, and (verbose) the records."""
    __slots__ = ("ctx", "descr", "first", "last", "sn", "kernels")

    def __init__(self, ctx: "_Ctx", descr: CollDescr, sn: int):
        self.ctx, self.descr, self.sn = ctx, descr, sn
        self.first = self.last = None
        self.kernels: list[tuple[int, int, int, int]] | None = [] if ctx.verbose else None


_IGNORED = object()          # the handle of every other event (children must find a parent): nothing recorded


class _File:
    """The process's file in one folder, shared by its communicators; one writer thread appends to it."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.good = os.fstat(self.fd).st_size       # bytes up to the end of the last whole line
        self.error: OSError | None = None
        self.users = 0
        self.writer = Writer(f"slicetrace-inspector-{os.getpid()}", 1 << 62)

    def write(self, mv: memoryview) -> int:
        return os.write(self.fd, mv)

    def append(self, data: bytes) -> None:
        """Writer thread: append whole lines; the first failure cuts the file back to its last whole line and
        ends the writing (OSError, now and for every later call)."""
        if self.error is not None:
            raise self.error
        try:
            write_all(self, data)          # os.write may take part of it
        except OSError as e:
            self.error = e
            try:
                os.ftruncate(self.fd, self.good)
            except OSError:
                pass
            log.error("slicetrace inspector plugin: writing %s failed (%s): it ends at its last whole line (byte "
                      "%d); later lines are not written (counted as plugin_lost_COLL)", self.path, e.strerror or e,
                      self.good)
            raise
        self.good += len(data)


_FILES: dict[str, _File] = {}
_FILES_LOCK = threading.Lock()


def _take_file(path: str) -> _File:
    with _FILES_LOCK:
        f = _FILES.get(path)
        if f is None:
            f = _FILES[path] = _File(path)
        f.users += 1
        return f


def _release_file(f: _File, wait_s: float) -> None:
    with _FILES_LOCK:
        f.users -= 1
        if f.users:
            return
        del _FILES[f.path]
    if f.writer.close(wait_s):       # a write still hanging keeps its descriptor
        os.close(f.fd)


class _Ctx:
    def __init__(self, comm: CommInfo, s: Settings, file: _File):
        self.comm, self.file = comm, file
        self.interval_ns = s.inspector_dump_interval_us * 1000
        self.verbose = s.inspector_verbose
        self.timeout_s = s.timeout_s
        self.source = "kernel_gpu" if comm.backend == "cuda" else "kernel_cpu"
        self.head = _HEAD % (comm.comm_hash, comm.rank, comm.n_ranks, comm.n_nodes, json.dumps(git_rev()))
        self.host = json.dumps(socket.gethostname())
        self.pid = os.getpid()
        self.sn = 0                         # callbacks seen, in order (verbose: event_trace_sn)
        self.inflight = 0                   # Coll events started, not stopped
        self.seqs: dict[str, int] = {}      # the last SeqNum seen per function: its gaps count collectives unseen
        self.unseen = 0
        self.lines: list[tuple] = []        # (coll, stop ns, wall us, stop sn) completed, not handed to the writer
        self.flushed_ns = time.monotonic_ns()
        self.latest: tuple | None = None    # interval sampling: the latest completed since the last line
        self.next_ns = 0
        self.completed = self.handed = 0    # main side; the writer thread counts written and lost
        self.dropped = 0                    # lines refused: the writer was _QUEUED lines behind
        self.written = self.lost = 0
        self.host_counters: dict[str, int] = {}
        self.done = False

    def flush(self) -> None:
        lines, self.lines = self.lines, []
        self.flushed_ns = time.monotonic_ns()
        w = self.file.writer
        if lines and w.pending("COLL") + len(lines) > _QUEUED:     # a hung disk: memory is not the place to wait
            if not self.dropped:
                log.warning("slicetrace inspector plugin: the writer of %s is %d lines behind (a hung or slow "
                            "filesystem?): lines are dropped until it catches up (counted as plugin_dropped_COLL)",
                            self.file.path, w.pending("COLL"))
            self.dropped += len(lines)
        elif lines:
            self.handed += len(lines)
            w.put(lambda: self._write(lines), "COLL", len(lines))

    def _write(self, lines: list[tuple]) -> None:
        """Writer thread: format and append; every line is counted written or lost."""
        try:
            self.file.append("".join(map(self.line, lines)).encode("utf-8"))
        except BaseException as e:       # noqa: BLE001 - a full disk, or a bug: counted, said at finalize
            self.lost += len(lines)
            if not isinstance(e, OSError):
                log.error("slicetrace inspector plugin: formatting %d line(s) failed: %r", len(lines), e)
                if not isinstance(e, Exception):
                    raise
            return
        self.written += len(lines)

    def line(self, rec: tuple) -> str:
        """One collective's line, in Inspector's format."""
        h, stop_ns, wall_us, stop_sn = rec
        d, n = h.descr, self.comm.n_ranks
        op = _OP.get(d.func, "")
        size = message_bytes(op, d.count, _ITEMSIZE.get(d.datatype, 0), n)
        if h.first is not None:
            t0, t1, src = h.first, h.last, self.source
        else:                   # a count of 0 ran no kernel: its host span is no transfer time, so 0 us
            t0, t1, src = d.ts_ns, d.ts_ns if d.count == 0 else stop_ns, "collective_cpu"
        span = max(t1 - t0, 0)
        algbw = size / span if span else 0.0            # bytes per ns = GB/s
        busbw = algbw * (busbw_factor(op, n) if op in BUSBW_FACTOR else 1.0)
        text = self.head + str(wall_us) + _TAIL % (self.host, self.pid, json.dumps(d.func), d.seq_number, size,
                                                   (span + 500) // 1000, src, algbw, busbw)
        if h.kernels is not None:
            text += _verbose(h, d.ts_ns, stop_ns, stop_sn)
        return text + "}}\n"


def _verbose(h: _Coll, start_ns: int, stop_ns: int, stop_sn: int) -> str:
    """event_trace_sn and event_trace_ts: the Coll's and each KernelCh's callbacks (start, the KernelChStop record,
    stop) in the order the plugin saw them, and their times in microseconds (CLOCK_MONOTONIC)."""
    ks = h.kernels or []
    sn = {"coll_start_sn": h.sn, "coll_stop_sn": stop_sn, "kernel_events": [
        {"channel_id": c, "kernel_start_sn": k, "kernel_stop_sn": k + 2, "kernel_record_sn": k + 1}
        for c, _, _, k in ks]}
    ts = {"coll_start_ts": start_ns // 1000, "coll_stop_ts": stop_ns // 1000, "kernel_events": [
        {"channel_id": c, "kernel_start_ts": t0 // 1000, "kernel_stop_ts": t1 // 1000, "kernel_record_ts": t1 // 1000}
        for c, t0, t1, _ in ks]}
    return (',"event_trace_sn":' + json.dumps(sn, separators=(",", ":")) + ',"event_trace_ts":'
            + json.dumps(ts, separators=(",", ":")))


class InspectorPlugin:
    """NCCL Inspector's JSON-lines output, native version 8, KernelCh in batches."""
    name = "inspector"
    version = 8

    def __init__(self, settings: Settings | None = None):
        self.settings = settings if settings is not None else Settings()

    def init(self, comm: CommInfo, mask: ActivationMask) -> _Ctx:
        mask.value = MASK
        s = self.settings
        # absolute: a later chdir of the application must not move the file
        folder = os.path.join(os.getcwd(), inspector_dir(s))
        path = os.path.join(folder, f"{socket.gethostname()}-pid{os.getpid()}.log")
        what = inspector_dir_named(s)
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise ConfigError(f"{what}: {folder} is not a folder; give a writable folder")
        try:
            os.makedirs(folder, exist_ok=True)
            file = _take_file(path)
        except OSError as e:
            raise ConfigError(f"{what}: cannot create {path}: {e.strerror or e}; give a writable folder") from e
        return _Ctx(comm, s, file)

    def start_event(self, ctx: _Ctx, descr: Any) -> Any:
        if descr.__class__ is not CollDescr:
            return _IGNORED
        last = ctx.seqs.get(descr.func, -1)
        if descr.seq_number > last + 1:     # collectives run between two seen ones that no Coll event told
            ctx.unseen += descr.seq_number - last - 1
        ctx.seqs[descr.func] = descr.seq_number
        ctx.inflight += 1
        ctx.sn += 1
        return _Coll(ctx, descr, ctx.sn)

    def unrecorded_handle(self, ctx: _Ctx) -> Any:
        """What start_event returns, without side effects, for the parents outside MASK (P2p, API, Group, ...)."""
        return _IGNORED

    def stop_event(self, handle: Any, ts_ns: int) -> None:
        if handle.__class__ is not _Coll:
            return
        ctx = handle.ctx
        ctx.inflight -= 1
        if ctx.done:
            return
        ctx.completed += 1
        ctx.sn += 1
        rec = (handle, ts_ns, time.time_ns() // 1000, ctx.sn)
        now = time.monotonic_ns()
        if ctx.interval_ns:
            if now < ctx.next_ns:
                ctx.latest = rec            # written if still the latest when the interval has passed, or at close
                return
            ctx.next_ns, ctx.latest = now + ctx.interval_ns, None
        ctx.lines.append(rec)
        if len(ctx.lines) >= _BATCH or now - ctx.flushed_ns >= _FLUSH_NS:
            ctx.flush()

    def record_event_state(self, handle: Any, state: Any, args: Any) -> None:
        pass                                # KernelCh come whole (kernel_ch_runs); Coll has no states

    def kernel_ch_batch(self, ctx: _Ctx, parent: Any, recs: np.ndarray) -> int:
        return self.kernel_ch_runs(ctx, [parent], recs, [0], [len(recs)])

    def kernel_ch_runs(self, ctx: _Ctx, parents: list, recs: np.ndarray, starts: list[int], stops: list[int]) -> int:
        """A poll's KernelCh records: per collective, the earliest start and the latest stop (one reduce per poll)."""
        n = sum(stops) - sum(starts)
        if not n or ctx.done:
            return n
        st, sp = recs["start_ns"], recs["stop_ns"]
        a0, b0 = starts[0], stops[-1]
        if stops[:-1] == starts[1:] and all(b > a for a, b in zip(starts, stops)):     # contiguous, none empty
            if b0 - a0 == len(starts):              # a row per run (one channel): no reduce
                lo, hi = st[a0:b0].tolist(), sp[a0:b0].tolist()
            else:
                at = np.asarray(starts) - a0
                lo = np.minimum.reduceat(st[a0:b0], at).tolist()
                hi = np.maximum.reduceat(sp[a0:b0], at).tolist()
        else:
            lo = [int(st[a:b].min()) if b > a else None for a, b in zip(starts, stops)]
            hi = [int(sp[a:b].max()) if b > a else None for a, b in zip(starts, stops)]
        for p, t0, t1, a, b in zip(parents, lo, hi, starts, stops):
            if p.__class__ is not _Coll or t0 is None:
                continue                    # a point-to-point op's: not in Inspector's output
            if p.first is None or t0 < p.first:
                p.first = t0
            if p.last is None or t1 > p.last:
                p.last = t1
            if p.kernels is not None:
                for c, t0, t1 in zip(recs["channel"][a:b].tolist(), st[a:b].tolist(), sp[a:b].tolist()):
                    p.kernels.append((c, t0, t1, ctx.sn + 1))      # start, KernelChStop record, stop
                    ctx.sn += 3
        return n

    def report_counters(self, ctx: _Ctx, counters: dict[str, int]) -> None:
        ctx.host_counters = dict(counters)

    def counters(self, ctx: _Ctx) -> dict[str, int]:
        """This plugin's accounting: collectives written, left out by the interval, lost to a failed write, dropped
        (the writer _QUEUED lines behind), queued and not yet written, still in flight (unfinished), and never
        seen: gaps in a function's SeqNum, collectives that ran with no Coll event (unprofiled on purpose:
        profiling(False), op sampling, below min bytes, a profiling mask without Coll or KernelCh; or dropped by
        the host, which counts those)."""
        pending = len(ctx.lines) + (ctx.latest is not None)
        return {"plugin_written_COLL": ctx.written,
                "plugin_sampled_out_COLL": ctx.completed - ctx.handed - ctx.dropped - pending,
                "plugin_lost_COLL": ctx.lost, "plugin_dropped_COLL": ctx.dropped,
                "plugin_queued_COLL": ctx.handed - ctx.written - ctx.lost + pending,
                "plugin_unfinished_COLL": ctx.inflight, "plugin_unseen_COLL": ctx.unseen}

    def finalize(self, ctx: _Ctx) -> None:
        """Write what is buffered and wait for it (timeout_s; 5 s at the interpreter's exit); raise OSError when
        lines were lost to a failed write."""
        if ctx.done:
            return
        if ctx.latest is not None:
            ctx.lines.append(ctx.latest)
            ctx.latest = None
        ctx.flush()
        ctx.done = True
        f = ctx.file
        wait = ctx.timeout_s if threading.main_thread().is_alive() else min(ctx.timeout_s, _AT_EXIT_S)
        written = threading.Event()
        f.writer.put(written.set)
        if not written.wait(wait):
            log.error("slicetrace inspector plugin: writing %s has not finished in %g s; %d line(s) of rank %d "
                      "are not written", f.path, wait, ctx.handed - ctx.written - ctx.lost, ctx.comm.rank)
        _release_file(f, wait if written.is_set() else 0.0)
        own = self.counters(ctx)
        lost = {**lost_counters(ctx.host_counters),
                **{k: v for k, v in own.items() if v and k in ("plugin_lost_COLL", "plugin_dropped_COLL",
                                                                "plugin_queued_COLL", "plugin_unfinished_COLL")}}
        if lost:
            log.warning("slicetrace inspector plugin rank %d (comm 0x%x): collectives missing from %s: %s",
                        ctx.comm.rank, ctx.comm.comm_hash, f.path, ", ".join(f"{k} {v:,}" for k, v in lost.items()))
        if ctx.lost:
            e = f.error
            why = (e.strerror or e) if e is not None else "formatting its lines failed, logged"
            raise OSError(getattr(e, "errno", None), f"slicetrace inspector plugin: writing {f.path!r} failed "
                          f"({why}); it ends at its last whole line (byte {f.good}), "
                          f"and {ctx.lost} line(s) of rank {ctx.comm.rank} (comm 0x{ctx.comm.comm_hash:x}) are lost; "
                          f"free space or give inspector_dump_dir (SLICETRACE_INSPECTOR_DUMP_DIR) a folder on "
                          f"another filesystem")
        log.info("slicetrace inspector plugin rank %d: %d collective line(s) in %s (%d left out by the interval, "
                 "%d run without a Coll event)", ctx.comm.rank, ctx.written, f.path, own["plugin_sampled_out_COLL"],
                 ctx.unseen)
