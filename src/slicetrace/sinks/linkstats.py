"""A small plugin: per-link bytes and time, no trace file (the `linkstats` built-in).

Keeps, per (channel, direction, peer): slices, bytes, time spent waiting (ready - wait) and moving data
(done - ready; a fused slice from the later ready of its two directions, events.abi.moving_from). Its own work
is one call per drain poll; `snapshot()` returns the table, `finalize` logs a summary. With `linkstats_file` set
it also writes the table as Prometheus text (`<prefix>_<commHash>_<rank>.prom`, for node_exporter's textfile
collector), at most every `linkstats_interval_s` as KernelSteps arrive, at least that often (once a second at most)
while the communicator is open, so that an idle job's file stays fresh, and at finalize. Every write carries the
host's loss counters: live ones (the host's `live_counters` reader), the final ones at close. The writes run on a
thread of their own (_Writer), off the host's lock. It is also the reference for writing a plugin: native version
8, batch paths for KernelSteps, nothing else recorded.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

import numpy as np

from ..config import Settings
from ..errors import ConfigError
from ..events.abi import ActivationMask, CommInfo, EventType, moving_from

log = logging.getLogger("slicetrace")
# finalize's wait for a write at the interpreter's exit (threading's shutdown, before the atexit handlers, has
# ended the main thread): session._finish_at_exit's budget for all plugins
_AT_EXIT_S = 5.0
# an idle file is rewritten only to keep its mtime (and counters) fresh, which scrapers judge in seconds: a
# sub-second interval (a rewrite as KernelSteps arrive) must not make the writer spin while nothing arrives
_IDLE_MIN_S = 1.0


class _Ctx:
    def __init__(self, comm: CommInfo, prefix: str | None, s: Settings):
        self.comm = comm
        self.table: dict[tuple[int, int, int], np.ndarray] = {}   # key -> [slices, bytes, wait_ns, xfer_ns]
        # absolute: a later chdir of the application must not move the file; joined, not abspath'd, so a prefix
        # that names a folder ('textfile/') keeps its '/' and the files go inside it, as the example plugin's do
        self.path = f"{os.path.join(os.getcwd(), prefix)}_{comm.comm_hash}_{comm.rank}.prom" if prefix else None
        self.interval_s = s.linkstats_interval_s
        self.timeout_s = s.timeout_s
        self.writer: _Writer | None = None      # started at init (with a path)
        self.lock = threading.Lock()            # the table: the drain adds, the writer copies
        self.host_counters: dict[str, int] = {}
        self.read_counters: Any = None          # the host's live reader (live_counters); None once the final came
        self.sampling = {"kernel_step_sample_rate": s.sample_rate, "op_sample_rate": s.op_sample_rate,
                         "profile_min_bytes": s.profile_min_bytes}      # the last one in bytes: a gauge of its own
        self.failing = False        # the last write failed: said once, tried again at the next


_SAMPLED = " (of the profiled ops' kept slices only: see slicetrace_sampling, slicetrace_profile_min_bytes)"
_METRICS = (("slices_total", "KernelStep slices of this link" + _SAMPLED, 1.0),
            ("bytes_total", "Bytes that this link's slices moved" + _SAMPLED, 1.0),
            ("wait_seconds_total", "Time its slices waited for data (recv) or credit (send): ready - wait" + _SAMPLED,
             1e-9),
            ("transfer_seconds_total", "Time its slices spent moving data: done - ready, a fused slice's two "
             "directions from the later of their ready clocks" + _SAMPLED, 1e-9))


def prometheus_text(comm: CommInfo, table: dict, counters: dict[str, int], sampling: dict | None = None) -> str:
    """The link table (and loss counters) in the Prometheus text format; rate(bytes) / rate(transfer_seconds) is
    a link's bandwidth per channel while it moves data (C channels at once move up to C times that)."""
    base = f'comm="{comm.comm_hash}",comm_name="{_escape(comm.comm_name)}",rank="{comm.rank}"'
    lines = []
    if sampling:                    # the counters count what was profiled and kept, not everything: say how much
        # one unit per family: the two "1 in k" settings together, the size threshold in a _bytes gauge
        rates = {k: v for k, v in sampling.items() if k != "profile_min_bytes"}
        lines += ["# HELP slicetrace_sampling The settings that leave slices or ops out of the link counters, as k of "
                  "1 in k: slices of each direction, ops.", "# TYPE slicetrace_sampling gauge"]
        lines += [f'slicetrace_sampling{{{base},setting="{k}"}} {int(v)}' for k, v in rates.items()]
        if "profile_min_bytes" in sampling:
            lines += ["# HELP slicetrace_profile_min_bytes Ops below this size are left out of the link counters.",
                      "# TYPE slicetrace_profile_min_bytes gauge",
                      f"slicetrace_profile_min_bytes{{{base}}} {int(sampling['profile_min_bytes'])}"]
    for col, (name, help_, scale) in enumerate(_METRICS):
        lines += [f"# HELP slicetrace_link_{name} {help_}.", f"# TYPE slicetrace_link_{name} counter"]
        for (c, snd, peer), v in sorted(table.items()):
            val = int(v[col]) if scale == 1.0 else f"{v[col] * scale:.9f}"
            lines.append(f'slicetrace_link_{name}{{{base},channel="{c}",direction="{"send" if snd else "recv"}",'
                         f'peer="{peer}"}} {val}')
    counts = {k: int(v) for k, v in sorted(counters.items()) if not k.endswith("_ns")}
    if counts:
        lines += ["# HELP slicetrace_profiler_accounting_total The profiler host's accounting: records lost or left "
                  "out by reason, plugin failures.", "# TYPE slicetrace_profiler_accounting_total counter"]
        lines += [f'slicetrace_profiler_accounting_total{{{base},counter="{_escape(k)}"}} {v}'
                  for k, v in counts.items()]
    for k in ("clock_offset_ns", "clock_uncertainty_ns"):
        if k in counters:
            name = f"slicetrace_{k[:-3]}_seconds"
            lines += [f"# HELP {name} Device clock to host clock {k.split('_')[1]} at the last resync.",
                      f"# TYPE {name} gauge", f"{name}{{{base}}} {int(counters[k]) * 1e-9:.9f}"]
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    # a name from bytes that are not UTF-8 (os.fsdecode: lone surrogates) is written as escapes, never refused
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_atomic(path: str, text: str) -> None:
    """Readers (a textfile collector) never see half a file: write a temporary one, then rename it over. (The
    layers keep sinks from analyze.atomic, which does this for the analyzer's and the CLI's outputs.)"""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"    # two writers of one path never share it
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "w", encoding="utf-8") as f:
            with contextlib.suppress(OSError):      # readable by a collector of another user, whatever the umask
                os.fchmod(f.fileno(), 0o644)
            f.write(text)                           # utf-8: the locale's encoding may not take a comm name
        os.replace(tmp, path)
    except BaseException:           # a full disk, or any other error: leave no temporary file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _put(ctx: _Ctx, table: dict) -> None:
    """The table as ctx.path now, with the counters as they are now; its folder made first (at init, and again if
    it was removed)."""
    os.makedirs(os.path.dirname(ctx.path) or ".", exist_ok=True)
    read = ctx.read_counters
    write_atomic(ctx.path, prometheus_text(ctx.comm, table, ctx.host_counters if read is None else read(),
                                           ctx.sampling))


