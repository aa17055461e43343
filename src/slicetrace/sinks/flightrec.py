"""The flight recorder (the `flightrec` built-in): always on, writes nothing unless something goes wrong (its cost is
the event path of the ops it records, as for any plugin with KernelStep in its mask; README says how much).

Per communicator it keeps, in memory, the last SLICETRACE_FLIGHTREC_OPS completed Coll/P2p ops with their KernelCh
and KernelStep records, every op still in flight and every op that ended unfinished: the record arrays the host
hands over, kept by reference (the host never reuses them), no object per record. Past
SLICETRACE_FLIGHTREC_MAX_RECORDS records the oldest ops go first (completed ones, then unfinished ones, then those in
flight; a lone op past it loses its oldest KernelSteps, of a batch bigger than the cap too); what went is counted.

It writes (sinks/flightrec_dump.py) at comm_failed (an op raised PeerError, CommTimeoutError or MismatchError: at
once, and again at close with what the drain delivered since), at close when an op did not finish (it ended
without all its channel programs' records: interrupted, or those records were lost), and at every close with
SLICETRACE_FLIGHTREC_DUMP=always. Nothing is written on a healthy run by default. The file is the example
plugin's Chrome trace, `<SLICETRACE_FLIGHTREC_FILE>_<commHash>_<rank>.json`, made by the example plugin itself
(so report, convert and check_trace read it as they read its traces), with a "slicetrace_flightrec" record: the
window kept, what was evicted, and per unfinished op the last FIFO step of each connection.
"""
from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any

import numpy as np

from ..config import Settings, unwritable
from ..errors import ConfigError
from ..events.abi import ActivationMask, CollDescr, CommInfo, P2pDescr
from ..events.plugin import Failure
from .chrome import DEFAULT_MASK
from .flightrec_dump import dump

log = logging.getLogger("slicetrace")
MASK = DEFAULT_MASK             # Coll | P2p | KernelCh | KernelStep


class Op:
    """A Coll or P2p event: its descriptor, start and stop (None: in flight), record batches, and how it ended."""
    __slots__ = ("ctx", "descr", "index", "t1", "chans", "steps", "n", "n_chans", "unfinished", "gone")

    def __init__(self, ctx: "Ctx", descr: Any, index: int):
        self.ctx, self.descr, self.index = ctx, descr, index
        self.t1: int | None = None
        self.chans: list[tuple[np.ndarray, int, int]] = []     # (a batch, first row, end row): rows a:b are its
        self.steps: deque[tuple[np.ndarray, int, int]] = deque()    # (a view per op cost ~1k instructions more)
        self.n = self.n_chans = 0           # records kept; KernelCh records that came
        self.unfinished = 0                 # KernelCh it ended without (the host's event_unfinished); 0: none
        self.gone = False                   # evicted: records that still come for it are counted, not kept


_IGNORED = object()         # the handle of every other event (a Group, an API event): children must find a parent


