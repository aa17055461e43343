#!/usr/bin/env python3
"""Where a profiled CPU op's time goes: wall time per op of begin_op, submit and the inline drain poll, for
all_reduce on the cpu backend, profiled and not (--steps-delta: all events against all but KernelStep),
alternating blocks (2 ranks by default).

    PYTHONPATH=src python scripts/cpu_stage_timers.py [--bytes 4M] [--ops 300] [--ranks 2] [--steps-delta]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import slicetrace
from slicetrace.cli import sweep
from slicetrace.cli.bench import _NO_STEPS


def parse_size(s: str) -> int:
    return sweep.parse_size(s, "size")


def body(comm, nbytes: int, nops: int, steps_delta: bool = False) -> list[str]:
    pc = time.perf_counter
    acc: dict[str, float] = {}
    sess = comm._session
    for obj, name in ((sess.host, "begin_op"), (sess.backend, "submit"), (sess, "_inline_poll")):
        orig = getattr(obj, name)

        def wrap(*a, _o=orig, _n=name, **k):
            t = pc()
            try:
                return _o(*a, **k)
            finally:
                acc[_n] = acc.get(_n, 0.0) + pc() - t
        setattr(obj, name, wrap)
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    for _ in range(20):
        comm.all_reduce(x, out)
    comm.flush_profiler()
    lines = []
    modes = (False, True, False, True) if not steps_delta else ("nosteps", True, "nosteps", True)
    for prof in modes:
        with comm.profiling(bool(prof), _NO_STEPS if prof == "nosteps" else None):
            acc.clear()
            comm.barrier()
            t = pc()
            for _ in range(nops):
                comm.all_reduce(x, out)
            comm.flush_profiler()
            total = (pc() - t) / nops * 1e6
        stages = ", ".join(f"{k} {v / nops * 1e6:.1f}" for k, v in sorted(acc.items()))
        lines.append(f"rank {comm.rank} profiled={prof}: {total:.1f} us/op ({stages}; rest "
                     f"{total - sum(acc.values()) / nops * 1e6:.1f})")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=parse_size, default=4 << 20)
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps-delta", action="store_true", help="compare all events with all but KernelStep")
    a = p.parse_args()
    for lines in slicetrace.launch(body, a.ranks, a.bytes, a.ops, a.steps_delta, backend="cpu", profiler_plugin="example"):
        print("\n".join(lines))


if __name__ == "__main__":
    main()
