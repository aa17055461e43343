"""Dead, missing and disagreeing ranks become clear errors on every rank, each naming how it was found, with
nothing left behind."""
from __future__ import annotations

import glob
import os
import re
import signal
import threading

import numpy as np
import pytest

import slicetrace
from slicetrace.errors import PeerError
from tests.helpers.procs import RankPool

TIMEOUT = 6.0
JOIN = 120          # every launch() is bounded: a hang fails the test instead of stalling the suite


def _job_shm(job):
    """The shared-memory segments of one launch() job (st_<job id>_...): other test runs on the machine create and
    remove st_* segments of their own meanwhile, so only this job's are looked at."""
    return glob.glob(f"/dev/shm/st_{job}*")


def _die_mid_op(comm, folder):
    with open(os.path.join(folder, f"job{comm.rank}"), "w") as f:      # the job id, to find its segments after
        f.write(comm._session.job)
    x = np.ones(8 << 20, dtype=np.float32)
    if comm.rank == 1:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    for _ in range(1000):
        comm.all_reduce(x, x)
    return "finished"


# how a survivor learns that rank 1 is gone: its liveness check of rank 1's process (or another survivor's abort
# that carries that finding), never its own timeout (that would be a CommTimeoutError)
# ... and the op it was found in, as a timeout names it, with the wait (a survivor's error must say where it stopped)
PEER_GONE = re.compile(r"slicetrace\.errors\.PeerError: rank 1 \(pid \d+\) (exited|exited \(pid reused\)|"
                       r"died \(zombie\)); detected by rank [02] in AllReduce #\d+ \(collective #\d+ of this "
                       r"communicator\), waiting for (data|credit) from rank [012] on channel 0 \(step \d+\)"
                       r"( \(abort posted by rank [02]\))? "
                       r"\[comm_hash=\d+, name='slicetrace-\w+'\]")     # which communicator: launch()'s


def test_killed_rank_fails_every_other_rank_with_the_peer_death(tmp_path):
    with pytest.raises(slicetrace.LaunchError) as e:
        slicetrace.launch(_die_mid_op, 3, str(tmp_path), timeout_s=TIMEOUT, join_timeout_s=JOIN)
    errs = e.value.errors
    assert str(e.value).startswith("rank 1 died with exit code -9 (SIGKILL"), str(e.value)
    assert sorted(errs) == [0, 1, 2] and errs[1] == ("rank 1 died with exit code -9 (SIGKILL: the kernel's "
                                                      "out-of-memory killer, if nobody else sent it; see dmesg)"), errs
    for r in (0, 2):                 # the survivors' own errors: they noticed the death, they did not finish
        last = errs[r].strip().splitlines()[-1]
        assert PEER_GONE.fullmatch(last), (r, last)
    jobs = {(tmp_path / f"job{r}").read_text() for r in (0, 2)}      # the survivors wrote theirs before any op
    assert len(jobs) == 1, jobs
    assert _job_shm(jobs.pop()) == []                                  # nothing of the job left behind


def _arrive_except_2(ctx):
    if ctx["rank"] == 2:
        return "stayed away"
    # both arrivals start their 3 s waits together: one more than 3 s late (a loaded machine) would make the other's
    # wait run out on it, not on rank 2
    ctx["store"].set(f"here/{ctx['job']}/{ctx['rank']}", b"1")
    ctx["store"].get(f"here/{ctx['job']}/{1 - ctx['rank']}", 60.0)
    try:
        slicetrace.init(rank=ctx["rank"], world_size=3, store=ctx["store"], job=ctx["job"] + "x",
                        timeout_s=3.0)
    except slicetrace.SliceTraceError as e:
        return (type(e).__name__, str(e))
    return "no error"


def test_rank_that_never_arrives_is_a_rendezvous_timeout_naming_it():
    pool = RankPool(3, timeout=60)
    try:
        res = pool.run(_arrive_except_2)
        job = pool.job
    finally:
        pool.close()
    assert res[2] == "stayed away"
    # the wait that ran out is the one for rank 2's segment, at the timeout the ranks were given
    timeout = f"rendezvous: \"rank 2's cpu backend segment (job '{job}x')\" did not arrive within timeout_s=3.0"
    # the first rank whose wait ran out says so; the other either ran out too, or (a moment before its own wait
    # ran out) found the first one's failure in the store, and passes on the same timeout naming rank 2
    assert ("CommTimeoutError", timeout) in res[:2], res
    for r, (name, msg) in enumerate(res[:2]):
        assert (name, msg) in (("CommTimeoutError", timeout), ("PeerError", f"rank {1 - r} failed to set up its "
                               f"cpu backend: CommTimeoutError: {timeout}; detected by rank {r}")), (r, name, msg)


def _mismatch(comm, what):
    if what == "count":
        x = np.ones(1000 + 500 * comm.rank, dtype=np.float32)
    elif what == "dtype":
        x = np.ones(1000, dtype=np.float32 if comm.rank == 0 else np.int32)
    elif what == "op":
        x = np.ones(1000, dtype=np.float32)
        if comm.rank == 0:
            comm.broadcast(x, root=0)
            return "done"
    else:
        x = np.ones(1000, dtype=np.float32)
        comm.reduce(x, root=comm.rank)           # roots differ
        return "done"
    comm.all_reduce(x)
    return "done"


