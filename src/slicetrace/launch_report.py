"""What launch() says about its ranks: how a rank ended (died, stuck in its close, still running at the deadline),
the line of each failure, and which rank the failure began at."""
from __future__ import annotations

import re

import os
import signal

from . import launch_signals
from .backend.procs import proc_stopped
from .launch_signals import CLOSE_SIGNAL, _let_ranks_close

# past timeout_s: a rank (each of its waits bounded by timeout_s) still running on after a failure, or still in its
# close, is stuck after this; read at call time (tests patch it where their point is not the 5 s)
CLOSE_SLACK_S = 5.0


def overdue(since: float, now: float, timeout_s: float) -> bool:
    """More than timeout_s + CLOSE_SLACK_S has passed since `since`: the one deadline of launch()'s waits."""
    return now - since > timeout_s + CLOSE_SLACK_S


def death_text(rank: int, code: int | None, started: bool) -> str:
    """A rank whose process ended without a word: its exit code and what that means."""
    if code == 0:           # os._exit(0) in fn, say
        return f"rank {rank} exited (code 0) without a result"
    return (f"rank {rank} died with exit code {code}" + (" (SIGKILL: the kernel's out-of-memory killer, if nobody else "
            "sent it; see dmesg)" if code == -9 else "") + (
                "" if started else " before running fn" if code is not None and code < 0 else (   # a signal
                    " before running fn: could it import fn? Spawned ranks import it by name: define it at the top "
                    "level of an importable module, and launch under `if __name__ == '__main__':` (the rank's own "
                    "error is on stderr)")))


def stuck_closing(closing: dict[int, float], done: set, now: float, timeout_s: float) -> dict[int, str]:
    """Ranks whose fn returned (closing: rank -> when it said so) still in their close timeout_s + CLOSE_SLACK_S
    later (stopped, or a plugin that never returns): rank -> its error. Their close cannot be asked to end (it runs
    with interrupts off), so they are killed."""
    return {r: f"rank {r} was still closing its communicator {now - t:.1f} s after its fn returned (timeout_s="
               f"{timeout_s:g} + {CLOSE_SLACK_S:g} s)" for r, t in closing.items()
            if r not in done and overdue(t, now, timeout_s)}


def ran_on(rank: int, first: int, after_s: float, timeout_s: float) -> str:
    """A rank still running at the deadline after rank `first` failed (it is asked to close next)."""
    return (f"rank {rank} was still running {after_s:.1f} s after rank {first} failed (timeout_s={timeout_s:g} + "
            f"{CLOSE_SLACK_S:g} s)")


def lingering(returned: dict[int, float], running: set[int], warned: set[int], now: float,
              timeout_s: float) -> list[str]:
    """A warning, once, for each rank that sent its result timeout_s + CLOSE_SLACK_S ago and whose process still
    runs (a non-daemon thread or an atexit hook of fn's): launch() waits for it, as it should for exit work, but
    says why it waits."""
    out = []
    for r in sorted(r for r, t in returned.items() if r in running and r not in warned
                    and overdue(t, now, timeout_s)):
        warned.add(r)
        out.append(f"launch(): rank {r} returned its result {now - returned[r]:.1f} s ago but its process has not "
                   f"exited (a non-daemon thread or an atexit hook still running?); waiting for it "
                   f"(join_timeout_s bounds the wait)")
    return out


def close_stuck(procs: list, stuck: set[int], started: set[int], closing: set[int], held: dict | None,
                errors: dict[int, str]) -> None:
    """Ranks still running at the deadline are asked to close (CLOSE_SIGNAL: their close writes the plugins'
    traces) and get INTERRUPT_GRACE_S to end before the SIGKILL; each one's error says which it was. One that has
    not reached fn has no handler (the signal would kill it), one in its close ignores it: both are killed. One
    stopped by a signal (SIGSTOP) could not run its handler: killed at once, not after the grace."""
    stopped = {r for r in stuck if procs[r].is_alive() and proc_stopped(procs[r].pid)}
    for r in stopped:
        try:
            os.kill(procs[r].pid, signal.SIGKILL)
        except OSError:
            pass
    asked = sorted(stuck & started - closing - stopped)
    _let_ranks_close([procs[r] for r in asked], held, CLOSE_SIGNAL)
    for r in sorted(stuck):
        errors[r] += ("; it was stopped by a signal (state T) and was killed at once" if r in stopped else
                      " and was killed (it had not started fn)" if r not in started else
                      "; it was killed" if r in closing else
                      f"; asked to close, it was still running {launch_signals.INTERRUPT_GRACE_S:g} s later and "
                      f"was killed" if procs[r].is_alive() else "; asked to close, it closed")


def failure_line(rank: int, text: str) -> str:
    """"rank R failed: <the rank's error>", or the launcher's own finding as it is: it names the rank already
    ("rank 1 died with exit code 3", not "rank 1 failed: rank 1 died ...")."""
    return text if re.match(rf"rank {rank}\b", text) else f"rank {rank} failed: {text}"


def lead(k: int, errors: dict, dead: set, stuck: set) -> tuple:
    """Sort key for the rank where a failure began: one the launcher found dead (its own finding, never a match on
    error text: a user's message may say "died"), then one whose own error it is, then a peer's failure relayed,
    then one killed for running on."""
    head = errors[k].split("\n", 1)[0]
    relayed = head.startswith("PeerError") or "(abort posted by rank" in head     # another rank's failure
    return (0 if k in dead else 3 if k in stuck else 2 if relayed else 1, k)
