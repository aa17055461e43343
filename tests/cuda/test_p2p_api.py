"""Point-to-point through the public API on 3 ranks (GPUs shared round-robin): a halo exchange on a line, where
rank 1 has two neighbours and ranks 0 and 2 one. Both ends must cut each message into the same pieces and put
each piece's connection on one channel; the trace pairs every send with its receive by (channel, step)."""
from __future__ import annotations

import glob

import numpy as np
import pytest

COUNT = 4 << 20                       # 16 MiB of float32: split into pieces on the GPU


def _halo(comm):
    import cupy
    r, n = comm.rank, comm.world_size
    nbrs = [p for p in (r - 1, r + 1) if 0 <= p < n]
    dev = comm._session.backend.device
    with cupy.cuda.Device(dev):
        outs = {p: cupy.zeros(COUNT, dtype=cupy.float32) for p in nbrs}
        ins = {p: cupy.arange(COUNT, dtype=cupy.float32) + 1000 * r + p for p in nbrs}
    for _ in range(2):
        with comm.group():
            for p in nbrs:
                comm.send(ins[p], p)
            for p in nbrs:
                comm.recv(outs[p], p)
    comm.flush_profiler()
    with cupy.cuda.Device(dev):
        base = np.arange(COUNT, dtype=np.float32)
        return {p: bool(np.array_equal(outs[p].get(), base + 1000 * p + r)) for p in nbrs}


@pytest.mark.cuda
def test_halo_exchange_between_ranks_of_different_degree(gpu, kcache, tmp_path):
    import slicetrace
    from slicetrace.analyze.trace import check_trace, kernel_steps, load_traces
    prefix = str(tmp_path / "halo")
    res = slicetrace.launch(_halo, 3, backend="cuda", cache_dir=kcache, timeout_s=30.0, join_timeout_s=240,
                            profiler_plugin="example", profile_dump_file=prefix)
    assert res == [{1: True}, {0: True, 2: True}, {1: True}]
    files = sorted(glob.glob(prefix + "_*.json"))
    assert len(files) == 3 and all(check_trace(f) == [] for f in files)
    ks = kernel_steps(load_traces(files))
    sends = {(int(k["rank"]), int(k["peer"]), int(k["channel"]), int(k["step"])): int(k["size"])
             for k in ks if k["is_send"]}
    recvs = {(int(k["peer"]), int(k["rank"]), int(k["channel"]), int(k["step"])): int(k["size"])
             for k in ks if not k["is_send"]}
    assert len(sends) == int(ks["is_send"].sum()) > 16 and sends == recvs
    assert sum(sends.values()) == 2 * 4 * COUNT * 4          # 2 rounds, 4 messages of 16 MiB


def _unreceived(comm, n):
    import cupy
    with cupy.cuda.Device(comm._session.backend.device):
        x = cupy.arange(n, dtype=cupy.float32)
        if comm.rank == 0:
            comm.send(x, 1)              # fits the FIFO: it completes with no receive
            comm.send(x, 1)
        else:
            comm.recv(x, 0)              # the first is received, the second never is
    comm.all_reduce(x, x)                # a collective after it: ring connections are not counted as lost
    comm.barrier()
    return "returned"


@pytest.mark.cuda
def test_a_message_never_received_is_an_error_at_close(gpu, kcache):
    import slicetrace
    from slicetrace.errors import LaunchError
    with pytest.raises(LaunchError) as e:
        slicetrace.launch(_unreceived, 2, 1000, backend="cuda", cache_dir=kcache, timeout_s=30.0,
                          join_timeout_s=240)
    msg = str(e.value)
    assert ("rank 1 failed: UsageError: rank 1 closed its communicator with messages it never received: 1 from "
            "rank 0 (1000 elements: it sent 2, this rank received 1); they are lost") in msg, msg
    assert "rank 0 failed" not in msg, msg


def _torch_bf16(comm):
    import torch
    dev = comm._session.backend.device
    with torch.cuda.device(dev):
        r, n, p = comm.rank, comm.world_size, 1 - comm.rank
        x = torch.arange(4 * n, dtype=torch.bfloat16, device=f"cuda:{dev}") + 100 * r
        summed = comm.all_reduce(x)                       # out=None: allocated, handed back as a torch tensor
        a2a = comm.all_to_all(x)
        a = torch.zeros(4, dtype=torch.bfloat16, device=f"cuda:{dev}")
        b = torch.zeros(4, dtype=torch.bfloat16, device=f"cuda:{dev}")
        with comm.group():                                # two receives into separate tensors: no overlap
            comm.send(x[:4], p)
            comm.send(x[4:8], p)
            comm.recv(a, p)
            comm.recv(b, p)
        comm.synchronize()
        refused = ""
        try:
            with comm.group():
                comm.send(x[:4], p)
                comm.recv(x[2:6], p)
        except Exception as e:  # noqa: BLE001 - reported to the test
            refused = f"{type(e).__name__}: {e}"
        return (type(summed).__module__, summed.float().tolist(), a2a.float().tolist(), a.float().tolist(),
                b.float().tolist(), refused)


