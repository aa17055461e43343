"""Communicator's profiling controls: a block's ops profiled or not (and with which event types at most), which
plugins record, their counters, and waiting for the stamps of finished ops to reach them."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from .api_checks import profile_mask, seconds_or_none
from .errors import UsageError


class ProfilingControls:
    """The profiling half of api.Communicator's public methods (mixed into it): they use its `_session` and
    `_check_open`."""

    @contextlib.contextmanager
    def profiling(self, enabled: bool, mask: int | str | None = None) -> Iterator[None]:
        """Turn event collection off (or back on) for the ops inside the block (as exampleProfilerStart/Stop).
        mask: event types (EventType bits below 2**32, or names as 'Coll|KernelCh') the block's ops may carry at
        most, e.g. everything but KernelStep to measure what KernelStep alone costs (a type kept keeps its parents,
        as NCCL's rule has it: 'KernelStep' keeps Coll/P2p and the API events); the plugins' own masks still apply.
        ProxyCtrl, the drain's events, belong to no op: the plugins' live masks alone govern them (README)."""
        if not isinstance(enabled, bool):       # "no" would be truthy
            raise UsageError(f"enabled={enabled!r} must be True or False")
        self._check_open()
        mask = profile_mask(mask)
        s, me = self._session, threading.get_ident()
        if s.profiling_owner not in (None, me):     # one switch per communicator: the other thread's would win
            raise UsageError("comm.profiling(): another thread has a profiling block of this communicator open")
        prev = s.paused, s.mask_limit, s.profiling_owner
        s.paused, s.profiling_owner = not enabled, me
        if mask is not None:
            s.mask_limit = mask & s.mask_limit              # nested: within the outer block's limit
        try:
            yield
        finally:
            s.paused, s.mask_limit, s.profiling_owner = prev

    @property
    def profiler_enabled(self) -> bool:
        """Whether a plugin records: not when each failed in its init (unloaded, as NCCL does; plugin_init_failed)."""
        return self._session.host is not None

    @property
    def profiler_plugins(self) -> list[str]:
        """The names (`name`, else as listed) of the plugins past their init, not disabled (plugin_max_failures)."""
        host = self._session.host
        return [] if host is None else [lp.name for lp in host.plugins if lp.name not in host.disabled()]

    def drop_counters(self) -> dict[str, int]:
        """Records lost or left out, by reason, and delivered, by type: the per-plugin counts (delivered_*,
        unrecorded_* for parents skipped through a plugin's unrecorded_handle, declined, pool_full, ...) summed over
        the plugins (each plugin's own output carries its own)."""
        return self._session.counters()

    def flush_profiler(self, timeout_s: float | None = None) -> None:
        """Wait until every stamp of every finished op reached the plugins (within timeout_s, default the
        communicator's: else SliceTraceError)."""
        seconds_or_none(timeout_s, "timeout_s", "the communicator's timeout_s")
        self._check_open()                      # a poll after close would read rings the backend freed
        self._session.flush(timeout_s)
