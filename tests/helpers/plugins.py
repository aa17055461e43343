"""A profiler plugin that does nothing, for tests to subclass with the one call they look at."""
from __future__ import annotations


class NoopPlugin:
    version, name = 8, "noop"

    def init(self, comm, mask):
        return None

    def start_event(self, ctx, descr):
        return None

    def stop_event(self, handle, ts_ns):
        pass

    def record_event_state(self, handle, state, args):
        pass

    def finalize(self, ctx):
        pass


class InitFails(NoopPlugin):
    name = "init_fails"

    def init(self, comm, mask):
        raise OSError("no such device")


class CtorFails(NoopPlugin):
    """Made with the settings, as a factory: its constructor refuses them."""
    name = "ctor_fails"

    def __init__(self, settings):
        raise ValueError("needs a license file")


class Rank1DiesAtColl12(NoopPlugin):
    """Rank 1 dies (os._exit) as its 12th profiled collective starts: a run that fails part way through."""
    name = "rank1_dies"

    def init(self, comm, mask):
        from slicetrace.events.abi import EventType
        mask.value = int(EventType.COLL)
        return None

    def start_event(self, ctx, descr):
        from slicetrace.events.abi import CollDescr
        if isinstance(descr, CollDescr) and descr.rank == 1 and descr.seq_number >= 12:
            import os
            os._exit(3)
        return None
