"""Which op a failure is told to comm_failed with (errors.credit): the op whose submit raised it, or none; and the
session keeps nothing of a failed op (its error, traceback and buffers) once it has raised."""
from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import numpy as np

import slicetrace
from slicetrace.api_checks import told
from slicetrace.errors import MismatchError, PeerError, credit
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
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
