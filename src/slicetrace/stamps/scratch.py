"""Reusable buffers for the drain's per-poll temporaries.

A poll at 64 channels gathers ~70,000 ring entries into arrays of several MiB. Fresh arrays that size are fresh
pages when the allocator has handed the previous poll's memory back to the OS, and first-touch page faults were
~30 % of the drain's time (scripts/bench_event_path.py --gpu: 141-156 us per op, 102-103 with glibc never
trimming). Buffers here live as long as the drain and are only for temporaries no consumer ever sees. They
keep the largest poll's size: at most every ring entry (channels x SLICETRACE_STAMP_RING_SLOTS) x 128 B, i.e.
2.7x the rings themselves (128 MiB at 64 channels of 16,384 slots).
"""
from __future__ import annotations

import numpy as np

MIN_ROWS = 4096          # smaller arrays come from the allocator's free lists: nothing to gain


class Scratch:
    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def rows(self, name: str, n: int, dtype: np.dtype, width: int = 0) -> np.ndarray | None:
        """The first n rows (of `width` columns when width > 0) of buffer `name`, grown as needed; None below
        MIN_ROWS. The contents are whatever the last user left."""
        if n < MIN_ROWS:
            return None
        b = self._bufs.get(name)
        if b is None or len(b) < n or b.dtype != dtype:
            rows = max(n, len(b) * 3 // 2 if b is not None else 0)
            b = self._bufs[name] = np.empty((rows, width) if width else (rows,), dtype)
        return b[:n]

    def take(self, rows: np.ndarray, idx: np.ndarray, name: str) -> np.ndarray:
        """rows[idx] (a snapshot of ring entries), into buffer `name` when large."""
        buf = self.rows(name, len(idx), rows.dtype, rows.shape[1])
        return rows[idx] if buf is None else np.take(rows, idx, axis=0, out=buf, mode="clip")

    def take_run(self, rows: np.ndarray, first: int, n: int, name: str) -> np.ndarray:
        """rows[(first + arange(n)) % len(rows)] (n <= len(rows): a ring's consecutive seqs), as one or two slice
        copies: a gather by index ran numpy's subspace loop once per row."""
        out = self.rows(name, n, rows.dtype, rows.shape[1])
        if out is None:
            out = np.empty((n, rows.shape[1]), rows.dtype)
        k = min(n, len(rows) - first)
        out[:k] = rows[first:first + k]
        out[k:] = rows[:n - k]
        return out
