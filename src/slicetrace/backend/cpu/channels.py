"""A rank's channel programs run together: channel 0 in the caller's thread, the others in the backend's channel
threads (ring programs, worker.py, and symmetric ones, symmetric.py, alike)."""
from __future__ import annotations

from ...errors import MismatchError, PeerError
from .shm import ABORT_PEER


def run_channels(pool, g, rank: int, progs, run) -> None:
    """run(prog) for each program (ring or symmetric), progs[1:] in `pool`'s threads: a failure other than a
    peer's or a mismatch aborts the peers; the abort's error is raised where a wait heard it."""
    spins, g.spins = g.spins, 20         # threads share the GIL: spinning would starve the others

    def one(prog):
        try:
            run(prog)
        except BaseException as e:
            if not isinstance(e, (PeerError, MismatchError)):
                g.abort_all(ABORT_PEER, f"rank {rank} channel {prog.channel} failed: {type(e).__name__}: {e}")
            raise
    futs = [pool.submit(one, p) for p in progs[1:]]
    err = None
    try:
        one(progs[0])
    except BaseException as e:
        err = e
    for f in futs:
        try:
            f.result()
        except BaseException as e:
            err = err or e
    g.spins = spins
    if err is not None:
        if isinstance(err, (PeerError, MismatchError)) and g.aborted():
            raise g.abort_error() from err
        raise err
