"""Benchmark the cpu backend directly (no session/drain): all_reduce latency and busbw per size.

    PYTHONPATH=src python scripts/bench_cpu_backend.py [--ranks 2 4] [--func all_reduce] [--stamps both]

busbw = bytes * 2(n-1)/n / time for all_reduce (nccl-tests factors for the others); time is the median
over repetitions of the slowest rank's mean iteration time (the machine may be shared: noisy).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from tests.helpers.procs import RankPool  # noqa: E402

from slicetrace.plan.traffic import BUSBW_FACTOR  # noqa: E402


def _bench(ctx, func, nbytes, dtype, stamps, iters, warmup, nch, reps=1):
    from slicetrace.backend.base import Work, create
    from slicetrace.config import Settings
    from slicetrace.plan.schedule import plan_collective
    st = ctx["state"]
    key = ("be", nch)
    if key not in st:
        for k in [k for k in st if isinstance(k, tuple)]:
            st.pop(k).close()
        be = create(Settings(backend="cpu", nchannels=nch, timeout_s=60), ctx["rank"], ctx["world"],
                    ctx["store"], f"{ctx['job']}b{nch}")
        st[key] = be
        st["close"] = lambda: [v.close() for k, v in st.items() if isinstance(k, tuple)]
    be = st[key]
    n, r = ctx["world"], ctx["rank"]
    it = np.dtype(dtype).itemsize
    count = max(1, nbytes // it)
    if func == "reduce_scatter":
        count //= n
    cin = count * n if func == "reduce_scatter" else count
    cout = count * n if func == "all_gather" else count
    x = np.ones(cin, dtype)
    y = np.empty(cout, dtype)
    plan = plan_collective(func, n, r, count, it, 0, nch, be.settings.step_bytes)
    work = Work(0, plan, dtype, "sum", x, y, stamp_steps=stamps, stamp_channels=stamps)
    out = []
    for _ in range(reps):
        for _ in range(warmup):           # collectives synchronise the ranks: no barrier needed
            be.submit(work)
        t0 = time.perf_counter()
        for i in range(iters):
            work.tag = i
            be.submit(work)
        out.append((time.perf_counter() - t0) / iters)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--func", default="all_reduce")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--stamps", choices=("off", "on", "both"), default="both")
    ap.add_argument("--nchannels", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0.6, help="target time per size and mode")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions; the median is printed")
    args = ap.parse_args()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.stamps]
    for n in args.ranks:
        pool = RankPool(n)
        try:
            print(f"\n# {args.func} {args.dtype}, {n} ranks, nchannels={args.nchannels}, "
                  f"{os.cpu_count()} cpus")
            print(f"{'bytes':>10} " + " ".join(f"{'us(' + ('st' if m else 'off') + ')':>10} "
                                               f"{'busbw GB/s':>10}" for m in modes)
                  + ("   stamp overhead" if len(modes) == 2 else ""))
            size = args.min_bytes
            while size <= args.max_bytes:
                row, times = [], []
                for m in modes:
                    est = max(max(pool.run(_bench, args.func, size, args.dtype, m, 3, 2, args.nchannels)))
                    iters = int(min(1000, max(3, args.seconds / args.reps / max(est, 1e-6))))
                    reps = pool.run(_bench, args.func, size, args.dtype, m, iters, 3, args.nchannels, args.reps)
                    t = float(np.median([max(ts) for ts in zip(*reps)]))   # median rep of the slowest rank
                    times.append(t)
                    bw = size * BUSBW_FACTOR[args.func](n) / t / 1e9
                    row.append(f"{t * 1e6:10.1f} {bw:10.3f}")
                extra = f"   {100 * (times[1] / times[0] - 1):+6.1f}%" if len(times) == 2 else ""
                print(f"{size:>10} " + " ".join(row) + extra, flush=True)
                size *= 4
        finally:
            pool.close()


if __name__ == "__main__":
    main()
