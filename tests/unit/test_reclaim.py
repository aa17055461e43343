"""FIFO line reclaim (backend.cpu.transport.Reclaim and Conn.freed) on a header in plain memory."""
from __future__ import annotations

import numpy as np
import pytest

from slicetrace.backend.cpu import transport
from slicetrace.backend.cpu.shm import H_RECLAIM, H_RECLAIMED, PAGE
from slicetrace.backend.cpu.transport import RECLAIM_MIN, Conn
from slicetrace.config import Settings
from slicetrace.errors import ConfigError

STEP = 1 << 17                                   # 8 slots of 128 KiB


def pair(mode: str):
    buf = bytearray(PAGE + 8 * STEP)
    mv = memoryview(buf)
    ctl, fifo = mv[:PAGE].cast("Q"), mv[PAGE:]
    return Conn(ctl, fifo, 1, True, mode), Conn(ctl, fifo, 0, False, mode), buf


def test_fixed_modes_set_the_word_once_and_never_change_it():
    for mode, word in (("on", 1), ("off", 0)):
        snd, rcv, _ = pair(mode)
        assert snd.ctl[H_RECLAIM] == word and rcv.reclaim is None
        for i in range(40):
            rcv.freed(i & 7, STEP)
            snd.reclaim.wrote(i & 7, STEP, 10_000 * (1 + word * 50))   # would flip an auto policy
        assert snd.ctl[H_RECLAIM] == word


def test_freed_stores_once_per_line_of_the_slot_only_when_asked():
    snd, rcv, buf = pair("on")
    fifo = np.frombuffer(buf, np.uint8, offset=PAGE)
    fifo[:] = 0xAB
    rcv.freed(3, 1000)                                 # a partial slot: lines 0..15 of slot 3
    touched = np.flatnonzero(fifo != 0xAB)
    assert touched.tolist() == list(range(3 * STEP, 3 * STEP + 1000, 64))
    assert rcv.ctl[H_RECLAIMED + 3] >= 2               # 2 + the ns it took
    snd.ctl[H_RECLAIM] = 0
    fifo[:] = 0xAB
    rcv.freed(4, STEP)
    assert (fifo == 0xAB).all() and rcv.ctl[H_RECLAIMED + 4] == 1


def test_freed_follows_each_slots_size_as_it_changes():
    _, rcv, buf = pair("on")
    fifo = np.frombuffer(buf, np.uint8, offset=PAGE)
    for slot, nbytes in ((3, 1000), (3, 200), (5, 64), (3, 3000), (3, 3000), (5, 65)):
        fifo[:] = 0xAB
        rcv.freed(slot, nbytes)
        touched = np.flatnonzero(fifo != 0xAB)
        assert touched.tolist() == list(range(slot * STEP, slot * STEP + nbytes, 64)), (slot, nbytes)


def drive(snd, rcv, write_ns, reclaim_ns, n, slot0=0):
    """n FIFO steps: the sender writes (cost depends on how the receiver freed the slot last lap), then the
    receiver reads and frees it, reclaiming when the mode word says so."""
    for i in range(slot0, slot0 + n):
        slot = i & 7
        was = snd.ctl[H_RECLAIMED + slot]
        snd.reclaim.wrote(slot, STEP, write_ns[was > 1] if was else 1)
        if snd.ctl[H_RECLAIM]:
            snd.ctl[H_RECLAIMED + slot] = 2 + reclaim_ns
        else:
            snd.ctl[H_RECLAIMED + slot] = 1


