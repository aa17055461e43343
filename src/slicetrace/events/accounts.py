"""The event host's loss accounting (EventHost, host.py): drops counted rank-wide, notes for the plugins, and the
counters each plugin is offered and kept, read out for close, `counters()` and the plugin stats; and the failures
of ops, told to the plugins that hear them (plugin.py's comm_failed).

Mixed into EventHost, whose lock, counts, notes and slots these use.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from .ops import _Slot

log = logging.getLogger("slicetrace")
_TELL_WAIT_S = 1.0      # a failure waits this long for a plugin callback in another thread (a stuck one: untold)


class Accounts:
    """Mixed into EventHost: expects its _lock, _counts, _n_behind, _behind_lock, _notes, _slots, _unlocked, _fail,
    _closed and _extra (the session's own counts, read whenever the counters are)."""
    _counts: dict[str, int]
    _n_behind: int
    _notes: dict[str, int]
    _slots: list[_Slot]

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + int(n)

    def counters(self) -> dict[str, int]:
        """The rank's counters: what each plugin was offered and kept, summed over the plugins."""
        return self._unlocked(lambda: self._with_plugins(self._slots))

    def _live(self, slot: _Slot) -> dict[str, int]:
        """One plugin's counters now, for a thread of its own (plugin.Plugin's live_counters): never waits for
        the lock, which a callback (or close, joining that thread) may hold; without it, a poll's counts may be
        half-added, each one whole."""
        return self._unlocked(lambda: self._with_plugins((slot,)), 0)

    def _with_plugins(self, slots: Any) -> dict[str, int]:
        """The rank-wide counters plus these plugins' own (added: a rank-wide count of the same name stays in);
        one plugin's is what it reports."""
        c = dict(self._counts)
        c["consumer_behind"] += self._n_behind
        with self._behind_lock:
            c.update(self._notes)
        c.update(self._extra())
        for s in slots:
            for k, v in s.counts.items():
                c[k] = c.get(k, 0) + v
        return c

    def note(self, name: str, value: int) -> None:
        """Record a fact for the plugins' loss accounting (e.g. clock_uncertainty_ns); reported at close. Never
        waits for a plugin callback (the user's op calls it)."""
        with self._behind_lock:
            self._notes[name] = int(value)

    def failed(self, error: str, message: str, op: str | None = None, seq: int | None = None) -> None:
        """An op raised `error` (its class name) with `message`: tell the plugins that have comm_failed, now (the
        trace of a rank killed later still says why it stopped). A callback that raises counts as the plugin's
        failure; one in another thread holding the host past _TELL_WAIT_S leaves the failure untold (logged)."""
        ts = time.monotonic_ns()
        if not self._lock.acquire(timeout=_TELL_WAIT_S):
            log.warning("slicetrace: the profiler plugins were not told of %s (a callback of theirs held the host "
                        "over %g s): %s", error, _TELL_WAIT_S, message)
            return
        try:
            for s in () if self._closed else self._slots:
                if s.disabled or not s.lp.hears_failures:
                    continue
                try:
                    s.lp.comm_failed(ts, error, message, op, seq)
                except Exception:
                    self._fail(s, "comm_failed", 1)
        finally:
            self._lock.release()

    def plugin_stats(self) -> list[dict[str, Any]]:
        return self._unlocked(lambda: [{"name": s.lp.name, "version": s.lp.version, "failures": s.failures,
                                        "disabled": s.disabled} for s in self._slots])
