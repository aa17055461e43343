"""Fixtures shared by the cpu tests."""
from __future__ import annotations

import signal

import pytest


@pytest.fixture
def sigint_on():
    """Python's SIGINT handler in the test process (its children then start with SIGINT on): a runner may start
    the tests with SIGINT ignored, which every child would inherit, and the tests that use this are about Ctrl-C."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
