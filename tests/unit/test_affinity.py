"""cpu_bind: which CPU a rank's op thread gets, and that every mask comes back (backend/cpu/affinity.py)."""
from __future__ import annotations

import os
import threading

import pytest

from slicetrace.backend.cpu import affinity
from slicetrace.config import Settings
from slicetrace.errors import ConfigError

pytestmark = pytest.mark.skipif(not affinity.supported(), reason="no os.sched_setaffinity on this platform")


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch):
    """Claims in a folder of this test's own: the CPUs a real job on this host holds stay out of it."""
    monkeypatch.setattr(affinity, "LOCK_DIR", str(tmp_path / "cpus"))
    return tmp_path / "cpus"


def test_candidates_start_with_the_ranks_own_cpu_only_when_all_fit(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 9, 12})
    assert affinity.candidates(0, 4, 1) == [3, 5, 9, 12]
    assert affinity.candidates(2, 4, 1) == [9, 12, 3, 5]
    assert affinity.candidates(1, 2, 1) == [5, 9, 12, 3]
    assert affinity.candidates(0, 5, 1) == []          # ranks outnumber CPUs: binding would share cores
    assert affinity.candidates(0, 2, 2) == []          # channels 1.. run in threads of their own
    assert affinity.candidates(0, 1, 1) == []          # one rank waits on nobody


def test_bind_release_restore_the_threads_mask_and_nest():
    before = os.sched_getaffinity(0)
    cpu = max(before)
    tid = affinity.bind([cpu])
    try:
        assert os.sched_getaffinity(0) == {cpu}
        assert affinity.allowed() == before         # what ranks share: not crowded by our own binding
        assert affinity.bind([cpu]) == tid          # a second communicator in this thread shares the binding
        affinity.release(tid)
        assert os.sched_getaffinity(0) == {cpu}     # still held by the first
    finally:
        affinity.release(tid)
    assert os.sched_getaffinity(0) == before
    affinity.release(tid)                           # nothing held: a no-op
    assert os.sched_getaffinity(0) == before


def test_a_cpu_claimed_elsewhere_is_skipped_and_freed_at_release():
    before = sorted(os.sched_getaffinity(0))
    other = affinity._claim(before[0])               # another holder (an fd of its own: flock excludes it)
    try:
        got = {}

        def worker():
            tid = affinity.bind(before)
            got["cpu"] = os.sched_getaffinity(0)
            affinity.release(tid) if tid is not None else None
            got["tid"] = tid
        t = threading.Thread(target=worker)
        t.start()
        t.join(10)
        assert not t.is_alive()
        if len(before) == 1:
            assert got == {"cpu": set(before), "tid": None}      # the only CPU is taken: stays unbound
        else:
            assert got["cpu"] == {before[1]} and got["tid"] is not None
    finally:
        os.close(other)
    fd = affinity._claim(before[-1])                 # released: free to claim again
    assert fd is not None
    os.close(fd)


def test_unbound_block_and_channel_threads_get_the_cpus_from_before_binding():
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip(f"needs 2 allowed CPUs to tell a bound mask from the whole one, this process has {len(before)}")
    cpu = min(before)
    seen = {}

    def worker():
        affinity.unbind_thread()
        seen["worker"] = os.sched_getaffinity(0)
    tid = affinity.bind([cpu])
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
    with pytest.raises(ConfigError, match=r"cpu_bind='cores' is not one of \('auto', 'on', 'off'\)"):
        Settings(cpu_bind="cores")
    monkeypatch.setenv("SLICETRACE_CPU_BIND", "off")
    assert Settings.from_env().cpu_bind == "off"


def test_launch_binds_by_default_only_when_its_ranks_fill_over_half_the_cpus(monkeypatch):
    from slicetrace.launcher import _crowding
    for ncpu, world, want in ((2, 2, True), (3, 2, True), (4, 2, False), (64, 2, False), (8, 5, True), (2, 4, True)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=ncpu: set(range(n)))
        assert _crowding(world) is want, (ncpu, world)
