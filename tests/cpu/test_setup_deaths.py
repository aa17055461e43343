"""cpu backend set-up on a rank that dies or cannot make its segment: every other rank gets a PeerError naming it
before timeout_s, and nothing is left in /dev/shm."""
from __future__ import annotations

import errno
import glob
import os
import re
import time

import pytest

from tests.cpu.test_backend import SMALL, backend
from tests.cpu.test_backend_faults import shm_left, warm_pool
from tests.helpers.procs import RankError

# timeout_s of these set-ups: no passing run waits it out (each error comes at once), so it is long enough that a rank
# descheduled on a loaded 2-core machine is not taken for a timeout; a regression still fails, as CommTimeoutError
SET_UP_S = 30.0
POOL_S = 2 * SET_UP_S       # the harness's bound on each rank's answer: past SET_UP_S, so a timeout is what fails


def set_up_in_fresh_pool(world: int, fn, key: str, *args) -> tuple[list, list]:
    """fn's results (or RankErrors) on each rank of a fresh pool, with SMALL settings at SET_UP_S, and the job's
    segment names left in /dev/shm once every rank ended (before the pool closes). The pool is past its imports
    (warm_pool) first: on a loaded machine they take seconds, which timeout_s would otherwise bound."""
    pool = warm_pool(world, POOL_S)
    try:
        res = pool.results_or_errors(fn, key, dict(SMALL, timeout_s=SET_UP_S), *args)
        return res, glob.glob(f"/dev/shm/st_{pool.job}{key}_*")
    finally:
        pool.close()


def _timed_setup(ctx, key: str, kw: dict) -> tuple:
    """(error type or "ok", message, seconds the set-up took, what is left in /dev/shm)."""
    t = time.monotonic()
    try:
        backend(ctx, key, **kw)
        res = ("ok", "")
    except Exception as e:  # noqa: BLE001 - reported to the test
        res = (type(e).__name__, str(e))
    return res + (time.monotonic() - t, shm_left(ctx, key))


def dies_at_set_up(ctx, key: str, kw: dict, victims: tuple):
    """The victims exit once they attached every peer (at the 'attached' barrier); the others report their error,
    how long set-up took and what is left in /dev/shm (outside launch(), nothing else removes it)."""
    if ctx["rank"] in victims:
        store = ctx["store"]
        barrier = store.barrier

        def dying(name, *a, **k):
            if name.endswith("/attached"):
                os._exit(9)
            return barrier(name, *a, **k)
        store.barrier = dying
    return _timed_setup(ctx, key, kw)


# how a survivor hears of a rank that died at the 'attached' barrier: its liveness check there, or another survivor's
# abort; or, still attaching, the segment of the dead rank gone (another survivor found it dead and removed its name)
DIED_AT_SET_UP = re.compile(r"(rank [12] \(pid \d+\) (exited|died \(zombie\)); detected by rank [02]"
                            r"( \(abort posted by rank [02]\))?)|rank ([12])'s segment 'st_\w+' is gone: rank \4 "
                            r"\(pid \d+\) (exited|died \(zombie\))")


@pytest.mark.parametrize("victims", [(1,), (1, 2)], ids=["one", "two"])
def test_a_rank_that_dies_during_set_up_is_a_peer_error_at_once(victims):
    """The barrier after attaching waited the whole timeout_s (CommTimeoutError) for a rank whose pid it knew, and
    left the dead ranks' segments in /dev/shm."""
    res, left = set_up_in_fresh_pool(3, dies_at_set_up, "sdie", victims)
    died = [r for r in victims if isinstance(res[r], RankError) and res[r].name == "EOFError"]
    assert died, res            # the first victim at the barrier exits there
    for r in set(victims) - set(died):      # a victim still attaching when the survivor found the other dead at the
        kind, msg, _, _ = res[r]            # barrier (and removed its name) finds that segment gone (seen under load)
        assert kind == "PeerError" and re.fullmatch(rf"rank ({'|'.join(map(str, died))})'s segment 'st_\w+' is "
                                                    rf"gone: rank \1 \(pid \d+\) (exited|died \(zombie\))", msg), res[r]
    survivors = [res[r] for r in set(range(3)) - set(victims)]
    for kind, msg, _, _ in survivors:   # PeerError naming the dead rank, not CommTimeoutError: before timeout_s
        assert kind == "PeerError" and DIED_AT_SET_UP.fullmatch(msg), (kind, msg)
    # the first to find the death found it at the barrier (a survivor still attaching may find its segment gone)
    assert any(DIED_AT_SET_UP.fullmatch(msg).group(1) for _, msg, _, _ in survivors), survivors
    assert left == []


def shm_full_at_set_up(ctx, key: str, kw: dict, victim: int):
    """The victim's /dev/shm is full (its segment cannot be reserved); the others report what they got, and how
    long it took."""
    if ctx["rank"] == victim:
        def full(fd, off, n):
            raise OSError(errno.ENOSPC, "No space left on device")
        os.posix_fallocate = full
    return _timed_setup(ctx, key, kw)


def test_a_rank_that_cannot_make_its_segment_fails_the_others_set_up_at_once():
    """A rank whose segment could not be made never published a failure: the others waited timeout_s for its
    segment's name and then blamed a timeout."""
    res, left = set_up_in_fresh_pool(3, shm_full_at_set_up, "sfull", 2)
    assert res[2][0] == "BackendError" and "could not reserve" in res[2][1], res[2]
    for r in (0, 1):
        kind, msg, _, _ = res[r]      # PeerError with rank 2's own reason, not CommTimeoutError: before timeout_s
        assert kind == "PeerError", res[r]
        # directly, or relayed by the other survivor whose segment it then found gone
        assert "rank 2 failed to set up its cpu backend: BackendError: could not reserve" in msg, msg
        assert f"rank 2 failed to set up its cpu backend: BackendError: {res[2][1]}; detected by rank " in msg, msg
        assert re.search(r"; detected by rank [01]$", msg), msg
    assert left == []


def dies_after_attached(ctx, key: str, kw: dict):
    """Rank 1 exits as its 'attached' barrier returns, before it unlinks its own name; rank 0 lists what is left
    in /dev/shm once its set-up returned, before any op or close (a program that exits on an error does neither)."""
    if ctx["rank"] == 1:
        store = ctx["store"]
        barrier = store.barrier

        def dying(name, *a, **k):
            barrier(name, *a, **k)
            if name.endswith("/attached"):
                os._exit(9)
        store.barrier = dying
    backend(ctx, key, **kw)
    return shm_left(ctx, key)


def test_a_rank_gone_between_the_attached_barrier_and_its_unlink_leaves_no_name():
    """Past the barrier every rank has attached every segment, yet each unlinked its own name only: a rank killed
    (or stopped, then killed) between the barrier and its unlink left its segment in /dev/shm for good unless a peer
    closed its communicator or waited on it until it was found dead."""
    pool = warm_pool(2, POOL_S)
    try:
        res = pool.results_or_errors(dies_after_attached, "gone", dict(SMALL, timeout_s=SET_UP_S))
    finally:
        pool.close()
        for name in glob.glob(f"/dev/shm/st_{pool.job}gone_*"):     # before the fix rank 1's stayed
            os.unlink(name)
    assert isinstance(res[1], RankError) and res[1].name == "EOFError", res[1]
    assert res[0] == [], res[0]
