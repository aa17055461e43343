"""The signals a Ctrl-C or the launcher sends, kept out of the library's threads and held in the main thread while
it hands records to the plugins (an interrupt there left a plugin's event half-made, or its trace unended)."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

try:        # the C module signal.py wraps: its calls skip the enum conversions (0.3 us a call, not 3.7 us)
    import _signal as _raw
except ImportError:     # pragma: no cover - not CPython
    _raw = signal

HELD_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", signal.SIGINT)})
_HELD_INTS = tuple(sorted(int(s) for s in HELD_SIGNALS))
_MASKABLE = hasattr(signal, "pthread_sigmask")


def quiet_thread() -> None:
    """In a thread of ours: HELD_SIGNALS blocked, so the kernel hands a process-directed one elsewhere (the main
    thread, or a thread we did not start) and not to a library thread that may sit in a plugin's callback."""
    if _MASKABLE and threading.current_thread() is not threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """HELD_SIGNALS wait until the block ends, then come as they would have. Blocking them in the main thread is
    not enough: the kernel hands a process-directed one to a thread that does not block it (numpy's OpenBLAS
    workers, in every process of ours) and Python runs the handler in the main thread at once. So Python-level
    handlers are swapped for a recorder, and what it recorded is raised again at the end. Off the main thread
    (no handlers run there) it does nothing."""
    if not _MASKABLE or threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def record(signum: int, frame: Any) -> None:
        came.append(signum)
    swapped: dict[int, Any] = {}
    old = _raw.pthread_sigmask(signal.SIG_BLOCK, _HELD_INTS)
    try:
        for sig in _HELD_INTS:
            h = _raw.getsignal(sig)
            if callable(h):                 # SIG_IGN, SIG_DFL and C handlers (None) are left to the mask
                swapped[sig] = h
                _raw.signal(sig, record)
        yield
    finally:
        caught = _restore(swapped, old)
        for sig in dict.fromkeys(came):
            signal.raise_signal(sig)
        if caught is not None:
            raise caught


def _restore(swapped: dict[int, Any], mask: Any) -> BaseException | None:
    """Put the handlers and the mask back. signal.signal and pthread_sigmask run pending handlers: one restored
    first (KeyboardInterrupt) would stop the others' restoring, and the main thread kept the signals blocked for
    good. Each step is repeated until it holds (they are idempotent); the first such exception is returned."""
    caught: BaseException | None = None
    todo = list(swapped.items())
    while True:
        try:
            while todo:
                _raw.signal(*todo[-1])
                todo.pop()
            _raw.pthread_sigmask(signal.SIG_SETMASK, mask)
            return caught
        except BaseException as e:  # noqa: BLE001 - a handler's exception, raised by the caller once all is back
            if caught is None:
                caught = e
