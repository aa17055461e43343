#!/usr/bin/env python3
"""Where a profiled CPU op's time goes: wall time per op of begin_op, submit and the inline drain poll, for
all_reduce on the cpu backend, profiled and not (--steps-delta: all events against all but KernelStep),
alternating blocks (2 ranks by default).

    PYTHONPATH=src python scripts/cpu_stage_timers.py [--bytes 4M] [--ops 300] [--ranks 2] [--steps-delta] [--rounds 2]
        [--drain-stages]

--drain-stages also times the inline poll's parts (publish, drain gather, delivery, the host's KernelStep runs, the plugin
and its fold into chunks).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import slicetrace
from slicetrace.backend.cpu import stamper as cpu_stamper
from slicetrace.cli import sweep
from slicetrace.cli.bench import _NO_STEPS
from slicetrace.events import host as ev_host
from slicetrace.events import plugin as ev_plugin
from slicetrace.events import runs as ev_runs
from slicetrace.sinks import chrome_store
from slicetrace.stamps import drain as st_drain

_DRAIN_STAGES = ((st_drain.Drain, "_drain_many"), (st_drain.Drain, "_deliver"), (st_drain, "pair_channels"),
                 (ev_host.EventHost, "batch"), (ev_host.EventHost, "_steps_runs"),
                 (ev_host.EventHost, "_channel_runs"), (ev_runs, "to_kernel_steps"),
                 (ev_plugin.LoadedPlugin, "kernel_step_runs"), (cpu_stamper.FastRingWriter, "publish"),
                 (chrome_store.Ctx, "fold"))


def parse_size(s: str) -> int:
    return sweep.parse_size(s, "size")


def body(comm, nbytes: int, nops: int, steps_delta: bool = False, rounds: int = 2,
         drain_stages: bool = False) -> list[str]:
    pc = time.perf_counter
    acc: dict[str, float] = {}
    sess = comm._session
    inner = _DRAIN_STAGES if drain_stages else ()     # nested in _inline_poll: not subtracted from "rest"
    for obj, name in ((sess.host, "begin_op"), (sess.backend, "submit"), (sess, "_inline_poll")) + inner:
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
    a, b = ("nosteps", True) if steps_delta else (False, True)
    per: dict = {a: [], b: []}                  # per block: {stage: us per op}
    for rnd in range(rounds):
        for prof in ((a, b) if rnd % 2 == 0 else (b, a)):
            with comm.profiling(bool(prof), _NO_STEPS if prof == "nosteps" else None):
                acc.clear()
                comm.barrier()
                t = pc()
                for _ in range(nops):
                    comm.all_reduce(x, out)
                comm.flush_profiler()
                total = (pc() - t) / nops * 1e6
            row = {k: v / nops * 1e6 for k, v in acc.items()}
            row["rest"] = total - sum(v for k, v in row.items() if k in ("begin_op", "submit", "_inline_poll"))
            row["total"] = total
            per[prof].append(row)
    for prof in (a, b):
        keys = sorted(set().union(*per[prof]))
        med = {k: statistics.median(r.get(k, 0.0) for r in per[prof]) for k in keys}
        stages = ", ".join(f"{k} {med[k]:.1f}" for k in keys if k != "total")
        lines.append(f"rank {comm.rank} profiled={prof}: {med['total']:.1f} us/op, median of {rounds} blocks "
                     f"({stages})")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=parse_size, default=4 << 20)
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps-delta", action="store_true", help="compare all events with all but KernelStep")
    p.add_argument("--rounds", type=int, default=2, help="blocks of each kind, alternating (medians printed)")
    p.add_argument("--drain-stages", action="store_true", help="also time the parts of the drain poll")
    a = p.parse_args()
    for lines in slicetrace.launch(body, a.ranks, a.bytes, a.ops, a.steps_delta, a.rounds, a.drain_stages,
                                   backend="cpu", profiler_plugin="example"):
        print("\n".join(lines))


if __name__ == "__main__":
    main()
