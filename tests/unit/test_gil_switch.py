"""The session's switch-interval guard: shortened while drain threads run, restored after the last one."""
from __future__ import annotations

import sys

import pytest

from slicetrace.config import Settings
from slicetrace.errors import ConfigError
from slicetrace.session import _GilSwitch


def test_shortened_while_any_session_uses_it_and_restored_after_the_last():
    old = sys.getswitchinterval()
    a, b = _GilSwitch(200), _GilSwitch(100)
    try:
        assert sys.getswitchinterval() == pytest.approx(min(old, 200e-6))
        a.restore()
        assert sys.getswitchinterval() == pytest.approx(min(old, 200e-6))    # b still runs
        a.restore()                                                           # twice: no effect
    finally:
        b.restore()
    assert sys.getswitchinterval() == old


def test_zero_leaves_the_interval_and_someone_elses_change_is_kept():
    old = sys.getswitchinterval()
    _GilSwitch(0).restore()
    assert sys.getswitchinterval() == old
    g = _GilSwitch(200)
    sys.setswitchinterval(0.001)            # the application changed it meanwhile
    g.restore()
    try:
        assert sys.getswitchinterval() == pytest.approx(0.001)
    finally:
        sys.setswitchinterval(old)


def test_bad_value_names_the_setting():
    with pytest.raises(ConfigError, match="gil_switch_us=-1"):
        Settings(gil_switch_us=-1)
