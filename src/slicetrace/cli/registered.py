"""bench -R 1 (nccl-tests' local registration): the sweep's buffers come from Comm.mem_alloc, the cpu backend's
registered memory, so ring collectives move slices directly between the ranks' buffers (backend/cpu/pool.py);
-R 2 (symmetric registration): they are symmetric windows, so all_reduce, all_gather and reduce_scatter run the
symmetric kernels (plan/symmetric.py)."""
from __future__ import annotations

import numpy as np


class Registered:
    """bench's array maker over the registered pool. Each sweep step makes its input first (to_dev): the buffers
    of the step before are freed then, so the pool holds one step's buffers (main.py sizes it for the largest)."""

    def __init__(self, comm, symmetric: bool = False):
        self.comm, self.held, self.symmetric = comm, [], symmetric

    def to_dev(self, a: np.ndarray) -> np.ndarray:
        for b in self.held:
            self.comm.mem_free(b)
        self.held.clear()
        b = self.empty(a.shape, a.dtype)
        b[...] = a
        return b

    def empty(self, shape, dtype) -> np.ndarray:
        b = self.comm.mem_alloc(shape, dtype, symmetric=self.symmetric)
        self.held.append(b)
        return b

    @staticmethod
    def zeros(shape, dtype) -> np.ndarray:      # bench's 1-element meeting buffer: no need to register it
        return np.zeros(shape, dtype)