@pytest.mark.cuda
def test_torch_bfloat16_outputs_are_torch_tensors_and_groups_check_their_real_addresses(gpu, kcache):
    """bfloat16 tensors where CuPy has no bfloat16 travel as the backend's RawBuf: an out=None op handed that
    handle back (all_reduce failed on its reshape), and the group overlap check read every RawBuf's address as 0,
    so any group of two of them was refused as overlapping."""
    pytest.importorskip("torch")
    import slicetrace
    res = slicetrace.launch(_torch_bf16, 2, backend="cuda", cache_dir=kcache, timeout_s=30.0, join_timeout_s=240)
    for r, (mod, summed, a2a, a, b, refused) in enumerate(res):
        p = 1 - r
        assert mod.startswith("torch") and summed == [2 * i + 100.0 for i in range(8)]
        assert a2a == [i + 4 * r + 100.0 * j for j in range(2) for i in range(4)]
        assert a == [i + 100.0 * p for i in range(4)] and b == [i + 4 + 100.0 * p for i in range(4)]
        assert "UsageError: send/recv group: the buffer of recv(peer=" in refused


def _two_streams(comm):
    """Ops of one communicator alternating between two non-blocking streams, issued back to back."""
    import cupy
    import torch
    dev = comm._session.backend.device
    n, r = 16 << 20, comm.rank
    with cupy.cuda.Device(dev):
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
        xs = [cupy.arange(n, dtype=cupy.float32) % 1000 + r + k for k in range(6)]
        for k, x in enumerate(xs):
            comm.all_reduce(x, x, stream=streams[k % 2])
        for s in streams:
            s.synchronize()
        w = comm.world_size
        base = np.arange(n, dtype=np.float32) % 1000
        ok = [bool(np.array_equal(x.get(), w * base + sum(range(w)) + w * k)) for k, x in enumerate(xs)]
    with torch.cuda.device(dev):
        side = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(side):                # a torch user means torch's current stream
            t = torch.full((n,), float(r + 1), device=f"cuda:{dev}")
            y = comm.all_reduce(t)
            used = comm._session.backend._last.stream
            z = y * 2                                # on `side`: must see the finished sum
        side.synchronize()
        torch_ok = bool((z == 2.0 * sum(range(1, w + 1))).all().item())
    return ok, used == side.cuda_stream, torch_ok


@pytest.mark.cuda
def test_ops_on_different_streams_run_in_issue_order_and_torch_users_get_torchs_stream(gpu, kcache):
    """Two ops on two streams ran at once, both taking up the FIFO step counters from the same place; a torch
    tensor op under torch.cuda.stream(s) ran on CuPy's default stream, which s does not wait for."""
    pytest.importorskip("torch")
    import slicetrace
    res = slicetrace.launch(_two_streams, 2, backend="cuda", cache_dir=kcache, timeout_s=30.0, join_timeout_s=240)
    assert res == [([True] * 6, True, True)] * 2


def _capture(comm):
    import cupy
    from slicetrace.errors import UsageError
    with cupy.cuda.Device(comm._session.backend.device):
        x = cupy.ones(1024, dtype=cupy.float32)
        s = cupy.cuda.Stream(non_blocking=True)
        s.begin_capture()
        try:
            comm.all_reduce(x, x, stream=s)
            refused = ""
        except UsageError as e:
            refused = str(e)
        finally:
            graph = s.end_capture()         # the capture is still valid: nothing of ours was enqueued
        comm.all_reduce(x, x, stream=s)       # and the communicator goes on
        s.synchronize()
        return refused, graph is not None, float(x[0].get())


@pytest.mark.cuda
def test_an_op_on_a_capturing_stream_is_refused_and_the_communicator_goes_on(gpu, kcache):
    import slicetrace
    res = slicetrace.launch(_capture, 2, backend="cuda", cache_dir=kcache, timeout_s=30.0, join_timeout_s=240)
    for refused, graph, v in res:
        assert "is capturing a CUDA graph: slicetrace ops cannot be captured" in refused, refused
        assert graph and v == 2.0


def _uneven_all_to_all(comm, counts):
    import cupy
    r, n = comm.rank, comm.world_size
    with cupy.cuda.Device(comm._session.backend.device):
        x = cupy.concatenate([cupy.full(counts[r][j], 100 * r + j, dtype=cupy.int32) for j in range(n)])
        got = comm.all_to_all(x, send_counts=counts[r], recv_counts=[counts[j][r] for j in range(n)])
        out = cupy.full(sum(counts[j][r] for j in range(n)), -1, dtype=cupy.int32)
        assert comm.all_to_all(x, out, send_counts=counts[r], recv_counts=[counts[j][r] for j in range(n)]) is out
        comm.synchronize()
        want = np.concatenate([np.full(counts[j][r], 100 * j + r, np.int32) for j in range(n)])
        return [type(got).__name__, got.shape == want.shape, bool(np.array_equal(got.get(), want)),
                bool(np.array_equal(out.get(), want))]


@pytest.mark.cuda
def test_uneven_all_to_all_blocks_of_different_sizes(gpu, kcache):
    """torch's split sizes: zeros, small blocks and blocks of several FIFO loops, as one group per call."""
    import slicetrace
    counts = [[0, 3, 1 << 20], [5, 0, 17], [(1 << 20) + 7, 0, 2]]
    res = slicetrace.launch(_uneven_all_to_all, 3, counts, backend="cuda", cache_dir=kcache, timeout_s=30.0,
                            join_timeout_s=240)
    assert res == [["ndarray", True, True, True]] * 3
