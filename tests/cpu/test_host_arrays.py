"""Host arrays other than numpy: anything with __dlpack__ in host memory (tested here through a wrapper, so it runs
without torch) and torch CPU tensors (skipped without torch). Results land in the caller's memory; an allocated
output is a torch tensor for torch input; what cannot be shared is refused, naming it."""
from __future__ import annotations

import numpy as np
import pytest

import slicetrace
from slicetrace.errors import UsageError
from tests.helpers.procs import RankPool


class Foreign:
    """A non-numpy array type that shares its memory through DLPack only (as a JAX or other host array does)."""

    def __init__(self, a, device=(1, 0)):
        self.a, self.device = a, device

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.device


@pytest.fixture
def comm():
    c = slicetrace.init(backend="null")
    yield c
    c.close()


def test_a_dlpack_host_array_is_used_in_place(comm):
    a = np.arange(6, dtype=np.float32)
    out = np.zeros(6, np.float32)
    assert comm.all_reduce(Foreign(a), Foreign(out)) is not None
    assert (out == a).all()                     # the null backend on one rank: out = x, through the DLPack views
    got = comm.all_gather(Foreign(a))
    assert type(got) is np.ndarray and (got == a).all()


@pytest.mark.parametrize("x,msg", [
    (Foreign(np.zeros(3), device=(2, 0)), "x lives on DLPack device type 2, not in host memory; backend='null' "
                                         "takes host arrays"),
    ([1.0, 2.0], "x must be a numpy.ndarray, a torch CPU tensor or a host array with __dlpack__ for "
                 "backend='null', got builtins.list"),
    (Foreign(np.zeros(3, np.complex64)), "x dtype complex64 is not one of"),
])
def test_what_cannot_be_shared_is_refused_naming_it(comm, x, msg):
    with pytest.raises(UsageError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        comm.all_reduce(x)


def _two_ranks(ctx):
    comm = slicetrace.init(rank=ctx["rank"], world_size=ctx["world"], store=ctx["store"], job=ctx["job"] + "h")
    try:
        r = ctx["rank"]
        x = np.full(1000, r + 1, np.int64)
        out = np.zeros(1000, np.int64)
        comm.all_reduce(Foreign(x), Foreign(out))
        y = np.full(8, r, np.float64)
        back = np.zeros(8)
        with comm.group():
            comm.send(Foreign(y), 1 - r)
            comm.recv(Foreign(back), 1 - r)
        return int((out != 3).sum()), back.tolist()
    finally:
        comm.close()


def test_dlpack_arrays_on_the_cpu_backend():
    pool = RankPool(2, timeout=120)
    try:
        res = pool.run(_two_ranks)
    finally:
        pool.close()
    assert res == [(0, [1.0] * 8), (0, [0.0] * 8)]


def test_a_read_only_dlpack_output_is_refused_before_the_op(comm):
    """Its numpy view is read-only, the object itself has no flags: it passed the check, and the op failed half
    way with a bare ValueError (on 2+ ranks: the communicator aborted for good)."""
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)
    for call in (lambda: comm.all_reduce(np.ones(4, np.float32), Foreign(ro)),
                 lambda: comm.recv(Foreign(ro), 0)):
        with pytest.raises(UsageError, match=r"^out is read-only \(flags.writeable is False\)"):
            call()
    assert (comm.all_reduce(np.ones(4, np.float32)) == 1).all()
