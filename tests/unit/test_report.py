import numpy as np
import pytest

from slicetrace.analyze.report import build
from slicetrace.analyze.trace import KERNEL_STEP_TABLE
from slicetrace.errors import TraceFormatError


def _rows(rows):
    return np.array([r + (0, 0) for r in rows], dtype=KERNEL_STEP_TABLE)


def test_slow_link_and_waited_on_peer_are_found():
    # rank 0 -> 1 moves 1 MB in 10 us (100 GB/s); rank 1 -> 0 moves 1 MB in 100 us; rank 0 waits for rank 1
    ks = _rows([
        (0, 0, 1, 1, 0, 1_000_000, 0, 10, 10_010),
        (1, 0, 0, 0, 0, 1_000_000, 5, 10_020, 10_030),
        (1, 0, 1, 0, 0, 1_000_000, 0, 0, 100_000),
        (0, 0, 0, 1, 0, 1_000_000, 0, 100_010, 100_020),
    ])
    rep = build(ks)
    by = {(ln["src"], ln["dst"]): ln for ln in rep.links}
    assert by[(0, 1)]["gbps"] == pytest.approx(100.0) and by[(1, 0)]["gbps"] == pytest.approx(10.0)
    assert rep.waited_on[0]["rank"] == 0 and rep.waited_on[0]["peer"] == 1
    assert rep.waited_on[0]["wait_us"] == pytest.approx(100.01)
    assert rep.slowest[0]["rank"] == 1 and rep.slowest[0]["is_send"]
    assert {r["rank"]: r["slices"] for r in rep.ranks} == {0: 2, 1: 2}


def test_wrong_input_is_refused():
    with pytest.raises(TraceFormatError):
        build(np.zeros(3))