def _copy(ctx: _Ctx) -> dict:
    with ctx.lock:                  # the drain adds on meanwhile
        return {k: v.copy() for k, v in ctx.table.items()}


class _Writer:
    """Writes the snapshots on a thread of its own: the host calls plugins under its lock, which the drain and the
    user's next op wait for, and a slow or hung filesystem (NFS) must hold neither. Writes start every_s apart at
    least: a snapshot handed over sooner waits, and only the latest is kept. With none handed over for idle_s, it
    takes one itself (snap()): a live job's file never looks stale."""

    def __init__(self, write: Any, snap: Any, every_s: float, idle_s: float, name: str):
        self._write, self._snap, self._every, self._idle = write, snap, every_s, idle_s
        self._cv = threading.Condition()
        self._pending: dict | None = None
        self._busy = self._stop = False
        self.next_at = time.monotonic() + every_s     # init has just written the file
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, table: dict) -> None:
        with self._cv:
            self._pending = table
            self._cv.notify_all()

    def idle(self, timeout_s: float) -> bool:
        """Wait until every snapshot handed over is written (or failed); False at the timeout."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while (self._pending is not None or self._busy) and self._thread.is_alive():
                if not self._cv.wait(end - time.monotonic()):
                    return False
        return True

    def close(self, timeout_s: float) -> bool:
        """Write what is pending, then end the thread; False if a write is still running after timeout_s."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _due(self) -> float:
        """Seconds until the next write (<= 0: now); under self._cv."""
        last = self.next_at - self._every
        return (self.next_at if self._pending is not None else last + self._idle) - time.monotonic()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (wait := self._due()) > 0:
                    self._cv.wait(wait)
                if self._stop and self._pending is None:
                    return
                table, self._pending = self._pending, None
                self._busy = True
                self.next_at = time.monotonic() + self._every
            try:
                self._write(self._snap() if table is None else table)
            except BaseException as e:      # noqa: BLE001 - _write logs OSError; anything else must not end it
                log.error("slicetrace linkstats: writing the metrics file failed: %r", e)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()


