"""launch()'s signals: ranks start with SIGINT ignored around their fork, an interrupted launch lets its ranks
close (plugins write their traces), and SIGTERM/SIGINT are held while the ranks are killed and cleaned up."""
from __future__ import annotations

import glob
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from typing import Any

from .backend.signals import exit_handler, sigterm_as_exit

INTERRUPT_GRACE_S = 10.0     # an interrupted launch() lets its ranks close this long (plugins write their traces)


_SPAWN = mp.get_context("spawn")
# how the launcher asks its ranks to close when SIGINT is ignored (`cmd &` in a script: its ranks inherit that, so
# they ignored the request, were killed 10 s later and left traces cut short), and how an orphaned rank interrupts
# itself; fn should leave it alone (faulthandler.register(SIGUSR1) takes it over)
CLOSE_SIGNAL = signal.SIGUSR1


class _QuietProcess(_SPAWN.Process):
    """A spawned process started while SIGINT is ignored: it inherits SIG_IGN through its imports (no
    KeyboardInterrupt tracebacks from them; _child turns Ctrl-C back on once fn is loaded). Only the fork itself
    runs ignored (a Ctrl-C in those few ms is lost); the store's server ignores SIGINT for good."""

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return super().start()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            super().start()
        finally:
            signal.signal(signal.SIGINT, old if old is not None else signal.default_int_handler)


class _QuietContext:
    """The spawn context, whose processes are _QuietProcess (for SyncManager too)."""
    Process = _QuietProcess

    def __getattr__(self, name: str) -> Any:
        return getattr(_SPAWN, name)


def _let_ranks_close(procs: list, held: dict | None, sig: int = signal.SIGINT) -> None:
    """Interrupted (Ctrl-C, SIGTERM): each live rank gets `sig` (SIGINT, or CLOSE_SIGNAL when ranks ignore SIGINT;
    a rank the terminal's SIGINT reached is closing already and takes no second interrupt), so its error path
    aborts and closes its communicator and the profiler plugins write what they hold; the wait ends when they are
    gone, after INTERRUPT_GRACE_S, or at a signal that comes later than 0.5 s (a second Ctrl-C: timeout(1)
    signals the launcher, then its group, at once)."""
    t0 = time.monotonic()
    for p in procs:         # ranks the terminal's Ctrl-C reached are closing already; one signal each is enough
        p.join(max(0.0, 0.2 - (time.monotonic() - t0)))
    for p in procs:
        if p.is_alive():
            try:
                os.kill(p.pid, sig)
            except OSError:
                pass
    seen = None
    for p in procs:
        while p.is_alive() and time.monotonic() - t0 < INTERRUPT_GRACE_S:
            p.join(0.05)
            if held is not None and time.monotonic() - t0 > 0.5:
                if seen is None:
                    seen = len(held["came"])
                elif len(held["came"]) > seen:
                    return


def _terminate_as_exit():
    """SIGTERM to the launcher becomes SystemExit(143) while it waits, so its cleanup (kill the ranks, remove the
    shared memory) runs; returns the handler to restore, or None where it cannot be set (not the main thread)."""
    return signal.SIG_DFL if sigterm_as_exit() else None     # None: the application's own handler, left alone


def _hold_signals(term_after: Any) -> dict | None:
    """Defer SIGTERM and SIGINT while the ranks are killed and their memory removed: {signal: handler to put back}
    and the signals that came, or None where handlers cannot be set (not the main thread). term_after: the SIGTERM
    handler to put back instead of the current one (_terminate_as_exit's SystemExit), or None to keep it."""
    if threading.current_thread() is not threading.main_thread():
        return None
    came: list[int] = []
    old = {sig: signal.signal(sig, lambda n, f: came.append(n)) for sig in (signal.SIGTERM, signal.SIGINT)}
    if term_after is not None:
        old[signal.SIGTERM] = term_after
    return {"old": old, "came": came}


def _release_signals(held: dict | None) -> None:
    """Put the handlers back, then deliver what came meanwhile (once each), unless the launcher is already on its
    way out (SystemExit from the first SIGTERM, KeyboardInterrupt): the same request again."""
    if held is None:
        return
    for sig, h in held["old"].items():
        signal.signal(sig, h)
    if isinstance(sys.exc_info()[1], (SystemExit, KeyboardInterrupt)):
        return
    for sig in dict.fromkeys(held["came"]):
        signal.raise_signal(sig)


# ---- in a rank process: the launcher gone, asked to close, or Ctrl-C ----

ORPHAN_CHECK_S = 0.25
ORPHAN_GRACE_S = 10.0


def _remove_job_shm(job: str) -> None:
    for f in glob.glob(f"/dev/shm/*{job}*"):
        try:
            os.unlink(f)
        except OSError:
            pass


def _watch_parent(parent: int, grace_s: float, job: str, running: threading.Event | None) -> None:
    """A process of launch() whose launcher is gone (killed, even by SIGKILL) stops. A rank still inside fn gets a
    KeyboardInterrupt in its main thread, so its usual error path aborts its communicator (the other ranks learn of
    it); a rank already cleaning up is left to finish (an interrupt there would cut its close short). Whatever has
    not ended within grace_s removes the job's shared memory and exits."""
    import _thread
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    if grace_s > 0:
        if running is not None and running.is_set():
            _thread.interrupt_main(CLOSE_SIGNAL)        # our handler, whatever SIGINT's disposition or a C handler
            if signal.getsignal(CLOSE_SIGNAL) not in (signal.SIG_DFL, None):   # (SIG_DFL would kill it)
                signal.pthread_kill(threading.main_thread().ident, CLOSE_SIGNAL)   # a real one wakes a blocked call
        time.sleep(grace_s)
        _remove_job_shm(job)
    os._exit(1)


def _asked_to_close(signum: int, frame: Any) -> None:
    _no_interrupts()                 # once: a SIGINT pending beside it must not interrupt the close
    raise KeyboardInterrupt("the launcher asked the ranks to close (interrupted)")


def _interrupted(signum: int, frame: Any) -> None:
    _no_interrupts()                 # once: the launcher's own SIGINT must not cut fn's cleanup (its other
    raise KeyboardInterrupt          # communicators' plugins writing their traces)


def _ignore(signum: int, frame: object) -> None:
    """A Python handler that does nothing: with SIG_IGN, a signal already caught but not yet run (SIGTERM to the
    whole group beside the launcher's close signal) printed CPython's 'Signal 15 ignored due to race condition'."""


def _no_interrupts() -> None:
    for sig in (signal.SIGINT, CLOSE_SIGNAL, signal.SIGTERM):      # the close runs to its end (the launcher's
        signal.signal(sig, _ignore)                                # kill is SIGKILL)


# SIGTERM to the whole group (timeout(1), Slurm, Kubernetes, kill -- -PGID) reaches the ranks too: they close as on
# Ctrl-C (the default action killed them, every trace cut after its header)
_terminated = exit_handler(first=_no_interrupts)


def _start_watch(parent: int, grace_s: float, job: str, running: threading.Event | None = None) -> None:
    threading.Thread(target=_watch_parent, args=(parent, grace_s, job, running), name="slicetrace-parent-watch",
                     daemon=True).start()
