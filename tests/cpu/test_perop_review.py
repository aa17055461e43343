"""The per-op fast paths (api's inline op/root checks, the cpu backend's cached signatures and in-place test, the
host buffers' dtype cache, the FIFO reclaim's kept views) against the checks they stand for: op and root given as
numpy values or enums, and a randomized sequence of collectives on one pool of ranks compared with numpy."""
from __future__ import annotations

import enum
import threading

import numpy as np

import slicetrace
from slicetrace.rendezvous import DictStore


class Op(str, enum.Enum):       # a user's enum of the reductions (str mixin: it compares equal to its value)
    SUM = "sum"
    MAX = "max"


def _two_threads(body) -> dict:
    """body(comm) on ranks 0 and 1 of a cpu communicator, as threads of this process; each rank's result or error."""
    shared: dict = {}
    out: dict = {}

    def rank(r: int) -> None:
        try:
            with slicetrace.init(backend="cpu", rank=r, world_size=2, store=DictStore(shared), job="perop",
                                 timeout_s=10.0, cpu_bind="off") as c:
                out[r] = body(c)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out[r] = f"{type(e).__name__}: {e}"
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    return out


def _enum_ops(c) -> list:
    x = np.arange(6, dtype=np.float32) * (c.rank + 1)
    return [c.all_reduce(x, op=Op.SUM).tolist(), c.reduce_scatter(x, op=Op.MAX).tolist(),
            c.all_reduce(x, op=np.str_("min")).tolist()]


def test_an_op_given_as_a_str_enum_member_runs_as_its_value():
    # it passed the check (it is a str equal to 'sum'), then str() made it 'Op.SUM': a raw ValueError from the
    # signature's REDOPS.index on every rank of two or more
    out = _two_threads(_enum_ops)
    want = [[0.0, 3.0, 6.0, 9.0, 12.0, 15.0]]
    assert out == {0: want + [[0.0, 2.0, 4.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]],
                   1: want + [[6.0, 8.0, 10.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]}, out
