"""backend.base helpers shared by the backends and the API."""
from __future__ import annotations

import numpy as np
import pytest

from slicetrace.api import _ptr
from slicetrace.backend.base import host_pointer


@pytest.mark.parametrize("make", [
    lambda: np.arange(1000, dtype=np.float32),
    lambda: np.arange(1000, dtype=np.int8)[7:],                    # offset view
    lambda: np.zeros(0, np.float64),                               # empty: no buffer to wrap
    lambda: np.arange(1000, dtype=np.int64)[::3],                  # strided
    lambda: np.frombuffer(b"abcdefgh" * 8, dtype=np.uint8),        # read-only
], ids=["plain", "offset", "empty", "strided", "readonly"])
def test_host_pointer_is_the_array_address_for_any_numpy_array(make):
    a = make()
    assert host_pointer(a) == a.ctypes.data == _ptr(a)
