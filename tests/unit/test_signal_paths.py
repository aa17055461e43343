"""Signal handlers slicetrace sets and must take away again: SIGTERM-as-exit once the last profiled communicator
closed off the main thread, and what a forked child inherits from a hold or set-up's SIGTERM window."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slicetrace.backend import signals as sg
from slicetrace.backend.segment import sigterm_exits
from slicetrace.backend.signals import exit_handler, signals_held
from slicetrace.launch_signals import _terminate_as_exit
from tests.helpers.procs import wait_child

ROOT = Path(__file__).resolve().parents[2]


def _script(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLICETRACE_", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code, *args], timeout=120, cwd=str(ROOT), env=env,
                          capture_output=True, text=True)


def test_sigterm_kills_again_once_the_last_profiled_communicator_closed_off_the_main_thread(tmp_path):
    """close() in another thread cannot set a handler: SIGTERM kept raising SystemExit(143) for good (a program
    that catches SystemExit, or waits in a finally, was no longer stopped by it). Set-up's window still exits."""
    code = ("import signal, sys, threading, slicetrace\n"
            "from slicetrace.backend.segment import sigterm_exits\n"
            "c = slicetrace.init(backend='null', profiler_plugin='example', profile_dump_file=sys.argv[1] + '/a')\n"
            "t = threading.Thread(target=c.close)\nt.start()\nt.join(60)\nassert not t.is_alive()\n"
            "try:\n    with sigterm_exits():\n        signal.raise_signal(signal.SIGTERM)\n"
            "except SystemExit as e:\n    assert e.code == 143, e.code\n"
            "else:\n    sys.exit('set-up window: no SystemExit')\n"
            "signal.raise_signal(signal.SIGTERM)\n"
            "sys.exit(7)\n")
    p = _script(code, str(tmp_path))
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stderr)


@pytest.fixture
def own_handlers():
    """SIGINT as Python's, SIGTERM at its default, SIGUSR1 as it was; all put back after the test."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, h in old.items():
        signal.signal(s, h)


def _forked_from_a_thread(child) -> int:
    """Fork from another thread (the main one goes on with what it holds); child() runs in the child, which then
    leaves with os._exit(1) unless child left otherwise. The child's exit code."""
    pids: list = []

    def fork():
        pid = os.fork()
        if pid == 0:
            try:
                child()
            finally:
                os._exit(1)
        pids.append(pid)
    t = threading.Thread(target=fork)
    t.start()
    t.join(30)
    assert pids, "no fork"
    return wait_child(pids[0])


def _interrupts_and_terminations_come() -> None:
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        try:
            signal.raise_signal(signal.SIGTERM)
        except SystemExit as e:
            os._exit(0 if e.code == 143 else 2)


def test_a_child_forked_during_a_hold_takes_its_signals_at_once(own_handlers):
    """The child kept the hold's recorder (its hold never ends there): Ctrl-C and SIGTERM were recorded for good,
    and the child could not be interrupted or terminated."""
    signal.signal(signal.SIGTERM, exit_handler())
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            signal.raise_signal(signal.SIGINT)          # the parent's, not the child's
            code = _forked_from_a_thread(_interrupts_and_terminations_come)
    assert code == 0


@contextlib.contextmanager
def _launchers_window():
    old = _terminate_as_exit()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.parametrize("window", [sigterm_exits, _launchers_window], ids=["set-up", "launch"])
def test_a_child_forked_during_a_sigterm_as_exit_window_is_killed_by_sigterm(own_handlers, window):
    """The child kept the SIGTERM-as-exit of the cpu set-up (its segment names in /dev/shm) or of launch() (its
    ranks): the window ends in the parent only, and SIGTERM raised SystemExit wherever the child's own code ran,
    instead of ending it."""
    with window():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        code = _forked_from_a_thread(lambda: signal.raise_signal(signal.SIGTERM))
    assert code == -signal.SIGTERM


def test_a_signal_still_held_when_a_second_one_would_go_through_says_so(own_handlers, monkeypatch, capfd):
    """A Ctrl-C in a close stuck in a plugin (a trace on a hung mount) waited without a word: nothing told the user
    that pressing it again interrupts. Said once the second one would go through, and only while still held."""
    monkeypatch.setattr(sg, "FORCE_AFTER_S", 0.5)    # the two presses, back to back, well inside it
    err = ""
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)                  # at once: held too, and said once
            deadline = time.monotonic() + 30
            while "again" not in err and time.monotonic() < deadline:
                time.sleep(0.01)
                err += capfd.readouterr().err
    time.sleep(0.2)                                             # said once, not again
    err += capfd.readouterr().err
    assert err == ("slicetrace: Ctrl-C (SIGINT) held until the profiler plugins finish their traces; press Ctrl-C "
                   "again to interrupt now, cutting them short\n"), err

    monkeypatch.setattr(sg, "FORCE_AFTER_S", 1.0)
    with pytest.raises(SystemExit):
        signal.signal(signal.SIGTERM, exit_handler())
        with signals_held():
            signal.raise_signal(signal.SIGTERM)                 # the hold ends long before it would be said
    time.sleep(1.5)                                             # past the time it would have been said
    assert capfd.readouterr().err == ""