MISMATCH_SIDES = {     # what _mismatch runs on rank 0 and on rank 1, as the error describes them
    "count": ("all_reduce(count=1000, dtype=float32, op=sum)", "all_reduce(count=1500, dtype=float32, op=sum)"),
    "dtype": ("all_reduce(count=1000, dtype=float32, op=sum)", "all_reduce(count=1000, dtype=int32, op=sum)"),
    "op": ("broadcast(count=1000, dtype=float32, root=0)", "all_reduce(count=1000, dtype=float32, op=sum)"),
    "root": ("reduce(count=1000, dtype=float32, op=sum, root=0)", "reduce(count=1000, dtype=float32, op=sum, root=1)"),
}


@pytest.mark.parametrize("what", ["count", "dtype", "op", "root"])
def test_mismatched_operations_are_detected_and_reported(what):
    with pytest.raises(PeerError, match="Mismatch") as e:
        slicetrace.launch(_mismatch, 2, what, timeout_s=TIMEOUT, join_timeout_s=JOIN)
    assert sorted(e.value.errors) == [0, 1], e.value.errors
    sides = [f"rank {r} runs {text} [nchannels=1, step_bytes=524288]" for r, text in enumerate(MISMATCH_SIDES[what])]
    for r, err in e.value.errors.items():       # each rank: a MismatchError naming both sides, the differing field
        head = err.split("\n", 1)[0]
        assert head.startswith("MismatchError: collective #1 differs across ranks: rank "), err
        assert all(side in head for side in sides), (r, head, sides)


def _mismatch_later(comm, what):
    x = np.ones(1000, dtype=np.float32)
    comm.all_reduce(x, op="max")
    if what == "dtype":                         # the same plan as the first op's: only the dtype differs
        comm.all_reduce(x.view(np.int32) if comm.rank else x, op="max")
    else:
        comm.all_reduce(x, op="min" if comm.rank else "max")
    return "done"


@pytest.mark.parametrize("what,theirs", [("dtype", "dtype=int32, op=max)"), ("redop", "dtype=float32, op=min)")])
def test_a_collective_differing_after_a_matching_one_is_detected(what, theirs):
    """Each op's own dtype and redop are compared, not those of an earlier op with the same plan."""
    with pytest.raises(PeerError, match="Mismatch") as e:
        slicetrace.launch(_mismatch_later, 2, what, timeout_s=TIMEOUT, join_timeout_s=JOIN)
    assert sorted(e.value.errors) == [0, 1], e.value.errors
    for err in e.value.errors.values():
        head = err.split("\n", 1)[0]
        assert head.startswith("MismatchError: collective #2 differs across ranks: "), err
        assert "dtype=float32, op=max)" in head and theirs in head, head


def _p2p_where_peer_runs_collective(comm, sender):
    x = np.ones(1000 if sender == 1 else 2 << 20, dtype=np.float32)     # rank 0's send: larger than its FIFO
    if comm.rank == 1:
        comm.all_reduce(x)
    elif sender == 0:
        comm.send(x, peer=1)
    else:
        comm.recv(x, peer=1)
    return "done"


@pytest.mark.parametrize("sender,mine", [(0, "a send of 2097152 x float32 to rank 1"),
                                         (1, "a receive of 1000 x float32 from rank 1")])
def test_point_to_point_where_a_peer_runs_a_collective_is_a_mismatch(sender, mine):
    """Rank 0 sends to (or receives from) rank 1, which calls all_reduce: each waits for the other. It was a
    CommTimeoutError after timeout_s; the collective's signature names rank 1's side, the stalled lane rank 0's."""
    with pytest.raises(PeerError, match="Mismatch") as e:
        slicetrace.launch(_p2p_where_peer_runs_collective, 2, sender, timeout_s=TIMEOUT, join_timeout_s=JOIN)
    assert sorted(e.value.errors) == [0, 1], e.value.errors
    theirs = f"all_reduce(count={1000 if sender else 2 << 20}, dtype=float32, op=sum) [nchannels=1, step_bytes=524288]"
    for err in e.value.errors.values():
        head = err.split("\n", 1)[0]
        assert head.startswith(f"MismatchError: collective #1 differs across ranks: rank 1 runs {theirs}, rank 0 "
                               f"runs {mine} first (point-to-point"), head


