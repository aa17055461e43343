"""Point-to-point messages match in order whatever each side groups with them, and a message that does not match
(count or dtype) is an error on both ranks at once, never a timeout or data taken as another message's."""
from __future__ import annotations

import os
import re
import time
import uuid

import numpy as np
import pytest

import slicetrace
from slicetrace.errors import LaunchError

N = 3 << 20                   # float32 elements: 12 MiB, cut into pieces over the 64 channels


def _grouped_against_single(comm):
    if comm.rank == 0:
        with comm.group():
            for i in range(3):
                comm.send(np.full(N, i, np.float32), 1)
        return "sent"
    ys = [np.full(N, -1, np.float32) for _ in range(3)]
    for y in ys:
        comm.recv(y, 0)
    return [bool((y == i).all()) for i, y in enumerate(ys)]


def test_a_grouped_send_matches_single_receives():
    """NCCL does not ask both sides to group alike. Before, the cut into pieces depended on the group (21 pieces
    against 24) and the receiver raised a MismatchError on valid use."""
    res = slicetrace.launch(_grouped_against_single, 2, backend="cpu", nchannels=64, buffsize=32768, timeout_s=20,
                            join_timeout_s=120)
    assert res == ["sent", [True, True, True]]


def _empty_send_against_a_receive(comm):
    if comm.rank == 0:
        comm.send(np.zeros(0, np.float32), 1)
    else:
        comm.recv(np.zeros(10, np.float32), 0)
    comm.all_reduce(np.ones(4, np.float32))
    return "ok"


def test_an_empty_message_against_a_receive_of_data_is_a_mismatch_at_once():
    """Before, the receiver waited for data that never came: a CommTimeoutError on both ranks after timeout_s."""
    with pytest.raises(LaunchError) as e:
        slicetrace.launch(_empty_send_against_a_receive, 2, backend="cpu", timeout_s=600, join_timeout_s=120)
    want = ("MismatchError: point-to-point mismatch: rank 1 expects message #0 of 10 x float32 from rank 0, rank 0 "
            "sends a message of 0 x float32")
    errors = e.value.errors                                      # rank -> its error and traceback
    assert sorted(errors) == [0, 1] and all(v.startswith(want) for v in errors.values()), errors


def _many_empty_then_data(comm):
    if comm.rank == 0:
        with comm.group():
            for _ in range(17):                # more headers than the 16 slots: they would lap the first
                comm.send(np.zeros(0, np.int32), 1)
            comm.send(np.arange(1, 6, dtype=np.int32), 1)
        return "sent"
    y = np.zeros(5, np.int32)
    comm.recv(y, 0)
    return y.tolist()


def test_a_sender_never_laps_a_header_the_receiver_has_not_checked():
    """Before, 17 empty messages overwrote message #0's header and the receive took message #17's data as its own,
    with no error on either rank. Now the sender waits for the receiver's checks and the mismatch is found."""
    with pytest.raises(LaunchError) as e:
        slicetrace.launch(_many_empty_then_data, 2, backend="cpu", timeout_s=20, join_timeout_s=120)
    assert ("MismatchError: point-to-point mismatch: rank 1 expects message #0 of 5 x int32 from rank 0, rank 0 sends "
            "a message of 0 x int32") in str(e.value)


def _two_sends_one_recv(comm, n):
    x = np.arange(2 * n, dtype=np.float32)
    if comm.rank == 0:
        with comm.group():
            comm.send(x[:n], 1)
            comm.send(x[n:], 1)
        return "sent"
    y = np.zeros(2 * n, np.float32)
    comm.recv(y, 0)                    # cut in two pieces of n: the same pieces as the two sends
    return "received"


def test_a_receive_whose_pieces_match_two_whole_sends_is_still_a_mismatch():
    """With 4 channels a 1.5 MiB receive travels in two 768 KiB pieces, each with its own header; two 768 KiB sends
    had the same piece counts, so the mismatch passed and both ranks returned."""
    with pytest.raises(LaunchError) as e:
        slicetrace.launch(_two_sends_one_recv, 2, 196_608, backend="cpu", nchannels=4, timeout_s=20,
                          join_timeout_s=120)
    assert ("MismatchError: point-to-point mismatch: rank 1 expects message #0 of 393216 x float32 from rank 0, "
            "rank 0 sends a message of 196608 x float32") in str(e.value), str(e.value)