def test_an_inner_hold_ending_does_not_unsay_an_outer_holds_signal(own_handlers, monkeypatch, capfd):
    """A hold inside another (close's inside the at-exit one): the inner one's end wrote the notifier a 0, which
    cancelled the line for the Ctrl-C the outer hold still held. Each hold cancels only its own."""
    monkeypatch.setattr(sg, "FORCE_AFTER_S", 1.0)    # both presses held, even with a GC between
    err = ""
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            signal.raise_signal(signal.SIGINT)                  # held by the outer hold
            with signals_held():
                signal.raise_signal(signal.SIGINT)              # held by the inner one, which ends at once
            deadline = time.monotonic() + 30
            while "again" not in err and time.monotonic() < deadline:
                time.sleep(0.01)
                err += capfd.readouterr().err
    time.sleep(0.6)                                             # said once, not again
    err += capfd.readouterr().err
    assert err == ("slicetrace: Ctrl-C (SIGINT) held until the profiler plugins finish their traces; press Ctrl-C "
                   "again to interrupt now, cutting them short\n"), err


def _recorder_stands() -> bool:
    """A hold's recorder takes SIGINT now: a hold is in _HOLDS before it swaps the handlers, and a Ctrl-C in between
    runs the old one (KeyboardInterrupt out of the close before it closed anything)."""
    holds = list(sg._HOLDS)
    return bool(holds) and signal.getsignal(signal.SIGINT) == holds[-1].record


def test_a_second_ctrl_c_in_a_close_stuck_on_a_plugin_stops_the_close_now(tmp_path, monkeypatch, own_handlers,
                                                                         caplog):
    """The second Ctrl-C went through the hold but cut one step only: the close went on to wait for the stuck
    callback again (the host's lock, up to timeout_s) before it raised. Now its other steps wait for nothing."""
    from tests.unit.test_close_stuck import Stuck, _all_reduce, _gpu
    from tests.unit.test_gpu_writer_session import GpuLike
    monkeypatch.setattr(sg, "FORCE_AFTER_S", 0.05)
    p = Stuck()
    s = _gpu(tmp_path, monkeypatch, GpuLike, [p], timeout_s=60)
    _all_reduce(s, 1)
    assert s.drain.flush(10)
    p.block = True
    _all_reduce(s, 2)
    assert p.entered.wait(10)
    main, done = threading.main_thread().ident, threading.Event()

    def presses():              # the first once the close holds signals, the second once it would go through
        deadline = time.monotonic() + 30
        while not _recorder_stands() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGINT)
        while sg._HOLDS and time.monotonic() < deadline:
            first = sg._HOLDS[-1].first.get(signal.SIGINT)
            if first is not None and time.monotonic() - first > 2 * sg.FORCE_AFTER_S:
                signal.pthread_kill(main, signal.SIGINT)
                break
            time.sleep(0.01)
        if not done.wait(20):   # the close still waits for the callback: let it return
            p.release.set()
    t = threading.Thread(target=presses, daemon=True)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            s.close()
        returned_first = not p.release.is_set()
        done.set()
        assert returned_first, "the close waited for the stuck plugin callback after the second Ctrl-C"
        assert s.backend._closed                                # the backend still freed
        assert "flushing the profiler drain interrupted (KeyboardInterrupt())" in caplog.text
    finally:
        done.set()
        p.release.set()
        t.join(30)
        s.drain._thread.join(10)



_AT_EXIT = """
import atexit, signal, time
from slicetrace.backend import signals as sg
signal.signal(signal.SIGINT, signal.default_int_handler)   # a background job (CI's) starts with SIGINT ignored
sg.FORCE_AFTER_S = 0.2
with sg.signals_held():         # as every profiled rank's set-up holds one, well before its exit
    pass

@atexit.register                # as _finish_at_exit's hold over a plugin stuck at exit
def stuck():
    with sg.signals_held():
        signal.raise_signal(signal.SIGINT)
        time.sleep(3)
"""


def test_a_signal_held_at_exit_is_still_said():
    """The message came from a thread started in the handler, and from Python 3.12 no thread starts at the
    interpreter's exit (RuntimeError), where _finish_at_exit holds signals over the plugins: a Ctrl-C there went
    unsaid. The thread that says it runs from the first hold on; the handler only writes it a byte."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    src = str(Path(__file__).resolve().parents[2] / "src")
    p = subprocess.run([sys.executable, "-c", _AT_EXIT], env={**os.environ, "PYTHONPATH": src},
                       capture_output=True, text=True, timeout=60)
    assert "slicetrace: Ctrl-C (SIGINT) held until the profiler plugins finish their traces; press Ctrl-C again " \
        "to interrupt now" in p.stderr, p.stderr


def test_a_rank_closing_keeps_python_handlers_so_a_signal_caught_before_the_switch_is_not_reported_as_a_race():
    """_no_interrupts (a rank's close) used SIG_IGN: a SIGTERM to the group caught just before the switch (timeout(1)
    signals the launcher, whose close signal reaches the rank, then the group) then had no Python handler to run,
    and CPython printed 'Signal 15 ignored due to race condition' with a traceback. A do-nothing Python handler
    takes it instead; the signals still cannot interrupt the close."""
    from slicetrace.launch_signals import CLOSE_SIGNAL, _no_interrupts
    sigs = (signal.SIGINT, CLOSE_SIGNAL, signal.SIGTERM)
    old = {s: signal.getsignal(s) for s in sigs}
    try:
        _no_interrupts()
        for s in sigs:
            h = signal.getsignal(s)
            assert callable(h) and h not in (signal.SIG_IGN, signal.SIG_DFL, signal.default_int_handler), (s, h)
            assert h(s, None) is None
        os.kill(os.getpid(), signal.SIGTERM)        # taken by it: nothing raised, the process goes on
        os.kill(os.getpid(), signal.SIGINT)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
