#!/usr/bin/env python3
"""Does a tiny in-place broadcast after many all_reduces always deliver the root's value? 2 ranks, CUDA.
Each round: 20 all_reduce of --bytes, then broadcast of one int32 whose value differs per rank and round.

    PYTHONPATH=src python3 scripts/gpu_bcast_check.py [--rounds 3000] [--bytes 1M] [--plugin example|none]
"""
from __future__ import annotations

import argparse

import slicetrace
from slicetrace.cli import sweep


def body(comm, nbytes, rounds, sync_first):
    import cupy as cp
    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    x = cp.random.standard_normal(nbytes // 4, dtype=cp.float32)
    out = cp.empty_like(x)
    go = cp.zeros(1, dtype=cp.int32)
    bad = []
    for r in range(rounds):
        for _ in range(20):
            comm.all_reduce(x, out)
        if sync_first:
            comm.synchronize()
        go.fill(r * 10 + comm.rank + 1)                # root's value: r*10 + 1
        comm.broadcast(go, go, root=0)           # in place (out=None would return a new array)
        v = int(go.get()[0])
        if v != r * 10 + 1:
            bad.append((r, v))
            if len(bad) >= 5:
                break
    comm.synchronize()
    return bad


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=lambda s: sweep.parse_size(s, "bytes"), default=1 << 20)
    p.add_argument("--rounds", type=int, default=3000)
    p.add_argument("--plugin", default="example")
    p.add_argument("--no-sync", action="store_true")
    a = p.parse_args()
    try:
        res = slicetrace.launch(body, 2, a.bytes, a.rounds, not a.no_sync, backend="cuda", profiler_plugin=a.plugin,
                                timeout_s=15)
        print(f"bad broadcasts per rank (round, value): {res}", flush=True)
    except Exception as e:
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        for k, v in getattr(e, "errors", {}).items():
            print(f"  rank {k}: {v.splitlines()[0]}")


if __name__ == "__main__":
    main()
