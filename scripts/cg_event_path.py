#!/usr/bin/env python3
"""scripts/bench_event_path.py's `run` once, trace written, for cachegrind (that script's main runs a warm-up without
a trace and then --reps timed runs). Instructions per op = (Ir at --ops 1536 - Ir at --ops 512) / 1024; --slices 0
for the same path without KernelStep records; --no-trace: the user's thread's share alone.

    PYTHONPATH=src OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 setarch -R valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/tmp/ev.%p python scripts/cg_event_path.py --ops 512 --slices 8
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_event_path import run  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=512)
    p.add_argument("--batch", type=int, default=32, help="ops per drain poll (the cpu session's inline drain: 32)")
    p.add_argument("--slices", type=int, default=8, help="KernelStep records per op (rank 0 of a 1 MiB all_reduce: 8)")
    p.add_argument("--no-trace", action="store_true", help="no dump file: the plugin counts its records (no writer)")
    a = p.parse_args()
    a.channels, a.gpu = 1, False
    with tempfile.TemporaryDirectory() as tmp:
        run(a, None if a.no_trace else os.path.join(tmp, "t"))
        print("trace bytes:", sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)))


if __name__ == "__main__":
    main()
