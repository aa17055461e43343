#!/usr/bin/env python3
"""Why an isolated profiled op costs more on the GPU than one in a run of them: per-op GPU intervals (CUDA events
between consecutive ops on the op stream) and host enqueue times, for blocks with profiling off and on, with
SLICETRACE_PROFILE_OP_SAMPLE_RATE and SLICETRACE_PROFILE_EVENT_MASK from the environment.

    NCCL_NVLS_ENABLE=0 SLICETRACE_PROFILE_OP_SAMPLE_RATE=100 PYTHONPATH=src python3 scripts/gpu_sparse_probe.py [--bytes 1M] [--ops 2000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import slicetrace
from slicetrace.cli import sweep


def body(comm, nbytes: int, nops: int, rounds: int) -> str:
    import cupy as cp
    x = cp.ones(nbytes // 4, dtype=cp.float32)
    y = cp.empty_like(x)
    k = comm.settings.op_sample_rate
    lines = []
    for rnd in range(rounds):
        for prof in ((False, True) if rnd % 2 == 0 else (True, False)):
            with comm.profiling(prof):
                for _ in range(20):
                    comm.all_reduce(x, y)
                comm.synchronize()
                comm.flush_profiler()
                comm.barrier()
                evs = [cp.cuda.Event() for _ in range(nops + 1)]
                host = np.empty(nops)
                pc = time.perf_counter
                t0 = pc()
                for i in range(nops):
                    evs[i].record()
                    t = pc()
                    comm.all_reduce(x, y)
                    host[i] = pc() - t
                evs[nops].record()
                t1 = pc()
                evs[nops].synchronize()
                t2 = pc()
                comm.flush_profiler()
                t3 = pc()
            gpu = np.array([cp.cuda.get_elapsed_time(evs[i], evs[i + 1]) for i in range(nops)]) * 1e3
            host *= 1e6
            # with profiling on, ops 0, k, 2k... of those after the warm-up are the profiled ones (sampling counts
            # every eligible op of the communicator: find them by their host time instead)
            sel = np.zeros(nops, bool)
            if prof:
                sel[np.argsort(host)[-max(1, nops // k):]] = True
            def st(a):
                return f"mean {a.mean():7.1f} med {np.median(a):6.1f} p99 {np.percentile(a, 99):7.1f} max {a.max():7.1f}"
            lines.append(f"rank {comm.rank} prof={prof}: wall {(t2 - t0) / nops * 1e6:.1f} us/op (enqueue {(t1 - t0) / nops * 1e6:.1f}, "
                         f"drain tail {(t2 - t1) * 1e3:.2f} ms, flush {(t3 - t2) * 1e3:.2f} ms)\n"
                         f"   gpu interval {st(gpu)}; host {st(host)}\n"
                         + (f"   slowest {sel.sum()} host ops: host {st(host[sel])}; gpu at them {st(gpu[sel])}; "
                            f"gpu next 5 {st(np.concatenate([gpu[i + 1:i + 6] for i in np.flatnonzero(sel)]))}\n" if prof else ""))
    return "".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", default="1M")
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    res = slicetrace.launch(body, 2, sweep.parse_size(a.bytes, "bytes"), a.ops, a.rounds, backend="cuda",
                            profiler_plugin="example")
    for r in res:
        print(r)


if __name__ == "__main__":
    main()
