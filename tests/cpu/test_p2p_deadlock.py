"""Point-to-point programs that can never finish because of their sends and receives alone (the ranks receive
from each other, send more than a FIFO holds to each other, a ring of either, a lane a group has finished, a send
held behind 16 unreceived headers, empty messages) raise MismatchError on every rank with the cycle of waits
(backend/cpu/stall.py), never the CommTimeoutError they ended in after timeout_s. Each case makes its own
communicator over the ranks it needs, in one pool of 3 rank processes."""
from __future__ import annotations

import numpy as np
import pytest

from slicetrace.session import comm_hash
from tests.helpers.procs import RankPool

KW = dict(backend="cpu", buffsize=32 << 10, nchannels=1, timeout_s=60.0)     # a miss ends at the timeout: an error
BIG = 20000                 # float32 elements: 80000 B, more than the 32 KiB FIFO holds
TAIL = (": the ranks' sends and receives do not match (each waits on a rank whose current operation has no "
        "matching send or receive, so none of them can end)")


def _ops(comm, case: str) -> None:
    r = comm.rank
    f32 = np.zeros(1024, np.float32)
    if case == "recv_recv":
        comm.recv(f32, 1 - r)
    elif case == "send_send":
        comm.send(np.ones(BIG, np.float32), 1 - r)
    elif case == "ring_recv":
        comm.recv(f32, (r + 1) % 3)
    elif case == "ring_mixed":                  # a receive, then sends too large for the FIFO
        if r == 0:
            comm.recv(f32, 1)
        else:
            comm.send(np.ones(BIG, np.float32), (r + 1) % 3)
    elif case == "finished_lane":               # the group's exchange ends; each then waits on a lane the other ended
        with comm.group():
            comm.send(np.ones(100, np.float32), 1 - r)
            comm.recv(np.zeros(100, np.float32), 1 - r)
            comm.recv(np.zeros(100, np.float32), 1 - r)
    elif case == "held":                        # 20 empty sends: the 17th waits for the receiver to check headers
        if r == 0:
            with comm.group():
                for _ in range(20):
                    comm.send(np.zeros(0, np.int64), 1)
        else:
            comm.send(np.ones(BIG, np.float32), 0)
    elif case == "empty":
        comm.recv(np.zeros(0, np.float32), 1 - r)
    elif case == "bystander":                   # rank 2 waits on rank 0, outside the cycle
        comm.recv(f32, 1 - r if r < 2 else 0)
    else:
        raise AssertionError(case)


def _run_case(ctx, case: str, world: int):
    import slicetrace
    comm = slicetrace.init(rank=ctx["rank"], world_size=world, store=ctx["store"], job=f"{ctx['job']}{case}", **KW)
    try:
        _ops(comm, case)
        return "finished"
    except slicetrace.SliceTraceError as e:
        return type(e).__name__, str(e)
    finally:
        comm.close()


R4K = "1024 x float32 (4096 B)"
SBIG = f"{BIG} x float32 ({BIG * 4} B)"
CASES = {       # case: (world, the cycle as every rank words it)
    "recv_recv": (2, f"rank 0 waits to receive {R4K} from rank 1 while rank 1 waits to receive {R4K} from rank 0"),
    "send_send": (2, f"rank 0 waits to send {SBIG} to rank 1 while rank 1 waits to send {SBIG} to rank 0"),
    "ring_recv": (3, f"rank 0 waits to receive {R4K} from rank 1, rank 1 waits to receive {R4K} from rank 2 and "
                     f"rank 2 waits to receive {R4K} from rank 0"),
    "ring_mixed": (3, f"rank 0 waits to receive {R4K} from rank 1, rank 1 waits to send {SBIG} to rank 2 and rank 2 "
                      f"waits to send {SBIG} to rank 0"),
    "finished_lane": (2, "rank 0 waits to receive 100 x float32 (400 B) from rank 1 while rank 1 waits to receive "
                         "100 x float32 (400 B) from rank 0"),
    "held": (2, "rank 0 waits to send 0 x int64 (0 B) to rank 1 (behind 16 messages rank 1 has not received) while "
                f"rank 1 waits to send {SBIG} to rank 0"),
    "empty": (2, "rank 0 waits to receive 0 x float32 (0 B) from rank 1 while rank 1 waits to receive 0 x float32 "
                 "(0 B) from rank 0"),
    "bystander": (3, f"rank 0 waits to receive {R4K} from rank 1 while rank 1 waits to receive {R4K} from rank 0"),
}


@pytest.fixture(scope="module")
def pool():
    p = RankPool(3, timeout=150)
    yield p
    p.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_point_to_point_deadlock_is_a_mismatch_on_every_rank(pool, case):
    world, cycle = CASES[case]
    res = pool.run(_run_case, case, world, ranks=range(world))
    want = "point-to-point deadlock: " + cycle + TAIL
    job = f"{pool.job}{case}"
    tag = f" [comm_hash={comm_hash(job)}, name='slicetrace-{job}']"     # which communicator (errors end with it)
    in_cycle = (0, 1) if case == "bystander" else tuple(range(world))
    for r, got in enumerate(res):
        assert got[0] == "MismatchError", (r, got)
        # the rank that found it says so plainly, the others relay its abort (a rank outside the cycle only relays)
        assert got[1] in [want + tag] + [f"{want} (abort posted by rank {p}){tag}" for p in in_cycle if p != r], \
            (r, got[1])
    assert any(got[1] == want + tag for got in res), res
