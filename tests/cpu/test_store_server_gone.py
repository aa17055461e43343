"""launch()'s store server (its one helper process: a multiprocessing Manager) killed: its ranks and the launcher
say so in one line, where the manager's 30-line traceback ending in ConnectionRefusedError led the LaunchError, and
a server killed while it started was blamed on the caller's module re-running launch()."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

import slicetrace
import slicetrace.launcher as launcher
from slicetrace.errors import PeerError
from slicetrace.rendezvous import DictStore, LaunchStore


def test_a_store_whose_server_is_gone_is_a_peer_error_naming_it():
    mgr = mp.get_context("spawn").Manager()
    store = LaunchStore(mgr.dict())
    store.set("k", b"1")
    mgr._process.kill()          # as SIGKILL would (the launcher's server goes with its launcher)
    mgr._process.join(10)
    for call in (lambda: store.set("a", b"1"), lambda: store.try_get("k"), lambda: store.claim("b", b"2"),
                 lambda: store.delete("k"), lambda: store.get("k", 1.0)):
        with pytest.raises(PeerError, match=r"^rendezvous store: could not (set|get|delete) '\w+': its server "
                                             r"process \(a multiprocessing Manager: launch\(\)'s.* is gone "
                                             r"\((ConnectionRefusedError|BrokenPipeError|EOFError|"
                                             r"ConnectionResetError|FileNotFoundError)"):
            call()
    mgr.shutdown()
    assert DictStore({}).try_get("x") is None       # a plain dict: nothing to lose


def _kill_self(*args):
    os.kill(os.getpid(), signal.SIGKILL)


def _never_run(comm):
    return comm.rank


def test_a_store_server_killed_while_it_starts_is_said_so(monkeypatch):
    monkeypatch.setattr(launcher, "_start_watch", _kill_self)     # the server's initializer: it dies at start
    with pytest.raises(slicetrace.LaunchError, match=r"^launch\(\): the store's server process \(pid \d+\) was killed "
                                                     r"by signal 9 while it started$"):
        slicetrace.launch(_never_run, 2, timeout_s=5.0, join_timeout_s=60)
    assert not [p for p in mp.active_children() if p.name.startswith("slicetrace-rank")]
