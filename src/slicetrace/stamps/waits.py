"""How the drain's pollers wait between polls, a flush, and where a stuck one is (stamps/drain.py)."""
from __future__ import annotations

import sys
import threading
import time
import traceback

import numpy as np

MAX_INTERVAL_S = 0.016  # adaptive polling backs off to this: each poll has a fixed cost, batches amortise it
FIRST_PAUSE_S = 20e-6   # a flush's pause after progress: an op about to end is seen at once
FLUSH_MAX_PAUSE_S = 0.002   # its longest: a flush returns at most this late (16 ms was seen late by 9 ms)


class Backoff:
    """A flush's pauses between its polls: tiny while the drain makes progress, doubling up to FLUSH_MAX_PAUSE_S
    while it does not (at 20 us, an op that never completes, e.g. a dead peer, cost ~37% of a core for the whole
    timeout; at 2 ms a few %)."""

    def __init__(self, cursor: np.ndarray) -> None:
        self._cursor, self._seen, self._pause = cursor, int(cursor.sum()), FIRST_PAUSE_S

    def sleep(self, n: int, deadline: float) -> None:
        """After a poll that consumed or ended n; a moved cursor is progress too (the drain thread's polls)."""
        seen = int(self._cursor.sum())
        if n or seen != self._seen:
            self._seen, self._pause = seen, FIRST_PAUSE_S
        time.sleep(max(0.0, min(self._pause, deadline - time.monotonic())))
        self._pause = min(FLUSH_MAX_PAUSE_S, self._pause * 2)


def flush(drain, timeout_s: float) -> bool:
    """Drain.flush: poll until every op submitted before the call has ended; False past timeout_s."""
    deadline, wait = time.monotonic() + timeout_s, Backoff(drain.cursor)
    ops = drain.pending()
    while ops and drain.still_pending(ops):  # the caller polls too, but waits no longer than the deadline for a poller
        n = drain.poll_once(False, max(0.0, deadline - time.monotonic()))
        if n is None or (time.monotonic() > deadline and drain.still_pending(ops)):
            return False
        wait.sleep(n, deadline)
    return True


def stuck_in(t: threading.Thread) -> str:
    """The calls thread t is in, innermost first: the one that does not return."""
    f = sys._current_frames().get(t.ident)
    return " <- ".join(f"{x.name} ({x.filename.rsplit('/', 1)[-1]}:{x.lineno})"
                       for x in reversed(traceback.extract_stack(f, 3) if f else []))
