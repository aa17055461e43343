"""The signals a Ctrl-C or the launcher sends, kept out of the library's threads and held in the main thread while
it hands records to the plugins (an interrupt there left a plugin's event half-made, or its trace unended)."""
from __future__ import annotations

import itertools
import logging
import os
import select
import signal
import threading
import time
from typing import Any, Callable, NoReturn

try:        # the C module signal.py wraps: its calls skip the enum conversions (0.3 us a call, not 3.7 us)
    import _signal as _raw
except ImportError:     # pragma: no cover - not CPython
    _raw = signal

HELD_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", signal.SIGINT)})
_HELD_INTS = tuple(sorted(int(s) for s in HELD_SIGNALS))
_MASKABLE = hasattr(signal, "pthread_sigmask")


def quiet_thread() -> None:
    """In a thread of ours: HELD_SIGNALS blocked, so a process-directed one is not taken there (its waits are not
    cut short by EINTR); whichever thread takes it, Python runs the handler in the main thread."""
    if _MASKABLE and threading.current_thread() is not threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)


FORCE_AFTER_S = 1.0     # the same signal again this long after the first goes through (a plugin hung in the hold)


class signals_held:
    """HELD_SIGNALS wait until the block ends, then come as they would have. Python-level handlers are swapped for a
    recorder, and what it recorded is raised again at the end. Blocking the signals (pthread_sigmask) was not
    enough: the kernel hands a process-directed one to a thread that does not block it (numpy's OpenBLAS workers,
    in every process of ours) and Python runs the handler in the main thread at once. A signal left at SIG_DFL ends
    the process whatever is held. The same signal again FORCE_AFTER_S or more after the first goes through at once
    (a second Ctrl-C ends a hold stuck in a plugin; launch() forwards a Ctrl-C to its ranks after 0.2 s), and a
    signal still held by then says so on stderr. A handler the body set is kept. Off the main thread (no handlers
    run there) it does nothing."""
    __slots__ = ("came", "swapped", "first", "record", "hid")

    def __enter__(self) -> "signals_held":
        self.hid = next(_HOLD_IDS) % 255 + 1     # the notifier's key: an inner hold's end cancels its own line only
        self.came: list[int] = []
        self.swapped: dict[int, Any] = {}
        self.first: dict[int, float] = {}
        self.record = self._record
        if threading.current_thread() is not threading.main_thread():
            return self
        _Notifier.ensure()
        _HOLDS.append(self)
        try:
            for sig in _HELD_INTS:
                h = _raw.getsignal(sig)
                if callable(h):                 # SIG_IGN, SIG_DFL and C handlers (None) stay
                    self.swapped[sig] = h
                    _raw.signal(sig, self.record)
        except BaseException:                   # a handler not yet swapped ran and raised: no __exit__ follows
            self.__exit__()
            raise
        return self

    def _record(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if signum not in self.first:
            self.first[signum] = now
            _Notifier.tell(self.hid, signum)    # bytes to a pipe: a thread started here could deadlock (its lock)
        if now - self.first[signum] < FORCE_AFTER_S:
            self.came.append(signum)
            return
        self.came = [s for s in self.came if s != signum]      # delivered now, not again at the end
        self._end()
        caught = _restore(self.swapped, self.record)
        self.swapped = {}
        h = _raw.getsignal(signum)
        if callable(h):
            h(signum, frame)
        if caught is not None:
            raise caught

    def _end(self) -> None:
        if self.first:
            _Notifier.tell(self.hid, 0)

    def __exit__(self, *exc: Any) -> None:
        self._end()
        caught = _restore(self.swapped, self.record)
        self.swapped = {}
        if self in _HOLDS:                      # after the restore: a fork in between still finds it
            _HOLDS.remove(self)
        for sig in dict.fromkeys(self.came):    # each in turn: one whose handler raises must not drop the others
            try:
                signal.raise_signal(sig)
            except BaseException as e:  # noqa: BLE001 - raised once all came
                caught = caught if caught is not None else e
        self.came = []
        if caught is not None:
            raise caught


class _Notifier:
    """Says on stderr that a signal is still held FORCE_AFTER_S after it came (a plugin stuck in the hold), from a
    thread of its own started outside any handler: one started in the handler could deadlock on threading's lock,
    which the interrupted main thread may hold. Handlers write two bytes to its pipe in one write: the hold's id,
    then the signal, or 0 at that hold's end. One per process (a forked child starts its own)."""
    pid = -1
    wfd = -1

    @classmethod
    def ensure(cls) -> None:
        if cls.pid == os.getpid():
            return
        try:
            r, w = os.pipe()
        except OSError:
            return
        try:
            threading.Thread(target=cls._run, args=(r,), name="slicetrace-held-signal", daemon=True).start()
        except RuntimeError:            # no new thread at the interpreter's shutdown: nothing will be said
            os.close(r)
            os.close(w)
            return
        cls.pid, cls.wfd = os.getpid(), w

    @classmethod
    def tell(cls, hid: int, byte: int) -> None:
        if cls.pid == os.getpid():
            try:
                os.write(cls.wfd, bytes((hid, byte)))      # under PIPE_BUF: never split
            except OSError:
                pass

    @staticmethod
    def _run(rfd: int) -> None:
        quiet_thread()
        pending: dict[int, tuple[int, float]] = {}      # hold id -> (signal, when to say it)
        while True:
            wait = None if not pending else max(0.0, min(t for _, t in pending.values()) - time.monotonic())
            if select.select([rfd], [], [], wait)[0]:
                data = os.read(rfd, 64)         # whole pairs: each came in one write, and 64 is even
                for hid, b in zip(data[::2], data[1::2]):
                    if b == 0:
                        pending.pop(hid, None)
                    elif hid not in pending:
                        pending[hid] = (b, time.monotonic() + FORCE_AFTER_S)
            now = time.monotonic()
            for hid, (sig, t) in list(pending.items()):
                if t <= now:
                    _say_held(sig)
                    del pending[hid]


def _say_held(signum: int) -> None:
    name, again = (("Ctrl-C (SIGINT)", "press Ctrl-C again") if signum == signal.SIGINT else
                   (signal.Signals(signum).name, f"send {signal.Signals(signum).name} again"))
    try:                                # one write: not interleaved with the main thread's stderr
        os.write(2, f"slicetrace: {name} held until the profiler plugins finish their traces; {again} to "
                    f"interrupt now, cutting them short\n".encode())
    except OSError:
        pass


_HOLDS: list = []       # holds under way in the main thread, innermost last (a forked child drops them)
_HOLD_IDS = itertools.count()


def _restore(swapped: dict[int, Any], record: Any) -> BaseException | None:
    """Put the handlers back where the recorder still stands (one the body set stays). signal.signal runs pending
    handlers first: one restored already (KeyboardInterrupt) would stop the others' restoring, which then recorded
    for good. Each is repeated until it holds (idempotent); the first such exception is returned."""
    caught: BaseException | None = None
    todo = list(swapped.items())
    while todo:
        try:
            while todo:
                sig, h = todo[-1]
                if _raw.getsignal(sig) == record:
                    _raw.signal(sig, h)
                todo.pop()
        except BaseException as e:  # noqa: BLE001 - a handler's exception, raised by the caller once all is back
            if caught is None:
                caught = e
    return caught


def exit_handler(first: Callable[[], None] | None = None, parent_only: bool = False) -> Callable[[int, Any], NoReturn]:
    """A new signal handler that raises SystemExit(128 + signum) (the status a shell gives a process the signal
    killed), so the program unwinds and its cleanup runs; first(), if given, runs before. New at each call: an
    installer tells its own handler from another's (term_exits puts the default back over its own only).
    parent_only: as SIGTERM's handler, a forked child puts the default back (what it guards is the parent's)."""
    def exit_(signum: int, frame: Any) -> NoReturn:
        if first is not None:
            first()
        raise SystemExit(128 + signum)
    exit_.parent_only = parent_only             # type: ignore[attr-defined]
    return exit_


_TERM_OWNERS: set = set()     # profiled communicators, while SIGTERM raises SystemExit for them
_WARNED: list = []


def _killed_if_unowned() -> None:
    """The last owner closed off the main thread, where no handler can be set: the default comes back here (in
    the main thread) and kills the process as it would have."""
    if not _TERM_OWNERS:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


_term_exits = exit_handler(first=_killed_if_unowned, parent_only=True)


def sigterm_default() -> bool:
    """SIGTERM is at its default action, or at term_exits' handler with no owner left (put back to the default
    now, in the main thread): a handler may be set over it."""
    cur = signal.getsignal(signal.SIGTERM)
    if cur is _term_exits and not _TERM_OWNERS and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        cur = signal.SIG_DFL
    return cur is signal.SIG_DFL


def sigterm_as_exit() -> bool:
    """In the main thread with SIGTERM at its default (sigterm_default): SIGTERM raises SystemExit(143) from now on,
    until the caller puts the default back (a child forked meanwhile is killed: what the caller guards is its own);
    else False, nothing set (the application's own handler is left alone)."""
    if threading.current_thread() is not threading.main_thread() or not sigterm_default():
        return False
    signal.signal(signal.SIGTERM, exit_handler(parent_only=True))
    return True


def term_exits(owner: object, on: bool) -> None:
    """While an owner is registered (a communicator with plugins), SIGTERM at its default action raises
    SystemExit(143) in the main thread instead, so the program unwinds and the at-exit finish writes the traces:
    torchrun's agent and Slurm stop ranks with SIGTERM, whose default killed them, every trace cut short. A handler
    the program set is left alone; the default comes back with the last owner, or, when that closes off the main
    thread, at the next main-thread call here or sigterm_default(), or when a SIGTERM comes (it then kills)."""
    (_TERM_OWNERS.add if on else _TERM_OWNERS.discard)(owner)
    if threading.current_thread() is not threading.main_thread():
        if on and not _WARNED and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            _WARNED.append(True)        # once a process: handlers are set from the main thread only
            logging.getLogger("slicetrace").warning(
                "slicetrace: a communicator with profiler plugins was made outside the main thread, where SIGTERM "
                "(torchrun, Slurm) cannot be turned into an exit that finishes its trace: set a SIGTERM handler "
                "in the main thread, e.g. signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))")
        return
    cur = signal.getsignal(signal.SIGTERM)
    if _TERM_OWNERS and cur is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _term_exits)
    elif not _TERM_OWNERS and cur is _term_exits:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _forked_child() -> None:
    """A forked child (a DataLoader worker) owns none of its parent's communicators, holds or set-up: signals come
    at once (a hold forked from another thread never ends in the child: they were recorded for good; what the
    parent's recorded is the parent's), and SIGTERM kills it again, as it would without slicetrace, rather than
    raise SystemExit wherever the child's own code runs."""
    _TERM_OWNERS.clear()
    try:
        for hold in reversed(_HOLDS):   # innermost first: an outer hold's recorder comes back, then goes
            _restore(hold.swapped, hold.record)
            hold.swapped, hold.came = {}, []
        _HOLDS.clear()
        if getattr(signal.getsignal(signal.SIGTERM), "parent_only", False):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:                  # not the interpreter's main thread: nothing to undo there
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)