class LinkStatsPlugin:
    name = "linkstats"
    version = 8

    def __init__(self, settings: Settings | None = None):
        self.settings = settings

    def init(self, comm: CommInfo, mask: ActivationMask) -> _Ctx:
        mask.value = int(EventType.KERNEL_STEP)          # parents (Coll/P2p) are added by the host
        s = self.settings or Settings()
        ctx = _Ctx(comm, s.linkstats_file, s)
        if ctx.path is not None:
            try:                        # an empty table now: a path that cannot be written is refused before any op
                _put(ctx, ctx.table)
            except OSError as e:
                raise ConfigError(f"linkstats_file (SLICETRACE_LINKSTATS_FILE)={s.linkstats_file!r}: cannot write "
                                  f"{ctx.path}: {e.strerror or e}; give a prefix in a writable folder") from e
            ctx.writer = _Writer(lambda table: self._write(ctx, table), lambda: _copy(ctx), ctx.interval_s,
                                 max(ctx.interval_s, _IDLE_MIN_S), f"slicetrace-linkstats-{comm.rank}")
        return ctx

    def live_counters(self, ctx: _Ctx, read: Any) -> None:
        """The host's reader of this plugin's counters: each periodic write carries them (report_counters' at close)."""
        ctx.read_counters = read

    def start_event(self, ctx: _Ctx, descr: Any) -> Any:
        return ctx                                       # a handle for parents; nothing is recorded

    def stop_event(self, handle: Any, ts_ns: int) -> None:
        pass

    def record_event_state(self, handle: Any, state: Any, args: Any) -> None:
        pass

    def kernel_step_batch(self, ctx: _Ctx, parent: Any, recs: np.ndarray) -> int:
        self._add(ctx, recs, recs["channel"])
        return len(recs)

    def kernel_step_runs(self, ctx: _Ctx, parents: list, recs: np.ndarray, starts: list[int],
                         stops: list[int]) -> int:
        """A whole drain poll in one pass (a call per op would cost more than the op's own profiling)."""
        lens = [b - a for a, b in zip(starts, stops)]
        if stops[:-1] == starts[1:]:
            rows = recs[starts[0]:stops[-1]] if starts else recs[:0]
        else:
            rows = np.concatenate([recs[a:b] for a, b in zip(starts, stops)])
        run = np.repeat(np.arange(len(lens)), lens)
        self._add(ctx, rows, run, rows["channel"])
        return len(rows)

    def _add(self, ctx: _Ctx, recs: np.ndarray, *keys: np.ndarray) -> None:
        """Add records to the link table; `keys` tell parents and channels apart for events.abi.moving_from."""
        if len(recs):
            key = (recs["channel"].astype(np.int64) << 33) | (recs["is_send"].astype(np.int64) << 32) \
                | recs["peer"].astype(np.int64) & 0xFFFFFFFF
            uk, inv = np.unique(key, return_inverse=True)
            cols = (None, recs["size"], recs["ready_ns"] - recs["wait_ns"], recs["done_ns"] - moving_from(recs, *keys))
            sums = np.rint([np.bincount(inv, weights=c, minlength=len(uk)) for c in cols]).astype(np.int64).T
            table = ctx.table
            with ctx.lock:
                for k, add in zip(uk.tolist(), sums):
                    t = (k >> 33, (k >> 32) & 1, k & 0xFFFFFFFF)
                    row = table.get(t)
                    if row is None:
                        table[t] = add.copy()
                    else:
                        row += add
        w = ctx.writer
        if w is not None and time.monotonic() >= w.next_at:
            w.put(_copy(ctx))

    def _write(self, ctx: _Ctx, table: dict, last: bool = False) -> None:
        try:
            _put(ctx, table)
        except OSError as e:            # a metrics file must not stop the job: say so once, try again later
            if last:                    # no later: the final table (with the host's counters) is lost, say so
                log.error("slicetrace linkstats: cannot write %s (%s) at close; its final table is lost",
                          ctx.path, e)
            elif not ctx.failing:
                log.error("slicetrace linkstats: cannot write %s (%s); trying again every %g s and at close",
                          ctx.path, e, ctx.interval_s)
            ctx.failing = True
        else:
            if ctx.failing:
                log.warning("slicetrace linkstats: %s written again", ctx.path)
            ctx.failing = False

    def report_counters(self, ctx: _Ctx, counters: dict[str, int]) -> None:
        ctx.host_counters = dict(counters)      # the final counters: what the last writes carry
        ctx.read_counters = None

    def snapshot(self, ctx: _Ctx) -> list[dict]:
        # Python numbers only: numpy 2 shows its scalars as np.float64(...) in finalize's summary lines
        return [{"channel": c, "is_send": bool(s), "peer": p, "slices": int(v[0]), "bytes": int(v[1]),
                 "wait_us": int(v[2]) / 1e3, "transfer_us": int(v[3]) / 1e3,
                 "gbps": float(v[1] / v[3]) if v[3] else float("nan")}
                for (c, s, p), v in sorted(ctx.table.items())]

    def finalize(self, ctx: _Ctx) -> None:
        """At close, or at exit for a communicator never closed (session._finish_at_exit)."""
        if ctx.path is not None:
            # at exit all plugins share _AT_EXIT_S: a hung write held the process timeout_s (60 s) there
            wait = min(ctx.timeout_s, _AT_EXIT_S) if not threading.main_thread().is_alive() else ctx.timeout_s
            if ctx.writer is not None and not ctx.writer.close(wait):
                # the same temporary file, and a filesystem that hangs: no second write
                log.error("slicetrace linkstats: a write of %s has not returned in %g s; its final table is lost",
                          ctx.path, wait)
            else:
                self._write(ctx, ctx.table, last=True)
        for row in self.snapshot(ctx):
            log.info("slicetrace linkstats rank %d: %s", ctx.comm.rank, row)
