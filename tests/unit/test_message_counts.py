"""Counts in messages read right: '1 element', '2 elements' (a user trial met 'input has 1 elements')."""
from __future__ import annotations

import numpy as np
import pytest

import slicetrace
from slicetrace.api_checks import a2a_counts
from slicetrace.errors import UsageError, plural


def test_plural():
    assert [plural(n, "element") for n in (0, 1, 2)] == ["0 elements", "1 element", "2 elements"]
    assert plural(np.int64(1), "plugin") == "1 plugin" and plural(3, "index", "indices") == "3 indices"


@pytest.mark.parametrize("args,want", [
    ((1, None, None, 0, 2), "all_to_all input has 1 element, not a multiple of world_size=2"),
    ((1, [1, 1], [1, 1], 0, 2), "all_to_all: x has 1 element but send_counts=[1, 1] sum to 2"),
    ((3, [1, 2], [2, 1], 0, 2), "all_to_all: rank 0 sends itself 1 element (send_counts[0]) but receives 2"),
])
def test_all_to_all_counts_say_element_for_one(args, want):
    with pytest.raises(UsageError) as e:
        a2a_counts(*args)
    assert str(e.value).startswith(want)


def test_an_output_of_one_element_says_element():
    with slicetrace.init(backend="null") as comm:
        with pytest.raises(UsageError, match=r"^out has 1 element, this operation needs 2$"):
            comm.all_reduce(np.ones(2, np.float32), np.ones(1, np.float32))