def _bad_input(comm):
    errors = []
    for call in (lambda: comm.all_reduce(np.ones(4), op="mean"),
                 lambda: comm.broadcast(np.ones(4), root=7),
                 lambda: comm.all_reduce([1, 2, 3]),
                 lambda: comm.all_reduce(np.ones(4, dtype=np.complex64)),
                 lambda: comm.all_reduce(np.ones(4, dtype=np.float32), np.ones(5, dtype=np.float32)),
                 lambda: comm.reduce_scatter(np.ones(5, dtype=np.float32)),
                 lambda: comm.send(np.ones(4), peer=-1),
                 lambda: comm.all_reduce(_read_only(4), _read_only(4)),
                 lambda: comm.recv(_read_only(4), peer=1 - comm.rank),
                 lambda: comm.all_reduce(np.ones(4, dtype=">f4"))):
        try:
            call()
            errors.append(None)
        except slicetrace.UsageError as e:
            errors.append(str(e))
    out = comm.all_reduce(np.ones(3, dtype=np.int32))        # none of them reached the backend
    return errors + [int(out.sum())]


def _read_only(n):
    a = np.ones(n, dtype=np.float32)
    a.setflags(write=False)
    return a


def test_bad_input_gets_a_clear_error_naming_the_parameter():
    msgs = slicetrace.launch(_bad_input, 2, timeout_s=TIMEOUT, join_timeout_s=JOIN)[0]
    assert None not in msgs, msgs
    keys = ["op='mean'", "root=7", "x must be a numpy.ndarray, a torch CPU tensor or a host array with __dlpack__ for "
            "backend='cpu', got builtins.list", "complex64", "5 elements", "reduce_scatter", "peer=-1", "out is read-only",
            "out is read-only", "'>f4' is not in this machine's byte order"]
    assert len(msgs) == len(keys) + 1 and msgs[-1] == 6
    for key, msg in zip(keys, msgs):
        assert key in msg, (key, msg)


def _inside_an_op(comm, t, what):
    """Wait until thread t holds the communicator's op lock (Communicator._enter) and is in the op's try."""
    import time
    deadline = time.monotonic() + 60
    while not (comm._busy.locked() and comm._active == t.ident):
        assert t.is_alive() and time.monotonic() < deadline, f"{what}: the thread never got inside its op"
        time.sleep(0.001)


def _two_threads(comm):
    import threading
    store, key = comm._session.store, "test/two_threads/refused"
    x = np.ones(1000, dtype=np.float32)
    if comm.rank == 1:
        store.get(key, 60)                         # rank 0's first op waits for us until its second call was made
        comm.all_reduce(x)
        return "peer", float(comm.all_reduce(x)[0])
    first = threading.Thread(target=comm.all_reduce, args=(x,))
    first.start()
    _inside_an_op(comm, first, "rank 0")           # it cannot finish: rank 1 has not joined it yet
    try:
        comm.all_reduce(x)                         # while `first` is inside its op
        err = None
    except slicetrace.UsageError as e:
        err = str(e)
    store.set(key, b"1")                           # now rank 1 may join `first`'s op
    first.join(TIMEOUT)
    alive = first.is_alive()
    return err, alive, float(comm.all_reduce(x)[0])


def test_a_second_thread_inside_an_op_gets_an_error_and_the_comm_goes_on():
    res = slicetrace.launch(_two_threads, 2, timeout_s=TIMEOUT, join_timeout_s=JOIN)
    err, alive, total = res[0]
    assert err is not None and "another thread is inside an operation of this communicator" in err
    assert alive is False and total == 2.0 and res[1] == ("peer", 2.0)



def test_launch_refuses_a_function_the_ranks_cannot_import(tmp_path, monkeypatch):
    """A lambda is refused before anything starts; a function the spawned ranks fail to import (its module is
    gone by the time they start) ends in an error that says so, not in a bare exit code."""
    import importlib
    import sys
    with pytest.raises(slicetrace.UsageError, match="not a lambda or a nested function"):
        slicetrace.launch(lambda comm: 0, 2, join_timeout_s=JOIN)
    (tmp_path / "st_vanishing_mod.py").write_text("def job(comm):\n    return comm.rank\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "st_vanishing_mod", raising=False)     # teardown drops what the import adds
    job = importlib.import_module("st_vanishing_mod").job
    (tmp_path / "st_vanishing_mod.py").unlink()                # the parent still has it; a fresh rank cannot
    with pytest.raises(slicetrace.LaunchError, match="before running fn: could it import fn"):
        slicetrace.launch(job, 2, timeout_s=TIMEOUT, join_timeout_s=JOIN)


def test_a_rank_killed_by_a_signal_before_fn_is_not_told_to_check_its_import(tmp_path, monkeypatch):
    """A rank killed from outside while it still imported (SIGKILL, SIGTERM) read 'could it import fn?', which
    sends the user after a healthy module."""
    import importlib
    import sys
    (tmp_path / "st_killed_mod.py").write_text(
        "import multiprocessing, os, signal\n"
        "if multiprocessing.current_process().name.startswith('slicetrace-rank'):    # a rank, importing fn\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "def job(comm):\n    return comm.rank\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "st_killed_mod", raising=False)
    job = importlib.import_module("st_killed_mod").job
    with pytest.raises(slicetrace.LaunchError) as e:
        slicetrace.launch(job, 2, timeout_s=TIMEOUT, join_timeout_s=JOIN)
    assert "died with exit code -9" in str(e.value) and "before running fn" in str(e.value)
    assert "could it import" not in str(e.value)
