"""The launcher's failure line names the failed rank once: its own findings already say "rank R ..."."""
from __future__ import annotations

from slicetrace.launcher import failure_line


def test_a_finding_that_names_its_rank_is_not_prefixed_again():
    """Before: "rank 1 failed: rank 1 died with exit code 3"."""
    assert failure_line(1, "rank 1 died with exit code 3") == "rank 1 died with exit code 3"
    assert failure_line(1, "rank 1: its return value could not be rebuilt") == \
        "rank 1: its return value could not be rebuilt"


def test_the_ranks_own_error_is_prefixed_with_the_rank():
    assert failure_line(0, "ValueError: boom") == "rank 0 failed: ValueError: boom"
    assert failure_line(2, "PeerError: rank 1 failed: RuntimeError: x") == \
        "rank 2 failed: PeerError: rank 1 failed: RuntimeError: x"       # another rank's name: still prefixed
    assert failure_line(1, "rank 10 died with exit code 3") == "rank 1 failed: rank 10 died with exit code 3"
