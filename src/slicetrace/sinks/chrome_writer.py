"""The example plugin's writer: one thread per trace file that formats buffered records and appends them.

The host calls plugins under its lock, which the user's thread takes to begin an op. A KernelStep buffer written
inside the callback that filled it (a million rows, about a second to format and write) held the user's thread
for the host's whole 1 s wait, and the ops behind it went unprofiled (consumer_behind). Jobs run in the order
they were queued, so the file's records keep their order; the caller waits only when the KernelStep rows queued
would pass the limit (the writer a whole pool behind), which bounds the memory the queue holds.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable

log = logging.getLogger("slicetrace")


class Writer:
    def __init__(self, name: str, limit_rows: int):
        self._jobs: deque[tuple[Callable[[], None] | None, str | None, int]] = deque()
        self._cv = threading.Condition()
        self._limit = limit_rows
        self.queued: dict[str | None, int] = {}     # records per pool queued and not yet written
        self._stuck = False                         # room() timed out: later calls wait again once a job ends
        self._running: tuple[str | None, int] | None = None    # the job being run: its pool and records
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, job: Callable[[], None], pool: str | None = None, rows: int = 0) -> None:
        with self._cv:
            self._jobs.append((job, pool, rows))
            self.queued[pool] = self.queued.get(pool, 0) + rows
            self._cv.notify_all()

    def room(self, rows: int, timeout_s: float) -> bool:
        """Wait until `rows` more KernelSteps fit under the limit (or nothing is queued); False at the timeout, and
        at once while a previous wait's timeout stands (a hung disk: not another timeout_s per pool)."""
        deadline = time.monotonic() + (0.0 if self._stuck else timeout_s)
        with self._cv:
            while self.queued.get("KERNEL_STEP", 0) and self.queued["KERNEL_STEP"] + rows > self._limit:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    self._stuck = True
                    return False
                self._cv.wait(min(left, 1.0))
        self._stuck = False
        return True

    @property
    def stuck(self) -> bool:
        return self._stuck

    def abandon(self) -> dict[str | None, int]:
        """Give up on what is queued (close timed out): the records per pool it held, none of which is written
        after this; the job running may still finish (its rows are counted in it, not written twice)."""
        with self._cv:
            left = dict(self.queued)
            if self._running is not None:           # its own writes count its rows, written or lost
                left[self._running[0]] -= self._running[1]
            left = {k: v for k, v in left.items() if v}
            self._jobs.clear()
            self._jobs.append((None, None, 0))
            self._cv.notify_all()
        return left

    def close(self, timeout_s: float) -> bool:
        """Run what is queued, then end the thread; False if it has not finished within timeout_s."""
        with self._cv:
            self._jobs.append((None, None, 0))
            self._cv.notify_all()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs:
                    self._cv.wait()
                job, pool, rows = self._jobs.popleft()
                self._running = (pool, rows)
            if job is None:
                return
            try:
                job()
            except BaseException as e:      # noqa: BLE001 - jobs count their own failures; the thread goes on
                log.error("slicetrace example plugin: writing the trace failed: %r", e)
            finally:
                with self._cv:
                    self.queued[pool] -= rows
                    self._running = None
                    self._stuck = False             # it moves: a full buffer waits for it again
                    self._cv.notify_all()

    def pending(self, pool: Any) -> int:
        return self.queued.get(pool, 0)
