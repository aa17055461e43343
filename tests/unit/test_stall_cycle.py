"""The cpu backend's p2p stall records (backend/cpu/stall.py) and the cycle rule over them, without processes: a
record is read whole or not at all, and a wait is an edge only toward a stalled rank whose stall has no lane of
the other direction toward the waiter."""
from __future__ import annotations

from slicetrace.backend.base import DTYPES
from slicetrace.backend.cpu.shm import C_STALL, PAGE, STALL_EPOCH, STALL_LANES
from slicetrace.backend.cpu.stall import deadlock_text, find_cycle, lane_words, publish, read

F32 = DTYPES.index("float32")


def _ctl():
    return memoryview(bytearray(PAGE)).cast("Q")


def _recv(peer, n=10):
    return (peer, 0, 0, n, F32)


def _send(peer, n=10):
    return (peer, 1, 0, n, F32)


def test_a_record_reads_back_whole_with_a_new_epoch_each_stall():
    ctl = _ctl()
    assert read(ctl) is None                                    # nothing published yet
    publish(ctl, [lane_words(1, False, False, 1024, F32), lane_words(2, True, True, 0, DTYPES.index("int64"))])
    ctl[C_STALL + 1] += 3                                       # three ticks
    assert read(ctl) == (1, 3, ((1, 0, 0, 1024, F32), (2, 1, 1, 0, DTYPES.index("int64"))))
    publish(ctl, [lane_words(0, True, False, 5, F32)])
    assert read(ctl) == (2, 3, ((0, 1, 0, 5, F32),))
    ctl[C_STALL + STALL_EPOCH] = 0                              # a record being written is no record
    assert read(ctl) is None
    publish(ctl, [lane_words(1, False, False, 1, F32)] * (STALL_LANES + 1))
    assert read(ctl) is None                                    # too many lanes to list: never judged


def test_a_cycle_needs_each_provider_without_the_other_direction():
    assert find_cycle(0, {0: (_recv(1),), 1: (_recv(0),)}) == [(0, _recv(1)), (1, _recv(0))]
    # rank 1 still sends to rank 0 in its op: rank 0's receive may end, so no cycle from either side
    live = {0: (_recv(1),), 1: (_send(0), _recv(0))}
    assert find_cycle(0, live) is None and find_cycle(1, live) is None
    # rank 2 waits on the cycle of 0 and 1 without being in it: the cycle is theirs to find
    live = {0: (_send(1),), 1: (_send(0),), 2: (_recv(0),)}
    assert find_cycle(2, live) is None and find_cycle(1, live) == [(1, _send(0)), (0, _send(1))]
    assert find_cycle(0, {1: (_recv(0),)}) is None              # a rank not judged stalled finds nothing
    ring = {0: (_recv(1),), 1: (_send(2),), 2: (_recv(0), _recv(1))}
    assert find_cycle(0, ring) is None                          # rank 2 receives from 1: 1's send may end
    ring[2] = (_send(0),)
    assert find_cycle(2, ring) == [(2, _send(0)), (0, _recv(1)), (1, _send(2))]


def test_the_text_starts_at_the_lowest_rank_whoever_found_it():
    cycle = [(2, _send(0, 20000)), (0, _recv(1, 1024)), (1, _send(2, 20000))]
    assert deadlock_text(cycle) == deadlock_text(cycle[1:] + cycle[:1])
    assert deadlock_text(cycle).startswith(
        "point-to-point deadlock: rank 0 waits to receive 1024 x float32 (4096 B) from rank 1, rank 1 waits to send "
        "20000 x float32 (80000 B) to rank 2 and rank 2 waits to send 20000 x float32 (80000 B) to rank 0: the "
        "ranks' sends and receives do not match")