class Ctx:
    def __init__(self, comm: CommInfo, s: Settings):
        self.comm = comm
        self.max_ops, self.max_records = s.flightrec_ops, s.flightrec_max_records
        self.always = s.flightrec_dump == "always"
        self.prefix = s.flightrec_file
        self.settings = s
        self.done: deque[Op] = deque()      # completed, oldest first
        self.live: dict[Op, None] = {}      # in flight, in start order
        self.failed: list[Op] = []          # ended unfinished
        self.records = 0                    # KernelCh and KernelStep records kept
        self.ops = 0                        # Coll/P2p events seen
        self.evicted_ops = self.evicted_records = 0
        self.evicted_seq: dict[str, int] = {}   # per collective function, the last SeqNum evicted (report's window)
        self.failures: list[Failure] = []
        self.read: Any = None               # the host's counters (live_counters), for a dump at comm_failed
        self.host_counters: dict[str, int] = {}
        self.path: str | None = None        # the dump written, if any
        self.error: OSError | None = None  # the last write's, if it failed
        self.failed_writes = 0              # writes that failed (in the next dump's window record)

    def add(self, op: Any, recs: np.ndarray, a: int, b: int, chans: bool) -> None:
        n = b - a
        if op.__class__ is not Op or not n:
            return
        if op.gone:
            self.evicted_records += n
            return
        (op.chans if chans else op.steps).append((recs, a, b))
        op.n += n
        self.records += n
        if chans:
            op.n_chans += n
        if self.records > self.max_records:
            self.trim(op)

    def trim(self, keep: Op) -> None:
        """Evict the oldest ops (completed first) until the records fit; a lone op loses its oldest KernelSteps."""
        while self.records > self.max_records:
            if self.done:
                self.evict(self.done.popleft())
            elif self.failed:
                self.evict(self.failed.pop(0))
            elif len(self.live) > 1:
                old = next(iter(self.live))
                self.evict(old if old is not keep else list(self.live)[1])
            elif keep.steps:            # its oldest rows, a whole batch or the head of one: the newest stay
                recs, a, b = keep.steps[0]
                n = min(b - a, self.records - self.max_records)
                if n == b - a:
                    keep.steps.popleft()
                else:
                    keep.steps[0] = (recs, a + n, b)
                keep.n -= n
                self.records -= n
                self.evicted_records += n
            else:
                break

    def evict(self, op: Op) -> None:
        self.live.pop(op, None)
        op.gone = True
        self.records -= op.n
        self.evicted_ops += 1
        self.evicted_records += op.n
        op.chans = op.steps = ()           # gone: add() never appends to it again (no fresh containers per op)
        op.n = 0
        d = op.descr
        if d.__class__ is CollDescr and self.evicted_seq.get(d.func, -1) < d.seq_number:
            self.evicted_seq[d.func] = d.seq_number

    def stopped(self, op: Op) -> None:
        self.live.pop(op, None)
        if op.gone:
            return
        if op.unfinished:           # kept beside the last N completed (the last N of these too): what a dump is for
            self.failed.append(op)
            if len(self.failed) > self.max_ops:
                self.evict(self.failed.pop(0))
            return
        self.done.append(op)
        if len(self.done) > self.max_ops:
            self.evict(self.done.popleft())

    def kept(self) -> list[Op]:
        """The ops kept, in start order."""
        return sorted([*self.done, *self.failed, *self.live], key=lambda o: o.index)

    def counters(self) -> dict[str, int]:
        """What report_counters had, else the host's counters now (a dump at comm_failed)."""
        if self.read is not None:
            try:
                return dict(self.read())
            except Exception:           # the host's reader is best effort here: the trace says the rest
                log.debug("slicetrace flightrec: reading the host's counters failed", exc_info=True)
        return dict(self.host_counters)


