#!/usr/bin/env python3
"""The Chrome writer's KernelStep block formatter alone, for cachegrind: --blocks blocks of 16,384 rows shaped like
a cpu run's (one channel's two directions, host-clock ns from about an hour of uptime over ~0.3 s, ids from a
file's id base). Instructions per row = (Ir at --blocks 40 - Ir at --blocks 10) / (30 * 16384).

    PYTHONPATH=src OPENBLAS_NUM_THREADS=1 setarch -R valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/dev/null python scripts/cg_format_rows.py --blocks 10
"""
from __future__ import annotations

import argparse

import numpy as np

from slicetrace.sinks.chrome_text import STEP_LINE, RowFormat, id_base

ROWS = 16384


def block(rng: np.random.Generator) -> np.ndarray:
    n = ROWS
    wait = np.sort(rng.integers(3_600_000_000_000, 3_600_300_000_000, n))
    dur = rng.integers(2_000, 90_000, n)
    snd = np.arange(n) % 2
    w_us, d_us = wait // 1000, dur // 1000
    pid = id_base(12345, 0) + 3 * (np.arange(n) // 8)
    return np.column_stack([np.full(n, 77, np.int64), 1_000_000 + snd * 65536 + 1, w_us, wait - w_us * 1000, d_us,
                            dur - d_us * 1000, np.zeros(n, np.int64), snd, np.ones(n, np.int64), np.arange(n) % 16,
                            np.full(n, 262144), wait, wait + dur // 3, wait + dur, np.arange(n) // 8, pid])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=10)
    a = p.parse_args()
    fmt, rng = RowFormat(STEP_LINE), np.random.default_rng(0)
    cols = block(rng)
    n = 0
    for _ in range(a.blocks):
        n += len(bytes(fmt(cols)))
    print(n)


if __name__ == "__main__":
    main()
