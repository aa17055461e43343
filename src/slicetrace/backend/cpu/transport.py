"""Connections (FIFO + tail/head counters in shared memory) and the Guard every wait goes through.

A wait spins briefly (the peer usually answers within microseconds when each rank has a core), then
calls sched_yield (cheap when nothing else is runnable, gives the core away when ranks outnumber cores),
then sleeps with a growing period; when ranks outnumber CPUs a ring wait sleeps on a futex instead (futex.py),
woken by the neighbour's post. Every slow wait checks the abort word and its deadline at each pause, and the
peers' liveness and the signature of the collective in flight every CHECK_EVERY_S (from 50 ms into the wait: a
wait the peer ends within microseconds must not be spent reading /proc).
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ...errors import CommTimeoutError, MismatchError, PeerError
from ..base import host_pointer
from ..opsig import coll_name, differ_text, order_text
from ..procs import TwoChecks, proc_dead
from . import futex
from .shm import (ABORT_MISMATCH, ABORT_PEER, ABORT_TIMEOUT, C_ABORT, C_ABORT_FROM, C_CLOSED, C_HEARTBEAT, C_PID,
                  C_REASON_LEN, H_RECLAIM, H_RECLAIMED, H_SLEEP, NSIG, REASON_MAX, SIG_WORD)

SPINS = 400
YIELD_S = 0.002             # then sched_yield for up to 2 ms
SLEEP_MIN_S, SLEEP_MAX_S = 20e-6, 1e-3
CHECK_EVERY_S = 0.05        # liveness / signature checks while waiting
HEARTBEAT_STALE_S = 10.0    # a live pid whose heartbeat stalled max(this, timeout_s) is reported (Guard.stale_ns)
_U8 = np.dtype(np.uint8)


RECLAIM_MIN = 64 << 10      # slices this large are timed for the reclaim decision
PROBE_NS = 250_000_000      # the mode not in use is tried for one FIFO round at least this often
KEEP = 4                    # samples kept per mode


class Reclaim:
    """Sender side of FIFO line reclaim, per connection.

    When the receiver has read a slot, its cache holds the lines shared; on this host (vCPUs on different L3
    caches) the sender's next write to them then runs up to 10x slower (upgrade misses the prefetcher does not
    cover). One store per line by the receiver after its read moves the lines over and costs ~5 us per 512 KiB.
    Auto mode measures both per connection: the sender's write time of a slot plus the receiver's reclaim time
    for it (written to H_RECLAIMED), per byte, the least of the last KEEP samples of each mode (delays only add
    time), and uses the cheaper mode: when the host turns slow the mode in use shows it within KEEP writes. The
    other mode is tried for one FIFO round every PROBE_NS, which is how a host turning fast is seen (in the
    slow case one round without reclaim costs ~1.5 ms).
    """

    __slots__ = ("ctl", "cost", "k", "best", "left", "probe_at", "mode")

    def __init__(self, ctl: memoryview, mode: str):
        self.ctl = ctl
        self.cost = ([], [])                    # recent samples, ns per byte, without / with reclaim
        self.k = [0, 0]
        self.best = 1
        self.left = 0
        self.probe_at = 0 if mode == "auto" else -1
        self.mode = ctl[H_RECLAIM] = 0 if mode == "off" else 1

    def _set(self, mode: int) -> None:
        if mode != self.mode:                   # the word shares nothing while it stays the same
            self.mode = self.ctl[H_RECLAIM] = mode

    def wrote(self, slot: int, nbytes: int, ns: int) -> None:
        """One slot of >= RECLAIM_MIN bytes written in `ns`: account it and pick the mode for the next slots."""
        if self.probe_at < 0:
            return                              # fixed mode
        was = self.ctl[H_RECLAIMED + slot]
        if was:
            m = 1 if was > 1 else 0
            c = (ns + was - 2 if m else ns) / nbytes
            ring = self.cost[m]
            if len(ring) < KEEP:
                ring.append(c)
            else:
                ring[self.k[m] % KEEP] = c
            self.k[m] += 1
        if self.left:
            self.left -= 1
            self._set(1 - self.best)
            return
        c0, c1 = self.cost
        if c0 and c1:
            self.best = 0 if min(c0) <= min(c1) else 1
        now = time.monotonic_ns()
        if now >= self.probe_at:
            self.probe_at, self.left = now + PROBE_NS, 8
        self._set(self.best)


class Conn:
    """One direction of one connection as seen from this rank. `ctl` lives in the receiver's segment."""

    __slots__ = ("ctl", "fifo", "step", "peer", "is_send", "msg_seq", "msgs", "msg_left", "_views", "reclaim", "base",
                 "wakes", "_lines", "_slots", "direct")

    def __init__(self, ctl: memoryview, fifo: memoryview, peer: int, is_send: bool, reclaim: str = "off"):
        self.ctl, self.fifo, self.peer, self.is_send = ctl, fifo, peer, is_send
        self.step = 0           # persistent FIFO step (NCCL conn->step); both sides advance identically
        self.msg_seq = 0        # p2p message headers on this connection: one per piece (for mismatch checks)
        self.msgs = 0           # the caller's messages (a large one is cut in pieces), as errors number them
        self.msg_left = 0       # elements of the current message still to come in later pieces
        self._views: dict = {}
        self.reclaim = Reclaim(ctl, reclaim) if is_send else None
        self.base = host_pointer(ctl) if futex.available() else 0      # for futex waits on tail / head
        self.wakes = False      # ring connections: the peer that waits on what this side posts sleeps on a futex
        self._lines: list = [(0, None)] * 8     # per slot: (nbytes, its lines' first bytes) of the last reclaim
        self._slots: dict = {}
        self.direct = 0         # ring slices sent without the FIFO (registered memory, worker.py)

    def post(self, idx: int, value: int) -> None:
        """Store tail or head and wake a waiter that sleeps on it (futex waits only; otherwise a plain store)."""
        ctl = self.ctl
        ctl[idx] = value
        if ctl[idx + H_SLEEP]:
            futex.wake(self.base + idx * 8)

    def freed(self, slot: int, nbytes: int) -> None:
        """Receiver: slot `slot` has been read; reclaim its lines when the sender asks for it (see Reclaim)."""
        ctl = self.ctl
        if ctl[H_RECLAIM] and nbytes:
            t = time.perf_counter_ns()
            k, lines = self._lines[slot]
            if k != nbytes:         # a slot's view kept: slicing one per slice cost ~0.3 us of a small op's ~20
                o = slot * (len(self.fifo) // 8)
                lines = self.view(_U8)[o:o + nbytes:64]
                self._lines[slot] = (nbytes, lines)
            lines.fill(0)           # one store per cache line
            ctl[H_RECLAIMED + slot] = time.perf_counter_ns() - t + 2
        elif ctl[H_RECLAIMED + slot] != 1:
            ctl[H_RECLAIMED + slot] = 1

    def slot_views(self, dtype: np.dtype, step_elems: int) -> list:
        """Per FIFO slot, (elements, view) of the last slice the ring loop used there, in `dtype` (slot k starts at
        element k * step_elems): ops of one size reuse their views instead of slicing 2-4 per slice (~0.2 us each).
        The loop slices and stores a new one when the size changes."""
        key = dtype, step_elems
        v = self._slots.get(key)
        if v is None:
            v = self._slots[key] = [(0, None)] * 8
        return v

    def view(self, dtype: np.dtype) -> np.ndarray:
        v = self._views.get(dtype)
        if v is None:
            v = self._views[dtype] = np.frombuffer(self.fifo, dtype=dtype)
        return v


class Guard:
    """Abort word, deadlines, peer liveness and cross-rank op signatures for one rank's backend."""

    def __init__(self, rank: int, ctl: memoryview, reason: memoryview, timeout_s: float):
        self.rank, self.ctl, self.reason, self.timeout_s = rank, ctl, reason, timeout_s
        # a live peer may be busy without a heartbeat (a C call holding the GIL, SIGSTOP): the user's timeout
        # governs how long we wait for it; dead and zombie peers are found through /proc at once
        self.stale_ns = max(HEARTBEAT_STALE_S, timeout_s) * 1e9
        self.peers: dict[int, tuple[memoryview, memoryview, int, int]] = {}   # rank -> (ctl, reason, pid, start)
        self.on_dead = None          # callback(rank) when a peer is found dead (unlinks its segment)
        self.sig: tuple[int, int, int, int] | None = None                    # collective in flight
        self.sig_seq_number = -1                                              # its SeqNum (Work.seq_number)
        self._twice = TwoChecks()
        self.spins = SPINS
        self.futex = False           # ring waits sleep in the kernel (ranks outnumber CPUs, SLICETRACE_CPU_WAIT)

    # ---- abort ----
    def _post_abort(self, ctl: memoryview, reason_mv: memoryview, code: int, text: bytes) -> None:
        if ctl[C_ABORT]:
            return                    # first reason wins
        reason_mv[:len(text)] = text
        ctl[C_REASON_LEN] = len(text)
        ctl[C_ABORT_FROM] = self.rank
        ctl[C_ABORT] = code

    def abort_all(self, code: int, reason: str) -> None:
        text = reason.encode("utf-8", "replace")[:REASON_MAX]
        self._post_abort(self.ctl, self.reason, code, text)
        for pctl, preason, _, _ in self.peers.values():
            try:
                self._post_abort(pctl, preason, code, text)
            except (ValueError, IndexError):   # peer view released during close
                pass

    def aborted(self) -> bool:
        return bool(self.ctl[C_ABORT])

    def abort_error(self) -> Exception:
        code = self.ctl[C_ABORT]
        text = bytes(self.reason[:self.ctl[C_REASON_LEN]]).decode("utf-8", "replace")
        src = self.ctl[C_ABORT_FROM]
        msg = text if src == self.rank else f"{text} (abort posted by rank {src})"
        return {ABORT_MISMATCH: MismatchError, ABORT_TIMEOUT: CommTimeoutError}.get(code, PeerError)(msg)

    def fail(self, code: int, reason: str) -> Exception:
        self.abort_all(code, reason)
        return self.abort_error()

    # ---- checks made while waiting ----
    def check(self, waiting_on: tuple[int, ...] = (), what: Any = None) -> None:
        """Raise if the comm was aborted, a peer died, or a peer we wait on closed / stopped responding; what: the
        wait's subject (describe), named with the collective in flight in the error."""
        if self.ctl[C_ABORT]:
            raise self.abort_error()
        now = time.monotonic_ns()
        for p, (pctl, _, pid, start) in self.peers.items():
            if p not in waiting_on:         # one that did its part and exited unclosed is nobody's concern (a
                continue                    # needed one's neighbour aborts all); its sightings stay as they are
            closed, why = pctl[C_CLOSED], None      # (channel threads share them: a reset would hide a death)
            if closed:
                why = "closed its communicator"
            elif pid:                       # 0: another PID namespace, judged by its heartbeat and closed word
                why = proc_dead(pid, start)
            if why is None and not closed and now - pctl[C_HEARTBEAT] > self.stale_ns:
                why = f"stopped responding (no heartbeat for {(now - pctl[C_HEARTBEAT]) / 1e9:.1f}s)"
            if self._twice.confirm(p, why):
                if self.on_dead is not None and not closed:
                    self.on_dead(p)
                raise self.fail(ABORT_PEER, f"rank {p} (pid {pid or pctl[C_PID]}) {why}; detected by rank {self.rank}"
                                + self._during(what))
        if self.sig is not None:
            self.check_sigs(self.sig)

    def in_op(self) -> str:
        """' in AllReduce #3 (collective #5 of this communicator)': the collective in flight, for an error."""
        return f" in {coll_name(self.sig, self.sig_seq_number)}" if self.sig is not None else ""

    def _during(self, what: Any) -> str:
        """Where a peer's death was found: the collective in flight and the wait."""
        return self.in_op() + (f", waiting for {describe(what)}" if what is not None else "")

    def publish_sig(self, sig: tuple[int, int, int, int], seq_number: int = -1) -> None:
        seq, count, packed, cfg = sig
        base = SIG_WORD + (seq % NSIG) * 4
        self.ctl[base + 1], self.ctl[base + 2], self.ctl[base + 3] = count, packed, cfg
        self.ctl[base] = seq      # published last
        self.sig, self.sig_seq_number = sig, seq_number

    def check_sigs(self, sig: tuple[int, int, int, int], wait: bool = False) -> None:
        seq, count, packed, cfg = sig
        base = SIG_WORD + (seq % NSIG) * 4
        for p, (pctl, _, _, _) in self.peers.items():
            if wait and pctl[base] < seq:
                self.wait_ge(pctl, base, seq, p, f"rank {p} to start {coll_name(sig, self.sig_seq_number)}")
            if pctl[base] == seq and (pctl[base + 1] != count or pctl[base + 2] != packed or pctl[base + 3] != cfg):
                theirs = (pctl[base + 1], pctl[base + 2], pctl[base + 3])
                raise self.fail(ABORT_MISMATCH, differ_text(seq, self.rank, (count, packed, cfg), p, theirs))

    def not_started(self) -> str:
        """For a timeout's message: the peers that have not begun this rank's current collective (the rank it
        waited on may only be waiting on them)."""
        if self.sig is None:
            return ""
        seq = self.sig[0]
        base = SIG_WORD + (seq % NSIG) * 4
        late = [p for p, (pctl, _, _, _) in sorted(self.peers.items()) if pctl[base] < seq]
        return (f"; rank(s) {', '.join(map(str, late))} had not started {coll_name(self.sig, self.sig_seq_number)}"
                if late else "")

    # ---- waiting ----
    def wait_ge(self, mv: memoryview, idx: int, target: int, peer: int, what: Any, base: int = 0) -> None:
        """Return once mv[idx] >= target; PeerError / MismatchError / CommTimeoutError otherwise. base: mv's
        address, for a tail or head word its poster wakes (Conn.post): with futex waits on, sleep there."""
        for _ in range(self.spins):
            if mv[idx] >= target:
                return
        b = Backoff(self, what, (peer,))
        if base and self.futex:
            flag, addr = idx + H_SLEEP, base + idx * 8
            try:
                while True:
                    mv[flag] = 1                 # then re-read: a post after this store wakes us
                    v = mv[idx]
                    if v >= target:
                        return
                    futex.wait(addr, v)
                    if mv[idx] >= target:
                        return
                    b.check()
            finally:
                mv[flag] = 0
        while mv[idx] < target:
            b.pause()

    def ahead_of_p2p(self, waiting_on: tuple[int, ...]) -> tuple[int, int, tuple] | None:
        """(peer, seq, its words) for a peer this point-to-point wait needs that runs collective #seq, which this
        rank has not started: that peer cannot end it (each collective ends waiting for every rank to start it), so
        neither op can end. Slow path only: no op pays for it."""
        ctl = self.ctl
        seq = max(ctl[SIG_WORD + i * 4] for i in range(NSIG)) + 1       # our next collective
        base = SIG_WORD + (seq % NSIG) * 4
        for p in waiting_on:
            pctl = self.peers[p][0] if p in self.peers else None
            if pctl is not None and pctl[base] == seq:      # its words are written first and stay while it waits
                return p, seq, (pctl[base + 1], pctl[base + 2], pctl[base + 3])
        return None


def describe(what: Any) -> str:
    """A wait's subject: text, or (kind, peer, channel, step) for ring waits (formatted only when a wait fails: the
    ring loop makes several waits per op)."""
    if not isinstance(what, tuple):
        return str(what)
    kind, peer, ch, step = what
    return f"{kind} from rank {peer} on channel {ch} (step {step})"


class Backoff:
    """Idle strategy for one wait (or, p2p: one idle stretch of the p2p progress loop, stall.StallBackoff; `what`
    says what its lanes wait for (str) and what they do toward one peer (what.toward(peer)), for a MismatchError
    when a peer runs a collective instead)."""

    __slots__ = ("g", "what", "peers", "t0", "deadline", "check_at", "n", "sleep", "p2p", "ahead")

    def __init__(self, guard: Guard, what: Any, peers: tuple[int, ...], p2p: bool = False):
        self.g, self.what, self.peers, self.p2p, self.ahead = guard, what, peers, p2p, None
        self.t0 = time.monotonic()
        self.deadline = self.t0 + guard.timeout_s
        self.check_at = self.t0 + CHECK_EVERY_S   # peers' liveness (a /proc read, 13-40 us) once a wait is slow
        self.n = 0
        self.sleep = SLEEP_MIN_S

    def pause(self) -> None:
        if self.g.ctl[C_ABORT]:
            raise self.g.abort_error()
        self.n += 1
        if time.monotonic() - self.t0 < YIELD_S:
            os.sched_yield()
        else:
            time.sleep(self.sleep)
            self.sleep = min(self.sleep * 1.5, SLEEP_MAX_S)
        self.check()

    def check(self) -> None:
        """Abort word, then (every CHECK_EVERY_S) the peers, then the deadline."""
        g = self.g
        if g.ctl[C_ABORT]:
            raise g.abort_error()
        now = time.monotonic()
        if now >= self.check_at:
            self.check_at = now + CHECK_EVERY_S
            g.check(self.peers, self.what)
            if self.p2p:
                self.check_order()
        if now > self.deadline:
            raise g.fail(ABORT_TIMEOUT, f"rank {g.rank} waited {g.timeout_s}s (timeout_s) for {describe(self.what)}"
                         + (g.not_started() or g.in_op()))     # the op, once: with the late ranks, or here

    def check_order(self) -> None:
        """A peer in a collective we have not started, seen at two checks of this wait (a poll of ours came between:
        it may have posted what we wait for just before it began): the ranks called their ops in different orders."""
        ahead, self.ahead = self.ahead, self.g.ahead_of_p2p(self.peers)
        if ahead is not None and ahead == self.ahead:
            p, seq, theirs = ahead
            raise self.g.fail(ABORT_MISMATCH, order_text(seq, p, theirs, self.g.rank, self.what.toward(p)))
