"""Wiring for one communicator on one rank: backend + drain + event host + plugins.

The only module that knows all stages. Profiling off (no plugin) means no drain and no stamping. The drain is a
thread for asynchronous backends (cuda) and runs inline between ops for synchronous ones (cpu).
"""
from __future__ import annotations

import atexit
import hashlib
import logging
import os
import threading
import time
import weakref
from typing import Any

from .backend.base import Backend, Work, create
from .backend.signals import signals_held, term_exits
from .config import Settings, value_source
from .errors import SliceTraceError, UsageError, comm_label, credit, plural
from .events.abi import CommInfo, EventType, effective_mask
from .events.host import EventHost, OpInfo
from .events.loading import load_plugins
from .rendezvous import Store
from .stamps.drain import Drain

log = logging.getLogger("slicetrace")
_STAMP_STEPS = int(EventType.KERNEL_STEP)
_STAMP_CH = int(EventType.KERNEL_CH | EventType.KERNEL_STEP)


def _done() -> bool:
    return True


def comm_hash(job: str, generation: int = 1) -> int:
    """The communicator's hash (trace file names, CommHash): the job's; for the job made again in this process
    (generation 2, ...), the job's with that count, so its traces do not overwrite the first one's."""
    # the job names shared-memory segments (st_<job>_...): a '/' or a name past NAME_MAX fails in shm_open
    if not isinstance(job, str) or not 1 <= len(job) <= 128 or \
            not all(c.isascii() and (c.isalnum() or c in "._:-") for c in job):
        raise UsageError(f"job={job!r} must be a str of 1..128 ASCII letters, digits and '.', '_', ':', '-' (the id "
                         f"every rank of one job shares; it names the job's shared-memory segments)")
    text = job if generation <= 1 else f"{job}#{generation}"
    # 53 bits: traces write it as a JSON int, which JavaScript viewers and spreadsheets read as a double
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & ((1 << 53) - 1)


_LOG_LOCK = threading.Lock()
_LOG_LIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # open sessions -> (log level, rank)


def _log_to_stderr(level: str | None, rank: int, key: Any) -> None:
    """SLICETRACE_DEBUG sets our logger's level (not root's). The logger is the process's: the most verbose open
    communicator's level holds (a later WARN one must not silence an INFO one; level None: `key` closed; one
    dropped without close leaves by itself). Below WARNING, Python's last-resort handler would still print
    nothing, so unless the application has handlers of its own, ours go to stderr, with the rank while the open
    communicators are one rank's (ranks as threads share the handler)."""
    with _LOG_LOCK:
        if level is None:
            _LOG_LIVE.pop(key, None)
        else:
            _LOG_LIVE[key] = (getattr(logging, level.upper(), logging.WARNING), rank)
        if not _LOG_LIVE:
            return
        lv = min(v for v, _ in _LOG_LIVE.values())
        log.setLevel(lv)
        ours = [h for h in log.handlers if getattr(h, "slicetrace", False)]
        if lv < logging.WARNING and not ours and not log.handlers and not logging.getLogger().handlers:
            h = logging.StreamHandler()
            h.slicetrace = True                 # type: ignore[attr-defined]
            log.addHandler(h)
            ours = [h]
        ranks = {r for _, r in _LOG_LIVE.values()}
        who = f"rank {min(ranks)} " if len(ranks) == 1 else ""
        for h in ours:
            h.setFormatter(logging.Formatter(f"slicetrace {who}%(levelname)s: %(message)s"))


