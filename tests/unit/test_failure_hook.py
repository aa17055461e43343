"""An op's failure reaches the plugins that implement comm_failed (slicetrace's extension, not NCCL's ABI)."""
from __future__ import annotations

import time

from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import Failure, LoadedPlugin
from tests.helpers.plugins import NoopPlugin

COMM = abi.CommInfo(77, "t", 1, 2, 0)


class Hears(NoopPlugin):
    name = "hears"

    def __init__(self):
        self.told: list[Failure] = []

    def comm_failed(self, ctx, failure):
        self.told.append(failure)


class Raises(NoopPlugin):
    name = "raises"

    def comm_failed(self, ctx, failure):
        raise RuntimeError("its own bug")


def test_plugins_with_comm_failed_hear_each_failure_and_others_are_left_alone():
    hears, plain = Hears(), NoopPlugin()
    host = EventHost([LoadedPlugin(hears), LoadedPlugin(plain)], COMM)
    before = time.monotonic_ns()
    host.failed("PeerError", "rank 1 exited\nmore", "AllReduce", 3)
    host.failed("MismatchError", "collective #2 differs")
    assert [f[1:] for f in hears.told] == [("PeerError", "rank 1 exited\nmore", "AllReduce", 3),
                                           ("MismatchError", "collective #2 differs", None, None)]
    assert before <= hears.told[0].ts_ns <= hears.told[1].ts_ns <= time.monotonic_ns()    # the trace's clock
    assert host.counters()["plugin_error"] == 0
    host.close()
    host.failed("PeerError", "after close")          # finalized plugins are not called
    assert len(hears.told) == 2


def test_a_comm_failed_that_raises_counts_as_the_plugins_error_and_the_others_still_hear():
    hears = Hears()
    host = EventHost([LoadedPlugin(Raises()), LoadedPlugin(hears)], COMM)
    host.failed("CommTimeoutError", "waited 6s")
    assert [f.error for f in hears.told] == ["CommTimeoutError"]
    assert host.counters()["plugin_error"] == 1
    host.close()
