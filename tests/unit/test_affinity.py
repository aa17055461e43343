"""cpu_bind: which CPU a rank's op thread gets, and that every mask comes back (backend/cpu/affinity.py)."""
from __future__ import annotations

import os
import threading

import pytest

from slicetrace.backend.cpu import affinity
from slicetrace.config import Settings
from slicetrace.errors import ConfigError

pytestmark = pytest.mark.skipif(not affinity.supported(), reason="no os.sched_setaffinity on this platform")


def test_choose_gives_each_rank_its_own_cpu_only_when_all_fit(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 9, 12})
    assert [affinity.choose(r, 4, 1) for r in range(4)] == [3, 5, 9, 12]
    assert [affinity.choose(r, 2, 1) for r in range(2)] == [3, 5]
    assert affinity.choose(0, 5, 1) is None          # ranks outnumber CPUs: binding would share cores
    assert affinity.choose(0, 2, 2) is None          # channels 1.. run in threads of their own
    assert affinity.choose(0, 1, 1) is None          # one rank waits on nobody


def test_bind_release_restore_the_threads_mask_and_nest():
    before = os.sched_getaffinity(0)
    cpu = max(before)
    tid = affinity.bind(cpu)
    try:
        assert os.sched_getaffinity(0) == {cpu}
        assert affinity.allowed() == before         # what ranks share: not crowded by our own binding
        assert affinity.bind(cpu) == tid            # a second communicator in this thread shares the binding
        affinity.release(tid)
        assert os.sched_getaffinity(0) == {cpu}     # still held by the first
    finally:
        affinity.release(tid)
    assert os.sched_getaffinity(0) == before
    affinity.release(tid)                           # nothing held: a no-op
    assert os.sched_getaffinity(0) == before


def test_unbound_block_and_channel_threads_get_the_cpus_from_before_binding():
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip(f"needs 2 allowed CPUs to tell a bound mask from the whole one, this process has {len(before)}")
    cpu = min(before)
    seen = {}

    def worker():
        affinity.unbind_thread()
        seen["worker"] = os.sched_getaffinity(0)
    tid = affinity.bind(cpu)
    try:
        with affinity.unbound():
            seen["block"] = os.sched_getaffinity(0)
        seen["after"] = os.sched_getaffinity(0)
        t = threading.Thread(target=worker)
        t.start()
        t.join(10)
        assert not t.is_alive()
    finally:
        affinity.release(tid)
    assert seen == {"block": before, "after": {cpu}, "worker": before}


def test_unbound_without_binding_changes_nothing():
    before = os.sched_getaffinity(0)
    with affinity.unbound():
        assert os.sched_getaffinity(0) == before
    assert os.sched_getaffinity(0) == before


def test_cpu_bind_setting_is_checked(monkeypatch):
    with pytest.raises(ConfigError, match=r"cpu_bind='cores' is not one of \('auto', 'off'\)"):
        Settings(cpu_bind="cores")
    monkeypatch.setenv("SLICETRACE_CPU_BIND", "off")
    assert Settings.from_env().cpu_bind == "off"
