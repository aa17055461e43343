"""Arguments a demanding user gets wrong, refused before anything runs with an error naming the parameter, the value
and what is accepted (tests/cpu/test_api_input.py has the first of them)."""
from __future__ import annotations

import re

import pytest

import slicetrace
from slicetrace.errors import UsageError
from slicetrace.events.abi import EventType


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
