#!/usr/bin/env python3
"""KernelStep's cost in long blocks of profiled all_reduces (the steady state of a training loop), per op: the
ops themselves and the drain, with and without KernelStep, alternating blocks, medians (2 ranks, cpu backend).

    PYTHONPATH=src python scripts/cpu_ks_steady.py [--bytes 1M] [--ops 100] [--rounds 30] [--inline]

Default: the inline drain polls are held back during a block and the drain runs after it (flush, timed apart),
so "ops" is what stamping costs the data path and "drain" what publishing and delivering cost. --inline keeps
the polls where they run (every 32 ops); "ops" then holds both.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import slicetrace
from slicetrace.cli import sweep
from slicetrace.cli.bench import _NO_STEPS


def body(comm, nbytes: int, nops: int, rounds: int, inline: bool) -> str:
    s = comm._session
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    poll = s._inline_poll
    res: dict = {"without": [], "KernelStep": []}
    for rnd in range(rounds):
        for mask in ((_NO_STEPS, None) if rnd % 2 == 0 else (None, _NO_STEPS)):
            with comm.profiling(True, mask):
                comm.barrier()
                if not inline:
                    s._inline_poll = lambda reserved: None
                t0 = time.perf_counter_ns()
                for _ in range(nops):
                    comm.all_reduce(x, out)
                t1 = time.perf_counter_ns()
                s._inline_poll = poll
                comm.flush_profiler()
                t2 = time.perf_counter_ns()
            res["KernelStep" if mask is None else "without"].append(((t1 - t0) / nops / 1000, (t2 - t1) / nops / 1000))
    # adjacent blocks, as bench --overhead: the host's speed drifts by more than the effect
    ratio = statistics.median((k[0] + k[1]) / (w[0] + w[1]) for w, k in zip(res["without"], res["KernelStep"]))
    d_ops = statistics.median(k[0] - w[0] for w, k in zip(res["without"], res["KernelStep"]))
    d_drain = statistics.median(k[1] - w[1] for w, k in zip(res["without"], res["KernelStep"]))
    base = statistics.median(w[0] + w[1] for w in res["without"])
    return (f"rank {comm.rank}: {base:.1f} us per op without KernelStep; KernelStep adds {(ratio - 1) * 100:.1f} % "
            f"(medians of {rounds} adjacent pairs: ops {d_ops:+.1f} us, drain {d_drain:+.2f} us)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=lambda v: sweep.parse_size(v, "bytes"), default=1 << 20)
    p.add_argument("--ops", type=int, default=100)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--inline", action="store_true", help="keep the inline drain polls inside the blocks")
    a = p.parse_args()
    for line in slicetrace.launch(body, 2, a.bytes, a.ops, a.rounds, a.inline, backend="cpu",
                                  profiler_plugin="example", ring_slots=65536):
        print(line)


if __name__ == "__main__":
    main()
