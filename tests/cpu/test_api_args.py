"""Arguments a demanding user gets wrong, refused before anything runs with an error naming the parameter, the value
and what is accepted (tests/cpu/test_api_input.py has the first of them)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import slicetrace
from slicetrace.api import Communicator
from slicetrace.config import Settings
from slicetrace.errors import UsageError
from slicetrace.events.abi import EventType
from slicetrace.rendezvous import DictStore


@pytest.fixture
def comm():
    c = slicetrace.init(backend="null")
    yield c
    c.close()


@pytest.mark.parametrize("mask,bits", [(1 << 40, "0x10000000000"), ((1 << 32) | 2, "0x100000000"),
                                       ("0x100000002", "0x100000000"), (EventType.COLL | 1 << 33, "0x200000000")])
def test_a_profiling_mask_past_32_bits_is_refused_naming_them(comm, mask, bits):
    # an event mask is 32 bits (SLICETRACE_PROFILE_EVENT_MASK's 0..2**32-1); 1 << 40 was taken as a limit
    with pytest.raises(UsageError, match=rf"^mask={re.escape(repr(mask))} has bits {bits} beyond an event mask's 32 \(0\.\.2\*\*32-1"
                                         rf"\); the event types are 0x1ffff \(GROUP 0x1 \.\. KERNEL_STEP 0x10000\)$"):
        with comm.profiling(True, mask=mask):
            pass
    assert comm._session.mask_limit == -1                # the block never opened


def test_a_profiling_mask_of_32_bits_is_still_a_limit(comm):
    # bench's "every type but KernelStep" is ~KernelStep within 32 bits
    s = comm._session
    for mask in (0xFFFFFFFF, ~int(EventType.KERNEL_STEP) & 0xFFFFFFFF, EventType.COLL):
        with comm.profiling(True, mask=mask):
            assert s.mask_limit == int(mask)


@pytest.mark.parametrize("args,msg", [
    (({"backend": "null"}, 0, 1), r"settings=\{'backend': 'null'\} \(type dict\) must be a slicetrace.Settings"),
    ((Settings(backend="null"), 0, "2"), r"world_size='2' \(type str\) must be an int >= 1"),
    ((Settings(backend="null"), 0, 1.0), r"world_size=1.0 \(type float\) must be an int >= 1"),
    ((Settings(backend="null"), 0, 0), r"world_size=0 \(type int\) must be an int >= 1"),
    ((Settings(backend="null"), 0.0, 1), r"rank=0.0 must be an int in 0..0 \(world_size=1\)"),
    ((Settings(backend="null"), True, 1), r"rank=True must be an int in 0..0 \(world_size=1\)"),
    ((Settings(backend="null"), 1, 1), r"rank=1 must be an int in 0..0 \(world_size=1\)"),
])
def test_a_communicator_made_directly_checks_its_arguments(args, msg):
    # Communicator is public (slicetrace.Communicator): a dict of settings was an AttributeError, world_size='2' a
    # TypeError, and rank=0.0 made a communicator whose rank was a float
    with pytest.raises(UsageError, match=rf"^{msg}$"):
        Communicator(*args, DictStore({}), "direct")


def test_a_communicator_made_directly_needs_a_store_and_takes_numpy_ints():
    with pytest.raises(UsageError, match=r"^store=\{\} \(type dict\) must be a slicetrace.rendezvous.Store$"):
        Communicator(Settings(backend="null"), 0, 1, {}, "direct")
    c = Communicator(Settings(backend="null"), np.int64(0), np.int32(1), DictStore({}), "direct")
    try:
        assert (type(c.rank), type(c.world_size), c.rank, c.world_size) == (int, int, 0, 1)
    finally:
        c.close()


def test_a_profiling_mask_may_be_a_numpy_int_as_settings_mask_may(comm):
    # roots, peers, tags and Settings(profile_event_mask=) take numpy ints; comm.profiling(mask=) refused them
    with comm.profiling(True, mask=np.int64(EventType.COLL)):
        assert comm._session.mask_limit == 2 and type(comm._session.mask_limit) is int
    for bad in (np.float32(2), True, -1, 2.0):
        with pytest.raises(UsageError, match=rf"^mask={re.escape(repr(bad))} must be an int >= 0 of EventType bits"):
            with comm.profiling(True, mask=bad):
                pass