class Session:
    def __init__(self, settings: Settings, rank: int, world: int, store: Store, job: str, name: str = ""):
        self.settings, self.rank, self.world, self.job = settings, rank, world, job
        self.store, self.name = store, name or f"slicetrace-{job}"     # the name in traces, metrics and errors
        comm_hash(job)                              # checks job before the backend: a bad one leaves nothing behind
        _log_to_stderr(settings.debug, rank, self)
        try:
            self.backend: Backend = create(settings, rank, world, store, job)
        except BaseException:
            _log_to_stderr(None, rank, self)
            raise
        self.comm_hash = comm_hash(job, self.backend.generation)
        self._last: Any = None
        self._barriers = 0
        self.extra_keys: list[str] = []     # store keys of its making (init()'s job id) the last to close forgets
        self.host: EventHost | None = None
        self.drain: Drain | None = None
        self.paused = False
        self.mask_limit = -1        # ANDed into every op's event mask (Communicator.profiling(mask=...))
        self.profiling_owner: int | None = None     # the thread whose profiling() block is open
        self._every, self._min_bytes = settings.op_sample_rate, settings.profile_min_bytes
        self._sample_rate = settings.sample_rate        # read per op: frozen settings, so once here
        # ops, profiling on, at or above the size threshold: op sampling counts collectives and point-to-point
        # groups apart, so a rank's own p2p traffic does not shift which collectives it profiles
        self._eligible = [0, 0]
        self.ops_sampled_out = self.ops_below_min_bytes = 0
        self._inline = self._closed = False
        self._pid, self._forks = os.getpid(), _FORKS[0]     # close in a forked child leaves the parent's alone
        self.undrained = 0          # records left in the rings when the drain could not finish (lost, counted)
        self._drain_died: BaseException | None = None
        self._resync_at = 0.0
        self.clock_uncertainty_ns = 0
        self._unloaded: dict[str, int] = {}     # counts of a host dropped when no plugin survived its init
        try:
            plugins = load_plugins(settings.profiler_plugin, settings,
                                   value_source("profiler_plugin", settings.profiler_plugin))
            if plugins:
                info = CommInfo(self.comm_hash, self.name, 1, world, rank, settings.backend)
                with signals_held():       # a Ctrl-C between a plugin's init and the host taking its context
                    self.host = EventHost(plugins, info, settings.plugin_max_failures,      # left its trace
                                          self._op_counts)                                  # unended
                    _LIVE.add(self)
                if not self.host.plugins:  # each failed in its init (logged) and was unloaded: profiling is off
                    self._unloaded = {"plugin_init_failed": len(plugins)}
                    _LIVE.discard(self)
                    self.host, host = None, self.host
                    host.close()
            if self.host is not None:
                term_exits(self, True)     # outside the hold, which shows its own handler
                self.drain = Drain(self.backend.rings, self.host, settings.drain_interval_us,
                                   fetch=self.backend.fetch_stamps if self.backend.stamps_fetched else None,
                                   thread_init=self.backend.thread_init, on_error=self._drain_failed)
                self._resync()
                # A synchronous backend (cpu) has no idle time to hide a thread in: on 2 cores and under the
                # GIL a drain thread only contends with the data path. Drain inline between ops instead.
                self._inline = self.backend.synchronous
                self._reserved = self.backend.rings.header["reserved"]     # a view: copied after each op
                self._since_poll, self._poll_at = 0, 0.0
                if not self._inline:
                    self.drain.start()          # last: no drain thread runs when the except below does
            if log.isEnabledFor(logging.INFO):
                log.info("%s", self._describe())
        except BaseException as e:
            # The plugins may have opened files already: finalize them, then free the backend.
            errs: list[BaseException] = [e]
            _LIVE.discard(self)
            term_exits(self, False)
            if self.host is not None:
                _step(errs, "closing the event host", self.host.close)
            _step(errs, "closing the backend", self.backend.close)
            _log_to_stderr(None, rank, self)
            raise

    def _describe(self) -> str:
        """The init line SLICETRACE_DEBUG=INFO prints, as NCCL_DEBUG=INFO's 'Init COMPLETE': what was set up and why."""
        s, b = self.settings, self.backend
        head = (f"init rank {self.rank} of {self.world}, job {self.job!r}, {comm_label(self.comm_hash, self.name)}, "
                f"backend {b.name}{': ' + b.describe() if b.describe() else ''}")
        if self.host is None:
            n = self._unloaded.get("plugin_init_failed", 0)
            why = f"{plural(n, 'plugin')} failed in init" if n else "no profiler plugin"
            return f"{head}; profiling off ({why})"
        drain = "inline every 32 ops or 20 ms" if self._inline else f"drain thread every {s.drain_interval_us} us"
        mine = ", ".join(f"{p.name} (event mask {p.mask:#x})" for p in self.host.plugins)
        return (f"{head}; profiling: {mine}, with parents {self.host.op_mask():#x}, KernelStep sample rate "
                f"{s.sample_rate}, op sample rate "
                f"{s.op_sample_rate}, min bytes {s.profile_min_bytes}, {drain}")

    @property
    def profiling(self) -> bool:
        return self.host is not None and not self.paused

    def op_mask_for(self, nbytes: int, p2p: bool = False) -> int:
        """The event mask of the next op, which moves nbytes (count x element size): 0 with profiling off, and
        for ops the settings leave unprofiled (counted): below profile_min_bytes, or not the first of every
        op_sample_rate collectives (point-to-point groups) above it. Every rank profiles the same collectives
        whatever point-to-point traffic it has of its own."""
        if self.host is None or self.paused:
            return 0
        if nbytes < self._min_bytes:
            self.ops_below_min_bytes += 1
            return 0
        n = self._eligible[p2p] = self._eligible[p2p] + 1
        if self._every > 1 and (n - 1) % self._every:
            self.ops_sampled_out += 1
            return 0
        m = self.host.op_mask()
        return effective_mask(m & self.mask_limit) & m      # a kept type keeps its parents (KernelStep: Coll/P2p)

    def _op_counts(self) -> dict[str, int]:
        """The session's own counts, read with the host's whenever they are (live .prom, trace, report)."""
        return {k: v for k in ("ops_sampled_out", "undrained", "ops_below_min_bytes") if (v := getattr(self, k))}

    def _resync(self) -> None:
        off, unc = self.backend.clock_sync()
        self.drain.offset_ns = off
        self.clock_uncertainty_ns = unc
        self.host.note("clock_offset_ns", off)          # written into every trace with the loss counters
        self.host.note("clock_uncertainty_ns", unc)
        self._resync_at = time.monotonic() + self.settings.clock_resync_s

    def run(self, work: Work, info: OpInfo | None) -> Any:
        """Submit one work. With profiling, the op's events are opened first and closed by the drain."""
        mask = info.mask if info is not None else 0
        work.stamp_steps = bool(mask & _STAMP_STEPS)
        work.stamp_channels = ch = bool(mask & _STAMP_CH)
        work.sample_rate = self._sample_rate
        backend = self.backend
        if info is None:
            self._last = backend.submit(work)
            return self._last
        if time.monotonic() > self._resync_at:       # follow clock drift (a no-op for the host-clock backends)
            self._resync()
        if not self.host.begin_op(info):            # a plugin stuck in the drain thread: run it unprofiled (counted)
            work.stamp_steps = work.stamp_channels = False
            self._last = backend.submit(work)
            return self._last
        drain, tag = self.drain, work.tag
        drain.expect(tag, ch, work.plan.unique_ch_keys)     # stamps may appear from now
        try:
            token = backend.submit(work)
        except BaseException as e:                  # its seqs are final too: later ops must still end
            credit(e, (work.plan.func, work.seq_number))   # unless the backend knows it was an earlier op's (api: told)
            exact = backend.synchronous or backend.reserves_stamps
            drain.op_submitted(tag, _done, self._reserved.copy() if exact else None)
            raise
        if backend.done(token):                     # synchronous backend: the exact end of this op's seqs
            reserved = self._reserved.copy()
            drain.op_submitted(tag, _done, reserved)
            if self._inline:    # every 32 ops or 20 ms, or a ring a quarter full: polls amortise their fixed cost
                self._since_poll += 1
                now, cur = time.monotonic(), drain.cursor
                if self._since_poll >= 32 or now >= self._poll_at or (
                        int(reserved[0]) - int(cur[0]) if len(cur) == 1     # one channel (the cpu default)
                        else int((reserved - cur).max())) > drain.slots // 4:
                    self._inline_poll(now)
        else:                                       # a backend that reserves seqs at submit knows the end now
            snap = self._reserved.copy() if backend.reserves_stamps else None
            drain.op_submitted(tag, lambda: backend.done(token), snap)
        self._last = token
        return token

    def _inline_poll(self, now: float) -> None:
        self._since_poll, self._poll_at = 0, now + 0.02
        with signals_held():       # a Ctrl-C inside a plugin's callback lost an op's Coll, kept its steps
            self.drain.poll_once(False, self.settings.timeout_s)    # None: another poller drains meanwhile

    def synchronize(self) -> None:
        if self._last is not None:
            self.backend.wait(self._last, self.settings.timeout_s)

    def barrier(self) -> None:
        self.synchronize()
        self._barriers += 1
        n, base = self._barriers, f"{self.backend.key_prefix}/barrier/"
        self.store.barrier(f"{base}{n}", self.rank, self.world, self.settings.timeout_s, check=self.backend.check_peers)
        if n > 1:           # every rank set its key of barrier n: it is done reading barrier n - 1's keys
            self.store.delete(f"{base}{n - 1}/{self.rank}")

    def wait(self, token: Any) -> None:
        self.backend.wait(token, self.settings.timeout_s)

    def counters(self) -> dict[str, int]:
        return self.host.counters() if self.host is not None else dict(self._unloaded)

    @property
    def forked(self) -> bool:
        """This process is a fork of the one that made the session: the backend and plugin files are its parent's.
        (A fork count, not os.getpid(): every op asks.)"""
        return _FORKS[0] != self._forks

    def _drain_failed(self, e: BaseException) -> None:
        """In the drain thread, once, when an error ended it: from now on only flush and close drain."""
        self._drain_died = e
        log.error("slicetrace: the profiler drain thread died: %r; stamps are now drained by flush_profiler and "
                  "close only", e, exc_info=e)

    def flush(self, timeout_s: float | None = None) -> None:
        if self.drain is not None and not self.drain.flush(timeout_s or self.settings.timeout_s):
            raise SliceTraceError(f"profiler drain did not catch up within {timeout_s or self.settings.timeout_s}s")

    def close(self) -> None:
        """Flush and stop the drain, finalize the plugins, close the backend: every step runs even when an
        earlier one failed (a plugin must still finish its file, the backend must still be freed); the first
        error is raised at the end, and messages never received are an error only when nothing else failed."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        try:
            with signals_held():        # a SIGTERM (SystemExit) or Ctrl-C in a plugin's flush or finalize cut its file
                self._close()
        finally:                        # after the plugins' last words at close (linkstats' summary is INFO)
            term_exits(self, False)     # only now: at SIG_DFL a SIGTERM during the close killed the rank mid-trace
            _log_to_stderr(None, self.rank, self)

    def _close(self) -> None:
        if self.forked:
            log.debug("slicetrace: close in a forked child (pid %d): the communicator is its parent's, left alone",
                      os.getpid())
            return
        errs: list[BaseException] = []
        drain = self.drain
        if drain is not None:
            _step(errs, "flushing the profiler drain", lambda: drain.flush(min(self.settings.timeout_s, 10.0)))
            _step(errs, "stopping the profiler drain", lambda: drain.stop(0.0) if _insisted(errs) else drain.stop())
            if getattr(drain, "alive", False):
                log.error("slicetrace: the drain thread did not stop; closing the plugins and backend regardless")
            if drain.error is not None and drain.error is not self._drain_died:     # that one was logged already
                log.error("slicetrace drain thread failed: %r", drain.error)
            fenced = drain.fence(0.0 if _insisted(errs) else 1.0)   # False: a poll still runs (rings kept)
            if not drain.settled:       # stop gave up: what it left in the rings, and the KernelCh starts it
                left = sum(max(0, int(r) - int(c)) for r, c in zip(self._reserved, drain.cursor))
                self.undrained = left + drain.open_records  # holds for their stop, is lost, counted (after the
            if not fenced:              # fence, so a poll that ended meanwhile is not counted twice)
                _step(errs, "keeping the stamp rings", self.backend.keep_rings)
            else:                       # nothing reads the rings now: the backend can unmap them
                drain.release()
                self._reserved = self._reserved.copy() if self._reserved is not None else None
        if self.host is not None:
            _step(errs, "finalizing the profiler plugins", lambda: self._close_host(0.0 if _insisted(errs) else None))
        _step(errs, "closing the backend", self.backend.close)
        if errs:
            raise errs[0]
        self._leave_store()
        lost = self.backend.unreceived()
        if lost:
            raise UsageError(f"rank {self.rank} closed its communicator with messages it never received: "
                             f"{'; '.join(lost)}; they are lost (every send needs a matching recv)")

    def _leave_store(self) -> None:
        """The last rank to close forgets the communicator's keys (a long job that makes communicators would grow
        its store without end). Each rank takes the first free `left/` slot as its last use of the store: the rank
        that takes the last slot knows every other rank is done with them. A rank that never closes keeps them."""
        base, mine = self.backend.key_prefix, str(self.rank).encode()
        try:
            slot = next((i for i in range(self.world) if self.store.claim(f"{base}/left/{i}", mine) == mine), -1)
            if slot != self.world - 1:
                return
            names = [*self.backend.STORE_KEYS, "left/{r}"] + ([f"barrier/{self._barriers}/{{r}}"]
                                                              if self._barriers else [])
            keys = [f"{base}/{t.format(r=r)}" for t in names for r in range(self.world)] + self.extra_keys
            for k in dict.fromkeys(keys):
                self.store.delete(k)
        except Exception as e:  # noqa: BLE001 - housekeeping: the communicator itself closed fine
            log.debug("slicetrace: rank %d: its communicator's store keys were not removed: %r", self.rank, e)

    def _close_host(self, timeout_s: float | None = None) -> None:     # bounded: a stuck callback holds its lock
        self.host.close(timeout_s=self.settings.timeout_s if timeout_s is None else timeout_s)


# Sessions with plugins until closed, for _finish_at_exit. Strong: a communicator the program dropped unclosed
# lives on (as NCCL's does until ncclCommDestroy), so its trace is still finished at exit, not cut short.
_LIVE: set = set()
_FORKS = [0]                                    # forks this process descends from (Session.forked)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


@atexit.register
def _finish_at_exit() -> None:
    """A communicator never closed (kept to the process's end, as a torchrun script's often is, or dropped): its
    plugins still get its records and finish their files (a trace was cut mid-record, its losses uncounted),
    bounded; the backend is left to the process's exit (its peers may be gone)."""
    deadline = time.monotonic() + 5.0           # for them all, not each
    try:
        # held, as in close(): torchrun's agent SIGTERMs the other ranks once one failed, often while they finish
        # here after their PeerError, and the SystemExit(143) cut their traces short
        with signals_held():
            for sess in list(_LIVE):
                if sess._closed or sess.forked or sess.host is None:
                    continue
                try:
                    if sess.drain is not None:
                        sess.drain.flush(max(0.1, deadline - time.monotonic()))
                    sess._close_host(max(0.1, deadline - time.monotonic()))
                except Exception as e:  # noqa: BLE001 - at exit: say so, finish the others
                    log.warning("slicetrace: rank %d: finishing the profiler plugins at exit failed: %r", sess.rank,
                                e)
    except (SystemExit, KeyboardInterrupt):     # a held signal, raised again: the process is exiting already
        pass


def _insisted(errs: list[BaseException]) -> bool:
    """A step of close was cut by a signal that went through its hold (the same one again a second later: the user
    insists): the steps left wait for no other thread (a plugin stuck there held the close up to timeout_s more)."""
    return any(isinstance(e, (KeyboardInterrupt, SystemExit)) for e in errs)


def _step(errs: list[BaseException], what: str, fn: Any) -> None:
    """Run one teardown step; its error is kept in errs (the first is raised by the caller), later ones logged."""
    try:
        fn()
    except BaseException as e:
        if errs:
            log.error("slicetrace: %s failed too (after %r): %r", what, errs[0], e, exc_info=e)
        elif isinstance(e, (KeyboardInterrupt, SystemExit)):
            log.warning("slicetrace: %s interrupted (%r): what is left waits for no other thread; the traces may "
                        "be cut short", what, e)
        errs.append(e)