RECV_TIMEOUT_S = 1.5


def _recv_never_sent(comm, folder: str, job: str):
    """The launch's communicator (timeout_s=30) only lines the ranks up: a set-up bounded by the short timeout_s
    raced the spawned ranks' import skew under load. The receive's communicator is made past the barrier."""
    comm.barrier()
    with slicetrace.init(rank=comm.rank, world_size=2, job=job, backend="cpu",
                         timeout_s=RECV_TIMEOUT_S) as sub:
        if comm.rank == 0:              # alive, never sends: rank 1's receive can only time out
            deadline = time.monotonic() + 25        # before the launcher's kill (timeout_s + 5 s)
            while not os.path.exists(f"{folder}/recv_ended"):
                assert time.monotonic() < deadline, "rank 1's receive did not end within 25 s"
                time.sleep(0.01)
            return "idle"
        try:
            sub.recv(np.zeros(1000, np.float32), 0)
        finally:
            open(f"{folder}/recv_ended", "w").close()


def test_a_receive_that_times_out_names_what_it_waited_for(tmp_path):
    """The message said only 'point-to-point progress with rank(s) [0]'; the README promises the wait's kind,
    peer, channel and step."""
    with pytest.raises(LaunchError) as e:
        slicetrace.launch(_recv_never_sent, 2, str(tmp_path), uuid.uuid4().hex[:10], backend="cpu", timeout_s=30,
                          join_timeout_s=120)
    msg = e.value.errors[1]
    assert msg.startswith("CommTimeoutError") and re.search(
        r"point-to-point progress: data from rank 0 on channel \d+ \(step 0\)", msg), msg
    assert f"rank 1 waited {RECV_TIMEOUT_S}s (timeout_s) for point-to-point progress" in msg, msg   # the receive's


def _one_send_two_recvs(comm, n):
    if comm.rank == 0:
        comm.send(np.arange(2 * n, dtype=np.float32), 1)        # cut in two pieces of n
        return "sent"
    a, b = np.zeros(n, np.float32), np.zeros(n, np.float32)
    with comm.group():
        comm.recv(a, 0)
        comm.recv(b, 0)
    return "received"


def test_a_send_whose_pieces_match_two_whole_receives_is_a_mismatch_naming_the_whole_send():
    with pytest.raises(LaunchError) as e:
        slicetrace.launch(_one_send_two_recvs, 2, 196_608, backend="cpu", nchannels=4, timeout_s=20,
                          join_timeout_s=120)
    assert ("MismatchError: point-to-point mismatch: rank 1 expects message #0 of 196608 x float32 from rank 0, "
            "rank 0 sends a message of 393216 x float32") in str(e.value), str(e.value)


def _uneven_all_to_all_disagreeing(comm):
    x = np.arange(20, dtype=np.float32)
    recvs = [10, 5] if comm.rank == 0 else [10, 10]     # rank 1 sends rank 0 ten elements, rank 0 expects five
    comm.all_to_all(x, send_counts=[10, 10], recv_counts=recvs)
    comm.all_reduce(np.ones(4, np.float32))
    return "ok"


def test_uneven_all_to_all_whose_counts_disagree_is_a_mismatch_on_both_ranks():
    """rank i's send_counts[j] must be rank j's recv_counts[i]: otherwise the receive names both sizes, at once
    (timeout_s is 600), and the sender learns it at its next op."""
    with pytest.raises(LaunchError) as e:
        slicetrace.launch(_uneven_all_to_all_disagreeing, 2, backend="cpu", timeout_s=600, join_timeout_s=120)
    want = ("point-to-point mismatch: rank 0 expects message #0 of 5 x float32 from rank 1, rank 1 sends a message "
            "of 10 x float32")
    assert str(e.value).count(want) == 2, str(e.value)
    # the receiving rank's, raised in all_to_all, says which counts must agree and its own
    assert (f"MismatchError: all_to_all: {want}; rank i's send_counts[j] must equal rank j's recv_counts[i] (this "
            f"rank's send_counts=[10, 10], recv_counts=[10, 5])") in e.value.errors[0], e.value.errors[0]