@pytest.mark.parametrize("slow", [False, True])
def test_auto_picks_the_cheaper_mode_and_probes_the_other(monkeypatch, slow):
    now = [0]
    monkeypatch.setattr(transport.time, "monotonic_ns", lambda: now[0])
    snd, rcv, _ = pair("auto")
    # per slot: fast host, writes 13 us either way and reclaim costs 6; slow host, 200 us unless reclaimed
    write_ns = (200_000, 26_000) if slow else (13_000, 13_000)
    drive(snd, rcv, write_ns, 6_000, 64)
    want = 1 if slow else 0
    assert snd.reclaim.best == want
    now[0] += 10_000                                   # within the probe period: the choice holds
    drive(snd, rcv, write_ns, 6_000, 64, 64)
    modes = []
    now[0] += transport.PROBE_NS                       # the next write opens a probe of the other mode
    for i in range(128, 148):
        drive(snd, rcv, write_ns, 6_000, 1, i)
        modes.append(snd.ctl[H_RECLAIM])
    assert modes.count(1 - want) == 8 and modes[-1] == want


def test_unknown_slots_are_not_counted():
    snd, _, _ = pair("auto")
    for i in range(8):                                 # nothing freed yet: word 0 = no information
        snd.reclaim.wrote(i, STEP, 1_000_000)
    assert snd.reclaim.cost == ([], [])
    assert RECLAIM_MIN <= STEP


def test_setting_is_checked():
    with pytest.raises(ConfigError, match="cpu_reclaim='sometimes'"):
        Settings(cpu_reclaim="sometimes")
    assert Settings.from_env({"SLICETRACE_CPU_RECLAIM": "on"}).cpu_reclaim == "on"


def test_auto_follows_the_host_turning_slow_without_waiting_for_a_probe(monkeypatch):
    monkeypatch.setattr(transport.time, "monotonic_ns", lambda: 0)   # time stands still: no timed probe
    snd, rcv, _ = pair("auto")
    drive(snd, rcv, (13_000, 13_000), 6_000, 64)
    assert snd.reclaim.best == 0
    drive(snd, rcv, (200_000, 26_000), 6_000, 200, 64)               # writes without reclaim turn slow
    assert snd.reclaim.best == 1 and snd.ctl[H_RECLAIM] == 1


def _looped_ring(count: int, ops: int):
    """`ops` float32 all_reduces of `count` through rank 0's ring program of 2 ranks, its FIFO looped back to
    itself (no peer): the sender's Reclaim after them."""
    from slicetrace.backend.base import Work
    from slicetrace.backend.cpu import worker
    from slicetrace.backend.cpu.transport import Guard
    from slicetrace.plan.schedule import plan_collective
    s = Settings(cpu_reclaim="auto")
    ctl, fifo = memoryview(bytearray(PAGE)).cast("Q"), memoryview(bytearray(s.buffsize))
    rconn, sconn = Conn(ctl, fifo, 0, False, "auto"), Conn(ctl, fifo, 0, True, "auto")
    rconn.base = sconn.base = 0
    guard = Guard(0, memoryview(bytearray(PAGE)).cast("Q"), memoryview(bytearray(256)), 5.0)
    plan = plan_collective("all_reduce", 2, 0, count, 4, 0, 1, s.step_bytes)
    x = np.arange(count, dtype=np.float32)
    for tag in range(1, ops + 1):
        out = np.empty_like(x)
        work = Work(tag=tag, plan=plan, dtype="float32", redop="sum", sendbuf=x, recvbuf=out)
        worker.run_ring(plan.programs[0], worker.RingJob(work, rconn, sconn, None, guard, None))
        h = count // 2                                  # its own halves meet as the two ranks' would
        np.testing.assert_array_equal(out, np.tile(x[:h] + x[h:], 2))
    return sconn.reclaim


def test_only_slices_of_reclaim_min_or_more_feed_the_reclaim_decision():
    """The worker times the send-FIFO write of a slice for Reclaim.wrote from RECLAIM_MIN bytes only: smaller
    ones (a small op's) leave the decision as it was; large ones feed it."""
    small = _looped_ring(1024, 20)                      # 4 KiB: slices far below RECLAIM_MIN
    assert small.cost == ([], []) and small.k == [0, 0]
    large = _looped_ring(4 * RECLAIM_MIN, 3)            # 4 x RECLAIM_MIN floats: slices of RECLAIM_MIN or more
    assert sum(map(len, large.cost)) > 0
