"""Peer liveness as the cuda backend checks it while it waits: closed communicators and exited processes,
each reported only when seen at two checks at least 20 ms apart."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from slicetrace.backend import procs
from slicetrace.backend.procs import PeerWatch, pid_space, proc_dead, proc_start_time
from slicetrace.errors import PeerError
from slicetrace.rendezvous import DictStore


def check(w: PeerWatch, peers: tuple[int, ...]) -> str | None:
    """One check, as a waiting rank makes them: apart in time (its checks are a few times a second)."""
    time.sleep(0.025)
    return w.gone(peers)


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
    assert [check(me, (1, 2)) for _ in range(3)] == [None, None, None]


def test_a_peer_that_closed_is_reported_at_the_second_check():
    me, peer = watch_pair()
    peer.publish()
    assert check(me, (1,)) is None
    peer.closed()
    assert check(me, (1,)) is None                       # first sighting: it may have just finished our op
    assert check(me, (1,)) == "rank 1 closed its communicator"
    assert check(me, ()) is None                         # an op that does not need rank 1 is not affected


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
    assert check(me, (1,)) is None
    assert check(me, (1,)) == "rank 1 died (zombie)"
    child.wait(timeout=10)                             # it has exited: this only reaps it
    me2, _ = watch_pair()
    me2.store = me.store
    assert check(me2, (1,)) is None
    assert check(me2, (1,)) == "rank 1 exited"


def test_a_condition_that_clears_between_checks_is_forgotten(monkeypatch):
    me, peer = watch_pair()
    publish_as(peer, os.getpid())
    seen = iter(["exited", None, "exited", None])
    monkeypatch.setattr(procs, "proc_dead", lambda pid, start: next(seen))
    assert [check(me, (1,)) for _ in range(4)] == [None, None, None, None]


def test_a_peer_gone_at_two_checks_counts_even_if_the_reason_changed(monkeypatch):
    """Zombie, then reaped: gone at both checks (the cpu Guard and this watch share the rule, procs.TwoChecks)."""
    me, peer = watch_pair()
    publish_as(peer, os.getpid())
    seen = iter(["died (zombie)", "exited"])
    monkeypatch.setattr(procs, "proc_dead", lambda pid, start: next(seen))
    assert check(me, (1,)) is None
    assert check(me, (1,)) == "rank 1 exited"


def test_a_peer_in_another_pid_namespace_is_not_judged_by_its_pid():
    """Its pid means nothing here (containers): only its closed key counts."""
    me, peer = watch_pair()
    child = finished_child()                            # a pid that is gone here
    publish_as(peer, child.pid, space="otherhost/pid:[1]")
    assert [check(me, (1,)) for _ in range(3)] == [None, None, None]
    peer.closed()
    assert check(me, (1,)) is None and check(me, (1,)) == "rank 1 closed its communicator"


def test_two_checks_back_to_back_are_one_sighting(monkeypatch):
    """The wait and the watchdog share one watch: their checks, microseconds apart, confirmed a peer gone before
    the waiting side had looked at its data again (a false PeerError for a peer that sent all and exited)."""
    import types
    now = [100.0]
    monkeypatch.setattr(procs, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    me, peer = watch_pair()
    peer.closed()
    assert [me.gone((1,)) for _ in range(50)] == [None] * 50
    now[0] += 0.0195
    assert me.gone((1,)) is None
    now[0] += 0.001                         # 20.5 ms after the first sighting
    assert me.gone((1,)) == "rank 1 closed its communicator"


def test_the_cuda_close_barrier_waits_for_a_late_rank_past_peers_that_closed():
    """The close barrier checked peers as an op's wait does: ranks 0 and 1 closed together, each saw the other's
    closed key while rank 2 was still on its way, and both failed the barrier ("rank 1 closed its communicator"),
    skipping the unreceived-message and mismatch checks and freeing memory before rank 2 was done."""
    import threading
    import types

    from slicetrace.backend.cuda.completion import Completion
    store, prefix, world = DictStore({}), "st/j/cuda1", 3
    ranks = []
    for r in range(world):
        be = types.SimpleNamespace(store=store, rank=r, world=world, _prefix=prefix,
                                   watch=PeerWatch(store, prefix, r))
        be.watch.publish()
        ranks.append(be)
    res = {}

    def close(r: int, delay: float) -> None:
        time.sleep(delay)
        be = ranks[r]
        be.watch.closed()                   # what close() does before its barrier
        try:
            store.barrier(f"{prefix}/close", r, world, 10.0,
                          check=lambda: Completion.check_peers(be, closing=True))
            res[r] = "met"
        except Exception as e:              # noqa: BLE001 - the outcome is what the test compares
            res[r] = f"{type(e).__name__}: {e}"
    for be in ranks:
        be._abort_reason = types.MethodType(Completion._abort_reason, be)
    ts = [threading.Thread(target=close, args=(r, d)) for r, d in ((0, 0.0), (1, 0.0), (2, 0.5))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in ts)
    assert res == {0: "met", 1: "met", 2: "met"}
    me = ranks[0]                           # an op's wait (not closing) still reports a closed peer
    assert Completion.check_peers(me) is None
    time.sleep(0.025)
    with pytest.raises(PeerError, match="rank 0: rank 1 closed its communicator"):
        Completion.check_peers(me)


def test_the_cuda_close_barrier_finds_a_peer_that_closed_and_died_before_it_came_not_one_that_came():
    """closed_ok took a closed peer for on its way whatever became of its process: one killed between closing and
    the barrier left the others waiting out timeout_s. One that reached the barrier may exit."""
    import types

    from slicetrace.backend.cuda.completion import Completion
    store, prefix = DictStore({}), "st/j/cuda1"
    me = types.SimpleNamespace(store=store, rank=0, world=3, _prefix=prefix, watch=PeerWatch(store, prefix, 0))
    me._abort_reason = types.MethodType(Completion._abort_reason, me)
    for r in (1, 2):                                    # both closed, both processes gone
        w = PeerWatch(store, prefix, r)
        publish_as(w, finished_child().pid)
        w.closed()
    store.set(f"{prefix}/close/2", b"1")                # rank 2 reached the barrier before it exited
    assert Completion.check_peers(me, closing=True) is None
    time.sleep(0.025)
    with pytest.raises(PeerError, match="rank 0: rank 1 exited"):
        Completion.check_peers(me, closing=True)
    store.set(f"{prefix}/close/1", b"1")
    me.watch = PeerWatch(store, prefix, 0)
    assert Completion.check_peers(me, closing=True) is None
    time.sleep(0.025)
    assert Completion.check_peers(me, closing=True) is None            # both came: neither is judged


def test_the_cuda_close_barrier_does_not_judge_a_peer_that_came_and_exited():
    """Rank 2 reached the barrier and exited; rank 1, alive, is still on its way: no error while waiting for it."""
    import types

    from slicetrace.backend.cuda.completion import Completion
    store, prefix = DictStore({}), "st/j/cuda1"
    me = types.SimpleNamespace(store=store, rank=0, world=3, _prefix=prefix, watch=PeerWatch(store, prefix, 0))
    me._abort_reason = types.MethodType(Completion._abort_reason, me)
    PeerWatch(store, prefix, 1).publish()              # alive (this process), closed, not yet at the barrier
    PeerWatch(store, prefix, 1).closed()
    gone = PeerWatch(store, prefix, 2)
    publish_as(gone, finished_child().pid)
    gone.closed()
    store.set(f"{prefix}/close/2", b"1")
    for _ in range(3):
        assert Completion.check_peers(me, closing=True) is None
        time.sleep(0.025)
    store.delete(f"{prefix}/close/2")                  # had it not come, its death would end the wait
    Completion.check_peers(me, closing=True)
    time.sleep(0.025)
    with pytest.raises(PeerError, match="rank 0: rank 2 exited"):
        Completion.check_peers(me, closing=True)


def test_a_peer_of_an_unknown_pid_namespace_is_not_judged_by_its_pid(monkeypatch):
    """No /proc (macOS, a chroot): every namespace reads 0 and every pid 'exited'; the cpu set-up's check of a peer
    not yet attached (its 'making' key, procs.proc_gone) called a live one dead and removed its segment's name."""
    monkeypatch.setattr(procs, "pid_ns_id", lambda: 0)
    me = procs.this_proc()                              # this live process, as a peer on such a host says it
    assert me.endswith("/0")

    def no_proc(pid):
        raise FileNotFoundError(f"/proc/{pid}/stat")
    monkeypatch.setattr(procs, "_stat", no_proc)
    assert procs.proc_gone(me) is None
    monkeypatch.setattr(procs, "pid_ns_id", lambda: 4026531836)     # a known namespace: judged as before
    assert procs.proc_gone(procs.this_proc()) == "exited"


def test_the_cuda_peer_watch_does_not_judge_a_peer_of_an_unknown_pid_namespace(monkeypatch):
    """No /proc: both ranks' namespaces read 0, the same; PeerWatch judged the live peer by its pid anyway and
    proc_dead called it 'exited', failing the waiting rank's op. Only its closed key counts there."""
    monkeypatch.setattr(procs, "pid_ns_id", lambda: 0)

    def no_proc(pid):
        raise FileNotFoundError(f"/proc/{pid}/stat")
    monkeypatch.setattr(procs, "_stat", no_proc)
    me, peer = watch_pair()
    peer.publish()                                     # this live process, as such a host says it
    assert [check(me, (1,)) for _ in range(3)] == [None, None, None]
    peer.closed()
    assert [check(me, (1,)) for _ in range(2)] == [None, "rank 1 closed its communicator"]
