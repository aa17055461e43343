"""Peer liveness as the cuda backend checks it while it waits: closed communicators and exited processes,
each reported only when seen at two consecutive checks."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from slicetrace.backend import procs
from slicetrace.backend.procs import PeerWatch, pid_space, proc_dead, proc_start_time
from slicetrace.rendezvous import DictStore


def watch_pair() -> tuple[PeerWatch, PeerWatch]:
    store = DictStore({})
    return PeerWatch(store, "st/j/cuda1", 0), PeerWatch(store, "st/j/cuda1", 1)


def finished_child() -> subprocess.Popen:
    """A child that exits at once; killed (and the test failed) if it has not exited within 60 s."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(timeout=10)
        raise
    return child


def publish_as(w: PeerWatch, pid: int, space: str | None = None) -> None:
    w.store.set(f"{w.prefix}/proc/{w.rank}", f"{pid} {proc_start_time(pid)} {space or pid_space()}".encode())


def test_a_live_peer_and_an_unpublished_one_are_never_reported():
    me, peer = watch_pair()
    peer.publish()                                     # this very process: alive
    assert [me.gone((1, 2)) for _ in range(3)] == [None, None, None]


def test_a_peer_that_closed_is_reported_at_the_second_check():
    me, peer = watch_pair()
    peer.publish()
    assert me.gone((1,)) is None
    peer.closed()
    assert me.gone((1,)) is None                       # first sighting: it may have just finished our op
    assert me.gone((1,)) == "rank 1 closed its communicator"
    assert me.gone(()) is None                         # an op that does not need rank 1 is not affected


def test_an_exited_peer_and_a_zombie_are_reported():
    me, peer = watch_pair()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    publish_as(peer, child.pid)
    deadline = time.monotonic() + 60
    while proc_dead(child.pid, 0) is None and time.monotonic() < deadline:
        time.sleep(0.01)                               # not reaped yet: a zombie once it has exited
    if proc_dead(child.pid, 0) is None:                # never exited: kill it before failing
        child.kill()
        child.wait(timeout=10)
        pytest.fail("a child running `python -c pass` had not exited after 60 s")
    assert me.gone((1,)) is None
    assert me.gone((1,)) == "rank 1 died (zombie)"
    child.wait(timeout=10)                             # it has exited: this only reaps it
    me2, _ = watch_pair()
    me2.store = me.store
    assert me2.gone((1,)) is None
    assert me2.gone((1,)) == "rank 1 exited"


def test_a_condition_that_clears_between_checks_is_forgotten(monkeypatch):
    me, peer = watch_pair()
    publish_as(peer, os.getpid())
    seen = iter(["exited", None, "exited", None])
    monkeypatch.setattr(procs, "proc_dead", lambda pid, start: next(seen))
    assert [me.gone((1,)) for _ in range(4)] == [None, None, None, None]


def test_a_peer_gone_at_two_checks_counts_even_if_the_reason_changed(monkeypatch):
    """Zombie, then reaped: gone at both checks (the cpu Guard and this watch share the rule, procs.TwoChecks)."""
    me, peer = watch_pair()
    publish_as(peer, os.getpid())
    seen = iter(["died (zombie)", "exited"])
    monkeypatch.setattr(procs, "proc_dead", lambda pid, start: next(seen))
    assert me.gone((1,)) is None
    assert me.gone((1,)) == "rank 1 exited"


def test_a_peer_in_another_pid_namespace_is_not_judged_by_its_pid():
    """Its pid means nothing here (containers): only its closed key counts."""
    me, peer = watch_pair()
    child = finished_child()                            # a pid that is gone here
    publish_as(peer, child.pid, space="otherhost/pid:[1]")
    assert [me.gone((1,)) for _ in range(3)] == [None, None, None]
    peer.closed()
    assert me.gone((1,)) is None and me.gone((1,)) == "rank 1 closed its communicator"
