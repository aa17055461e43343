"""The drain's ProxyCtrl states (stamps/drain.py): the drain is what NCCL's proxy thread is to ProxyCtrl.

Idle/Active: whether the last poll delivered (read, counted or ended) anything; said when it changes, stamped
at that poll's start when it appended ops (so its Append lies inside its Active), else at its end. Sleep: the
drain thread found no op to track and waits (its timed waits, and the idle polls between them, until an op
comes); Wakeup: a poll found one, or the drain stops. Append/AppendEnd: a poll took the ops submitted since
the last one (AppendEnd carries how many). Only transitions are said, each after one proxy_ctrl_on() (a plugin's
live mask has ProxyCtrl now, as NCCL rereads it per ProxyCtrl event); with it off, that check is all they cost.
An end is said whenever its start was, whatever the mask is by then (NCCL stops a started event through its
handle): a mask turned off during a Sleep left it open until close. The state numbers are NCCL's
(events.abi.State), which the consumer's proxy_ctrl(state, ts_ns, appended) takes.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

IDLE, ACTIVE, SLEEP, WAKEUP, APPEND, APPEND_END = range(13, 19)


def _off() -> bool:
    return False


class Ctrl:
    __slots__ = ("say_fn", "on", "clock", "state", "asleep", "slept", "kept", "t_poll")

    def __init__(self, consumer: Any, clock: Callable[[], int]):
        self.say_fn = getattr(consumer, "proxy_ctrl", None)
        self.on = _off if self.say_fn is None else getattr(consumer, "proxy_ctrl_on", None) or (lambda: True)
        self.clock = clock
        self.state = 0          # IDLE or ACTIVE, as the last poll found (0: no poll yet)
        self.asleep = False     # napping: a Wakeup is due
        self.slept = False      # the nap's Sleep was said (to a consumer with ProxyCtrl on then): so is its Wakeup
        self.kept = 0           # ops the last poll left tracked: ops beyond them were submitted since
        self.t_poll = 0         # the poll's start, if it appended ops (and ProxyCtrl is on)

    def say(self, state: int, ts_ns: int = 0, appended: int = 0) -> None:
        if self.on():
            self.say_fn(state, ts_ns or self.clock(), appended)

    def take_ops(self, ops: dict, lock: threading.Lock, force: bool) -> list:
        """A poll's copy of the drain's ops (taken under its lock): the Wakeup due once one is there (or the drain
        stops), and the ops new since the last poll appended (the span of taking them, as NCCL's Append)."""
        if self.asleep and (ops or force):
            self.asleep = False
            if self.slept:
                self.slept = False
                self.say_fn(WAKEUP, self.clock(), 0)
        t0 = self.t_poll = self.clock() if len(ops) != self.kept and self.on() else 0
        with lock:
            out = list(ops.values())
        new, self.kept = len(out) - self.kept, len(out)     # taken now: a poll that raises does not recount them
        if t0:
            self.say_fn(APPEND, t0, 0)
            self.say_fn(APPEND_END, self.clock(), new)
        return out

    def polled(self, kept: int, n: int, now: int) -> None:
        """A poll that left `kept` ops tracked delivered n (entries read or counted, ops ended) at `now`."""
        self.kept = kept
        if self.state != (ACTIVE if n else IDLE):
            self.state = ACTIVE if n else IDLE
            self.say(self.state, self.t_poll or now)

    def nap(self, poll_lock: threading.Lock, idle: Callable[[], bool]) -> None:
        """The drain thread is about to wait with no op to track: Sleep (after Idle), if idle() still holds under
        the poll lock (skipped while another poller has it), so no poll's transitions come between."""
        if not poll_lock.acquire(blocking=False):
            return
        try:
            if not idle():
                return
            self.asleep = True
            if self.state == ACTIVE:
                self.state = IDLE
                self.say(IDLE)
            self.slept = self.on()
            if self.slept:
                self.say_fn(SLEEP, self.clock(), 0)
        finally:
            poll_lock.release()
