#!/usr/bin/env python3
"""A 2-rank CUDA all_reduce loop for a fixed time, rank 0's clock deciding when to stop; prints ops and counters,
or the error (with the library's timeout set short, its own progress report instead of a kill).

    PYTHONPATH=src python3 scripts/gpu_loop_probe.py [--bytes 1M] [--seconds 10] [--timeout 20] [--plugin example|none]
"""
from __future__ import annotations

import argparse
import time

import slicetrace
from slicetrace.cli import sweep

from gpu_trace_check import loop      # scripts/ is on sys.path when this runs as a script


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=lambda s: sweep.parse_size(s, "bytes"), default=1 << 20)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--plugin", default="example")
    a = p.parse_args()
    t = time.monotonic()
    try:
        res = slicetrace.launch(loop, 2, a.bytes, a.seconds, backend="cuda", profiler_plugin=a.plugin,
                                timeout_s=a.timeout)
        print(f"ok in {time.monotonic() - t:.1f}s: {res}", flush=True)
    except Exception as e:
        print(f"FAILED after {time.monotonic() - t:.1f}s: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
