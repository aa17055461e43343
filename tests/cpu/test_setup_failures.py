"""cpu backend set-up that fails part way on one rank: the error each other rank gets names that rank, and
nothing is left in /dev/shm. Orders are forced through the store (no sleeps): each rank's hook waits for a key."""
from __future__ import annotations

import os
import re

import pytest

from tests.cpu.test_setup_deaths import DIED_AT_SET_UP, SET_UP_S, _timed_setup, set_up_in_fresh_pool
from tests.helpers.procs import RankError

FAIL = "injected: rank 1's set-up fails at the attached barrier"


def _done(ctx, key: str, rank) -> str:
    return f"test/{ctx['job']}{key}/done/{rank}"


def _set_up_with(ctx, key: str, kw: dict, hooks: dict):
    """This rank's set-up with its store's get/barrier replaced by `hooks`; then says it ended (the others' hooks
    wait for that) and puts the store back."""
    store = ctx["store"]
    saved = store.get, store.barrier
    for name, fn in hooks.items():
        setattr(store, name, fn)
    try:
        return _timed_setup(ctx, key, kw)[:2]
    finally:
        store.set(_done(ctx, key, ctx["rank"]), b"1")
        store.get, store.barrier = saved


def fails_while_third_attaches(ctx, key: str, kw: dict):
    """Rank 1 fails at the 'attached' barrier (it has read every name) once rank 0 attached every segment; rank 2,
    which published its own, opens rank 0's segment only once rank 1's set-up has ended; rank 0 enters the
    barrier only once rank 2's has."""
    store, r = ctx["store"], ctx["rank"]
    get, barrier = store.get, store.barrier

    def failing(name, *a, **k):
        if name.endswith("/attached"):
            get(_done(ctx, key, "0 attached"), SET_UP_S, what="rank 0 to attach every segment")
            raise RuntimeError(FAIL)
        return barrier(name, *a, **k)

    def late(k_, *a, **kw_):
        if k_.endswith("/seg/0"):
            get(_done(ctx, key, 1), SET_UP_S, what="rank 1's set-up to end")
        return get(k_, *a, **kw_)

    def held(name, *a, **k):
        if name.endswith("/attached"):
            store.set(_done(ctx, key, "0 attached"), b"1")
            get(_done(ctx, key, 2), SET_UP_S, what="rank 2's set-up to end")
        return barrier(name, *a, **k)
    return _set_up_with(ctx, key, kw, [{"barrier": held}, {"barrier": failing}, {"get": late}][r])


def test_a_set_up_failed_at_the_barrier_is_what_every_rank_hears():
    """Rank 1's close after its failed set-up unlinked every name it had read, live rank 0's too: rank 2, still
    attaching, was told "rank 0's segment ... is gone: rank 0 closed or was cleaned up", and rank 0 that rank 1
    "closed its communicator". Each now hears that rank 1's set-up failed, and why."""
    res, left = set_up_in_fresh_pool(3, fails_while_third_attaches, "late")
    assert res[1] == ("RuntimeError", FAIL), res[1]
    kind, msg = res[2]
    assert kind == "PeerError" and re.fullmatch(rf"rank 1's segment 'st_\w+' is gone: rank 1's set-up failed: "
                                                rf"RuntimeError: {FAIL}", msg), res[2]
    assert res[0] == ("PeerError", f"rank 1 failed to set up its cpu backend: RuntimeError: {FAIL}; detected by "
                                   f"rank 0"), res[0]
    assert left == []


def killed_before_publishing(ctx, key: str, kw: dict, where: str):
    """Rank 2 is killed once its segment exists in /dev/shm but before its name reached the store: in the store's
    claim of its 'seg' key, or while its pages are reserved (the segment is created, not yet sized)."""
    if ctx["rank"] == 2:
        if where == "claim":
            ctx["store"].claim = lambda *a: os._exit(9)
        else:
            os.posix_fallocate = lambda *a: os._exit(9)
    return _timed_setup(ctx, key, kw)[:2]


@pytest.mark.parametrize("where", ["claim", "reserve"])
def test_a_rank_killed_before_it_published_its_segment_leaves_no_name(where):
    """Its name was in no one's hands: it stayed in /dev/shm for good (outside launch()), and the others waited
    timeout_s for the name and blamed a timeout. A rank says the name and its process before it creates the
    segment: the others find it dead at once, and remove the name."""
    res, left = set_up_in_fresh_pool(3, killed_before_publishing, "pub", where)
    assert isinstance(res[2], RankError) and res[2].name == "EOFError", res[2]
    for r in (0, 1):
        kind, msg = res[r]      # a PeerError naming rank 2's death, directly or relayed, not CommTimeoutError
        assert kind == "PeerError", res[r]
        assert re.search(r"rank 2 \(pid \d+\) (exited|died \(zombie\)) during its cpu backend set-up; "
                         r"detected by rank [01]", msg), res[r]
    assert left == []


def dies_while_third_attaches(ctx, key: str, kw: dict):
    """Rank 1 exits at the 'attached' barrier; rank 2 opens rank 1's segment only once rank 0's set-up has ended
    (it found rank 1 dead at the barrier and removed its name), as a rank descheduled on a loaded machine may."""
    store, r = ctx["store"], ctx["rank"]
    get, barrier = store.get, store.barrier

    def dying(name, *a, **k):
        if name.endswith("/attached"):
            os._exit(9)
        return barrier(name, *a, **k)

    def late(k_, *a, **kw_):
        if k_.endswith("/seg/1"):
            get(_done(ctx, key, 0), SET_UP_S, what="rank 0's set-up to end")
        return get(k_, *a, **kw_)
    return _set_up_with(ctx, key, kw, [{}, {"barrier": dying}, {"get": late}][r])


def test_a_rank_that_finds_a_dead_ranks_segment_gone_names_the_death():
    """A survivor still attaching when the other found the dead rank (and removed its name) hears of that death
    from the segment's absence: test_a_rank_that_dies_during_set_up_is_a_peer_error_at_once took only the barrier's
    wording, and failed when a loaded machine delayed a survivor's attach."""
    res, left = set_up_in_fresh_pool(3, dies_while_third_attaches, "gone")
    assert isinstance(res[1], RankError) and res[1].name == "EOFError", res[1]
    assert res[0][0] == "PeerError" and re.fullmatch(r"rank 1 \(pid \d+\) (exited|died \(zombie\)); detected by "
                                                     r"rank 0", res[0][1]), res[0]
    kind, msg = res[2]
    assert kind == "PeerError" and re.fullmatch(r"rank 1's segment 'st_\w+' is gone: rank 1 \(pid \d+\) "
                                                r"(exited|died \(zombie\))", msg), res[2]
    for kind, msg in (res[0], res[2]):      # each as the set-up death test takes it
        assert DIED_AT_SET_UP.fullmatch(msg), msg
    assert left == []
