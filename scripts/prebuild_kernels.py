#!/usr/bin/env python3
"""Compile every CUDA kernel variant with NVRTC for an architecture, without a GPU, into a cache folder.

A compile check on a machine with no GPU, and a warm cache to carry to the GPU machine (used there when its
NVRTC/CuPy toolchain matches this one; otherwise it compiles as usual).

    PYTHONPATH=src python scripts/prebuild_kernels.py [--arch sm_90] [--cache-dir DIR]

The cache folder defaults to the one the library reads (SLICETRACE_CACHE_DIR, else ~/.cache/slicetrace).
"""
from __future__ import annotations

import argparse
import time

from slicetrace.backend.base import DTYPES
from slicetrace.backend.cuda.backend import CTYPES
from slicetrace.backend.cuda.compile import Kernels, toolchain
from slicetrace.config import Settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--cache-dir", default=Settings.from_env().cache_dir,
                   help="default: the library's cache folder (SLICETRACE_CACHE_DIR, else ~/.cache/slicetrace)")
    p.add_argument("--defines", default="", help="extra K=V,K=V for a measurement variant (bench_cuda --variants)")
    a = p.parse_args()
    extra = dict(d.split("=", 1) for d in a.defines.split(",") if d)
    jobs = [("slicetrace.cu", {"ST_T": CTYPES[d], "ST_STEPS": s, **extra}) for d in DTYPES if d in CTYPES for s in "01"]
    t = time.perf_counter()
    try:
        Kernels(a.cache_dir, a.arch).prepare(jobs + [("clock.cu", {})])
    except ImportError as e:            # NVRTC comes with CuPy: no GPU needed, the package is
        raise SystemExit(f"prebuild_kernels: needs CuPy (NVRTC): pip install -e '.[cuda]' ({e})") from None
    print(f"{len(jobs) + 1} kernels for {a.arch} ({toolchain()}) in {time.perf_counter() - t:.1f} s -> {a.cache_dir}")


if __name__ == "__main__":
    main()