class FlightRecPlugin:
    """Triggered deep capture, native version 8 (v7 + KernelStep), with the batch calls."""
    name = "flightrec"
    version = 8

    def __init__(self, settings: Settings | None = None):
        self.settings = settings if settings is not None else Settings()

    def init(self, comm: CommInfo, mask: ActivationMask) -> Ctx:
        s, var = self.settings, f"flightrec_file (SLICETRACE_FLIGHTREC_FILE)={self.settings.flightrec_file!r}"
        # launch() refuses it before any rank starts (launch_checks._own_flightrec_prefix, the same test); init() here
        if s.profile_dump_file and os.path.abspath(s.profile_dump_file) == os.path.abspath(s.flightrec_file):
            raise ConfigError(f"{var} is also profile_dump_file (SLICETRACE_PROFILE_DUMP_FILE): the two plugins "
                              f"would write the same files; give the flight recorder a prefix of its own")
        why = unwritable(os.path.dirname(os.path.abspath(s.flightrec_file)))    # probed, not made (at the first dump)
        if why is not None:                             # now, not when a failure needs it
            raise ConfigError(f"{var}: {why[0]!r} is not a folder that can be written ({why[1]}); give a prefix in a "
                              f"writable folder")
        mask.value = MASK
        return Ctx(comm, s)

    def live_counters(self, ctx: Ctx, read: Any) -> None:
        ctx.read = read

    def start_event(self, ctx: Ctx, descr: Any) -> Any:
        if descr.__class__ is CollDescr or descr.__class__ is P2pDescr:
            ctx.ops += 1
            op = Op(ctx, descr, ctx.ops)
            ctx.live[op] = None
            return op
        return _IGNORED

    def unrecorded_handle(self, ctx: Ctx) -> Any:
        return _IGNORED

    def stop_event(self, handle: Any, ts_ns: int) -> None:
        if handle.__class__ is Op and handle.t1 is None:
            handle.t1 = ts_ns
            handle.ctx.stopped(handle)

    def record_event_state(self, handle: Any, state: Any, args: Any) -> None:
        pass            # KernelCh/KernelStep come whole through the batch calls; nothing else is recorded

    def event_unfinished(self, handle: Any, missing: int) -> None:
        """The host's word, right before its stop, that this op ended without `missing` of its KernelCh records (the
        op's own: not a counter other ops move too, nor a read per op that had fewer KernelCh than channels)."""
        if handle.__class__ is Op:
            handle.unfinished = max(int(missing), 1)       # the dump's mark says how many (flightrec_dump)

    def kernel_step_batch(self, ctx: Ctx, parent: Any, recs: np.ndarray) -> int:
        ctx.add(parent, recs, 0, len(recs), False)
        return len(recs)

    def kernel_step_runs(self, ctx: Ctx, parents: list, recs: np.ndarray, starts: list[int], stops: list[int]) -> int:
        return _add_runs(ctx, parents, recs, starts, stops, False)

    def kernel_ch_batch(self, ctx: Ctx, parent: Any, recs: np.ndarray) -> int:
        ctx.add(parent, recs, 0, len(recs), True)
        return len(recs)

    def kernel_ch_runs(self, ctx: Ctx, parents: list, recs: np.ndarray, starts: list[int], stops: list[int]) -> int:
        return _add_runs(ctx, parents, recs, starts, stops, True)

    def report_counters(self, ctx: Ctx, counters: dict[str, int]) -> None:
        ctx.host_counters = dict(counters)
        ctx.read = None                 # the final ones: the reader is not to be called after finalize

    def comm_failed(self, ctx: Ctx, failure: Failure) -> None:
        """The user's error path: the first failure writes at once (a rank killed later still leaves it), its ops in
        flight as such (some may only wait for the drain); finalize writes again with what came since, each op that
        ended without all its KernelCh marked unfinished."""
        ctx.failures.append(failure)
        if len(ctx.failures) == 1:
            self._write(ctx, "failure", failure.ts_ns)
        elif len(ctx.failures) > ctx.max_ops:       # a loop that keeps failing: the first and the latest ones
            del ctx.failures[1]

    def finalize(self, ctx: Ctx) -> None:
        ops = ctx.kept()
        why = ("failure" if ctx.failures else "unfinished" if any(o.unfinished for o in ops)
               else "always" if ctx.always else None)
        if why is not None:
            self._write(ctx, why, None)
        ctx.done.clear()
        ctx.failed.clear()
        ctx.live.clear()
        if ctx.error is not None:       # the host logs it: the last record it was to leave is not there
            raise ctx.error

    def _write(self, ctx: Ctx, why: str, ts_ns: int | None) -> None:
        try:
            ctx.path, ctx.error = dump(ctx, why, ts_ns), None      # an earlier failed write is replaced: no error
        except OSError as e:
            ctx.error = e
            ctx.failed_writes += 1
            log.error("slicetrace flightrec: writing its trace (%s) failed: %s", why, e)


def _add_runs(ctx: Ctx, parents: list, recs: np.ndarray, starts: list[int], stops: list[int], chans: bool) -> int:
    """A batch's runs of records, rows starts[i]:stops[i] of parents[i], kept (KernelCh if chans, else KernelStep)."""
    add = ctx.add
    for p, a, b in zip(parents, starts, stops):
        add(p, recs, a, b, chans)
    return sum(stops) - sum(starts)
