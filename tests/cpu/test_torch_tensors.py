"""torch CPU tensors on the cpu backend: in place and out of place, allocated outputs as torch tensors (bfloat16
through its bits), and the tensors it cannot use refused with what to pass instead."""
from __future__ import annotations

import pytest

import slicetrace

torch = pytest.importorskip("torch", reason="torch is not installed: torch CPU tensors not testable here")
try:
    import ml_dtypes  # noqa: F401
    HAVE_ML_DTYPES = True
except ImportError:
    HAVE_ML_DTYPES = False


def _torch_ops(comm):
    r = comm.rank
    t = torch.full((2, 3), float(r + 1))
    same = comm.all_reduce(t, t) is t                                   # in place: the caller's tensor
    y = comm.all_reduce(torch.ones(2, 2, dtype=torch.int64), op="max")
    g = comm.all_gather(torch.tensor([r], dtype=torch.int32))
    a = comm.all_to_all(torch.arange(4, dtype=torch.float64) + 10 * r, send_counts=[1, 3] if r == 0 else [2, 2],
                        recv_counts=[1, 2] if r == 0 else [3, 2])
    got = {"same": same, "t": t.tolist(), "y": (type(y).__name__, tuple(y.shape), y.tolist()), "g": g.tolist(),
           "a": a.tolist()}
    try:
        bf = comm.all_reduce(torch.full((3,), 1.5, dtype=torch.bfloat16))
        got["bf"] = (str(bf.dtype), bf.tolist())
    except slicetrace.UsageError as e:                 # no ml_dtypes
        got["bf"] = str(e)
    errs = []
    for bad in (torch.ones(3, requires_grad=True), torch.ones(6)[::2]):
        try:
            comm.all_reduce(bad)
        except slicetrace.UsageError as e:
            errs.append(str(e))
    got["errs"] = errs
    got["tensor"] = y            # a tensor back to the launcher (torch's pipe pickling sent a dead shm handle)
    return got


def test_torch_cpu_tensors_on_the_cpu_backend():
    res = slicetrace.launch(_torch_ops, 2, timeout_s=30.0, join_timeout_s=120)
    for r, got in enumerate(res):
        assert got["same"] and got["t"] == [[3.0] * 3] * 2
        assert got["y"] == ("Tensor", (2, 2), [[1, 1], [1, 1]])
        assert type(got["tensor"]) is torch.Tensor and got["tensor"].tolist() == [[1, 1], [1, 1]]
        assert got["g"] == [0, 1]
        assert got["bf"] == (("torch.bfloat16", [3.0] * 3) if HAVE_ML_DTYPES else
                             "x is a torch bfloat16 tensor; backend='cpu' needs the ml_dtypes package for bfloat16 "
                             "(pip install ml_dtypes)")
        assert got["a"] == ([0.0, 10.0, 11.0] if r == 0 else [1.0, 2.0, 3.0, 12.0, 13.0])
        assert got["errs"] == ["x is a torch tensor that requires grad; pass x.detach() (the collectives write "
                               "outside autograd)",
                               "x is a non-contiguous torch tensor (strides (2,)); pass x.contiguous() (an "
                               "output, or x in place: then copy the results back from it)"]


def test_torch_tensors_the_cpu_backend_cannot_use_are_refused():
    with slicetrace.init(backend="null") as comm:
        out = torch.zeros(4)[::2]
        with pytest.raises(slicetrace.UsageError, match=r"out is a non-contiguous torch tensor \(strides \(2,\)\); "
                                                        r"pass out.contiguous\(\) \(an output, or x in place: then "
                                                        r"copy the results back from it\)"):
            comm.all_reduce(torch.ones(2), out)
        for bad, msg in ((torch.ones(2, dtype=torch.float8_e4m3fn), r"x dtype float8_e4m3fn is not one of"),
                         (torch.ones(2, dtype=torch.complex64), r"x dtype complex64 is not one of"),
                         (torch.ones(2).to_sparse(), r"x is a torch tensor of layout torch.sparse_coo; pass "
                                                     r"x.to_dense\(\)"),
                         (torch._neg_view(torch.ones(2)), r"x is a torch view with its neg bit set \(its memory "
                                                          r"holds the values before that operation\); pass "
                                                          r"x.resolve_neg\(\)"),   # read un-negated before
                         (torch.Size([4]), r"x must be a numpy.ndarray, a torch CPU tensor or a host array with "
                                           r"__dlpack__ for backend='null', got torch.Size")):
            with pytest.raises(slicetrace.UsageError, match=msg):
                comm.all_reduce(bad)

        class Mine(torch.Tensor):               # a user's subclass is a tensor too
            pass
        got = comm.all_reduce(torch.arange(3.0).as_subclass(Mine))
        assert isinstance(got, torch.Tensor) and got.tolist() == [0.0, 1.0, 2.0]
        if torch.cuda.is_available():
            with pytest.raises(slicetrace.UsageError, match="x is a torch tensor on cuda:0; backend='null' takes "
                                                            "CPU tensors or numpy arrays"):
                comm.all_reduce(torch.ones(2, device="cuda"))
        x = torch.arange(4, dtype=torch.float16)
        got = comm.reduce_scatter(x)
        assert type(got) is torch.Tensor and got.dtype == torch.float16 and got.tolist() == [0.0, 1.0, 2.0, 3.0]


def _torch_reduce_ops(comm):
    import torch.distributed as dist
    x = torch.tensor([comm.rank + 1.0, -(comm.rank + 1.0)])
    got = {name: comm.all_reduce(x, op=getattr(dist.ReduceOp, name)).tolist()
           for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG")}
    got["reduce"] = comm.reduce(x, root=0, op=dist.ReduceOp.MAX)
    try:
        comm.all_reduce(x, op=dist.ReduceOp.BAND)
    except slicetrace.UsageError as e:
        got["band"] = str(e)
    return got


def test_torch_reduce_ops_are_taken_as_the_reduction_of_their_name():
    """A training script passes torch.distributed.ReduceOp.SUM, ...: they were refused ('not one of ...')."""
    res = slicetrace.launch(_torch_reduce_ops, 3, timeout_s=30.0, join_timeout_s=120)
    for r, got in enumerate(res):
        assert got["SUM"] == [6.0, -6.0] and got["PRODUCT"] == [6.0, -6.0]
        assert got["MIN"] == [1.0, -3.0] and got["MAX"] == [3.0, -1.0] and got["AVG"] == [2.0, -2.0]
        assert (got["reduce"].tolist() == [3.0, -1.0]) if r == 0 else got["reduce"] is None
        assert got["band"] == ("op=<RedOpType.BAND: 5> is not one of ('sum', 'prod', 'min', 'max', 'avg'); of "
                               "torch.distributed.ReduceOp, SUM, PRODUCT, MIN, MAX, AVG are taken (a ReduceOp made "
                               "by a call, as for PREMUL_SUM, is not)")
