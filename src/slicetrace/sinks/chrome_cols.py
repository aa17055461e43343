"""The example plugin's column chunks of KernelSteps and the byte-level helpers its buffers and writes use."""
from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from ..events.abi import KERNEL_STEP_DTYPE


def write_all(f: Any, data: Any) -> None:
    mv = memoryview(data).cast("B")
    while mv:                             # a raw file may take part of it
        mv = mv[f.write(mv):]


def per_row(ids: list, lens: list) -> tuple[np.ndarray, np.ndarray]:
    """(pid, seq) per run and run lengths -> pid and seq per row (flat ints: np.array over the tuples ~2x slower)."""
    a = np.repeat(np.fromiter(chain.from_iterable(ids), np.int64, 2 * len(ids)).reshape(-1, 2), lens, axis=0)
    return a[:, 0], a[:, 1]


def concat_records(batches: list[np.ndarray], dtype: np.dtype) -> tuple[np.ndarray, list[int]]:
    """Record batches joined as bytes (concatenating structured arrays promotes their dtypes pairwise, slowly,
    in Python), and each batch's length."""
    recs = np.concatenate([byte_rows(b) for b in batches]).view(dtype)
    return recs, [len(b) for b in batches]


def byte_rows(recs: np.ndarray) -> np.ndarray:
    """A 1-D record array, strided (a drain poll's KernelSteps) or not, viewed as plain itemsize-byte items:
    copies of it move each row's bytes in one loop, where numpy copies structured items field by field (4x
    slower) and an (n, itemsize) byte view row by row, a call each."""
    return recs.view(np.dtype((np.void, recs.dtype.itemsize)))


class Chunk:
    __slots__ = ("steps", "rows", "pid", "seq", "fill")

    def __init__(self, rows: int):
        self.steps = np.empty(rows, KERNEL_STEP_DTYPE)
        self.rows = byte_rows(self.steps)
        self.pid = np.empty(rows, np.int64)
        self.seq = np.empty(rows, np.int64)
        self.fill = 0
