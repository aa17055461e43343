"""launch() under a user trial (session 36): a rank that fails while the others wait in a later init() of the
launch. Each test failed on the tree before its fix."""
from __future__ import annotations

import os
import time

import pytest

import slicetrace
from slicetrace.errors import LaunchError

LONG = 20.0         # what the survivors waited out before the fix; the failure now ends them at once


def fail_before_second_init(comm, how: str) -> None:
    """Rank 1 fails; the others make a second communicator, whose set-up waits for rank 1."""
    if comm.rank == 1:
        time.sleep(0.3)
        if how == "raise":
            raise ValueError("bad batch")
        os._exit(7)
    slicetrace.init()


@pytest.mark.parametrize("how,lead,cause", [
    ("raise", "rank 1 failed: ValueError: bad batch", "rank 1 failed: ValueError: bad batch"),
    ("die", "rank 1 died with exit code 7", "rank 1 died with exit code 7")])
def test_a_rank_failure_ends_the_others_waiting_in_a_later_init(how, lead, cause):
    """The others' set-up of the new communicator cannot watch rank 1 (it never joined): they waited timeout_s and
    failed in CommTimeoutError, which led the LaunchError, a minute after the failure by default."""
    with pytest.raises(LaunchError) as e:
        slicetrace.launch(fail_before_second_init, 3, how, timeout_s=LONG)
    assert str(e.value).splitlines()[0] == lead
    for r in (0, 2):
        head = e.value.errors[r].splitlines()[0]
        assert head.startswith(f"PeerError: {cause} (while this rank waited for \"rank 1's cpu backend segment"), head
