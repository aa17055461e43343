"""Which op a failure is told to comm_failed with (errors.credit): the op whose submit raised it, unless the backend
knows it belongs to an earlier op (cuda: the op whose completion failed; an abort re-raised by later submits), or
to none; and the session keeps nothing of a failed op (its error, traceback and buffers) once it has raised."""
from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

import slicetrace
from slicetrace.api_checks import told
from slicetrace.backend.base import Work
from slicetrace.backend.cuda.backend import CudaBackend
from slicetrace.backend.cuda.tokens import Pending, Token
from slicetrace.errors import MismatchError, PeerError, credit
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.plan.schedule import plan_collective
from slicetrace.rendezvous import DictStore
from tests.helpers.plugins import NoopPlugin

HEARD: list = []        # what Hears' comm_failed was told, (error, op, seq): init() makes the plugin itself


class Hears(NoopPlugin):
    name = "hears"

    def init(self, comm, mask):
        mask.value = int(abi.EventType.COLL)        # ops are profiled: their submit is the session's to credit
        return None

    def comm_failed(self, ctx, failure):
        HEARD.append((failure.error, failure.op, failure.seq))


def test_the_first_credit_stands_and_other_exceptions_are_left_alone():
    e = credit(PeerError("x"), ("all_reduce", 3))
    assert credit(e, ("broadcast", 9)) is e and e.failed_op == ("all_reduce", 3)
    assert credit(MismatchError("y"), None).failed_op is None and PeerError("z").failed_op is None
    v = ValueError("not ours")
    assert credit(v, ("all_reduce", 1)) is v and not hasattr(v, "failed_op")


def test_told_names_the_op_the_error_is_credited_to_or_none():
    HEARD.clear()
    host = EventHost([LoadedPlugin(Hears())], abi.CommInfo(5, "t", 1, 2, 0))
    sess = SimpleNamespace(host=host)
    told(credit(PeerError("a"), ("all_reduce", 4)), sess)
    told(credit(PeerError("b"), ("send_recv", -1)), sess)        # a group: its function, no SeqNum
    told(credit(MismatchError("c"), None), sess)
    told(PeerError("d"), sess)                                   # found outside an op's submit (synchronize)
    host.close()
    assert HEARD == [("PeerError", "AllReduce", 4), ("PeerError", "SendRecv", None), ("MismatchError", None, None),
                     ("PeerError", None, None)]


def _fails(comm):
    x = np.ones(64, np.float32)
    comm.all_reduce(x)
    comm._session.backend.abort("rank 1 went away")      # the null backend's next submit raises PeerError
    try:
        comm.all_reduce(x)
    except PeerError:
        pass
    return weakref.ref(x)


def test_a_failed_submit_is_credited_to_its_op_and_the_session_keeps_none_of_it():
    HEARD.clear()
    comm = slicetrace.init(backend="null", rank=0, world_size=1, profiler_plugin=Hears)
    try:
        ref = _fails(comm)
        gc.collect()
        assert ref() is None, gc.get_referrers(ref())     # the op's buffer: not kept by the session's error record
        assert HEARD == [("PeerError", "AllReduce", 1)]
    finally:
        comm._session.backend._aborted = None
        comm.close()


# ---- the cuda backend's attribution, without a GPU: Completion.wait and CudaBackend.submit over host fakes ----
class _Mem:
    def __init__(self, aborted: bool):
        self.words = [0, int(aborted), 0, 0]        # words[1]: a kernel of ours exited on an abort word

    def raise_abort(self, stream: int) -> bool:
        self.words[1] = 1
        return True


class _Done:
    done = True


class _Cuda(CudaBackend):
    """The fields Completion and submit's abort checks read; its last op is AllReduce #4 (op tag 7)."""

    def __init__(self, aborted: bool):
        self.rank, self.mem, self.store, self.sigs, self.order = 0, _Mem(aborted), DictStore({}), None, None
        self._prefix, self._side, self._closed, self._told = "p", 0, False, False
        self._broken, self._broken_as, self._broken_op = None, PeerError, None
        self._last = Token(_Done(), 7, (1,), 0, None, ("all_reduce", 4))
        self._pending = Pending()
        self._pending.add(self._last)


class _Running:
    done = False


def test_cuda_credits_a_failure_to_the_earliest_op_still_running_not_the_last_launched():
    """The host may be hundreds of ops ahead of the GPU: the op that stopped is the earliest not done."""
    be = _Cuda(aborted=True)
    running = Token(_Running(), 5, (1,), 0, None, ("all_reduce", 2))
    be._pending = Pending()
    for tok in (running, Token(_Running(), 6, (1,), 0, None, ("all_reduce", 3)), be._last):
        be._pending.add(tok)
    with pytest.raises(PeerError) as e:
        be.submit(_work(0))
    assert e.value.failed_op == ("all_reduce", 2), str(e.value)
    assert be.running_token() == (running, "; 2 op(s) launched after it will not run")


def _work(seq: int) -> Work:
    return Work(8, plan_collective("broadcast", 2, 0, 1024, 4, 0, 1, 1 << 19), "float32", "sum", seq_number=seq)


def test_cuda_credits_a_failed_completion_to_its_op_and_later_submits_to_that_op_not_theirs():
    be = _Cuda(aborted=True)            # AllReduce #4's kernel exited on an abort; the next submit finds it
    for _ in range(2):                  # then the abort, re-raised ("aborted earlier") by the submit after
        with pytest.raises(PeerError) as e:
            be.submit(_work(0))
        assert e.value.failed_op == ("all_reduce", 4), str(e.value)
        assert credit(e.value, ("broadcast", 0)).failed_op == ("all_reduce", 4)     # the session's credit: too late
    assert "aborted earlier" in str(e.value)
    be = _Cuda(aborted=True)
    with pytest.raises(PeerError) as e:         # synchronize(): its wait on the last op
        be.wait(be._last, 5.0)
    assert e.value.failed_op == ("all_reduce", 4) and "op 7 was aborted" in str(e.value)


def test_cuda_credits_an_abort_that_belongs_to_no_known_op_to_none():
    be = _Cuda(aborted=False)
    be.abort("rank 1: went away")               # e.g. found at a barrier: no op of ours known
    with pytest.raises(PeerError) as e:
        be.submit(_work(2))
    assert "failed_op" in e.value.__dict__ and e.value.failed_op is None     # credited: the session's cannot land
    assert credit(e.value, ("broadcast", 2)).failed_op is None
