#!/usr/bin/env python3
"""FIFO line reclaim A/B in one run: all_reduce on the cpu backend, blocks of ops alternating auto / off / on
(the mode switched in place on every send connection, auto keeping what it learned), median us per op.

    PYTHONPATH=src python scripts/cpu_reclaim_ab.py [--sizes 256K,1M,4M,16M,64M] [--rounds 6] [--ranks 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import slicetrace
from slicetrace.cli import sweep

MODES = ("auto", "off", "on")


def set_mode(be, mode: str, saved: dict) -> None:
    for c in be.ring_send:
        p = c.reclaim
        if mode == "auto":
            if p.probe_at < 0:
                p.probe_at = saved.get(id(p), 0)
            p._set(p.best)
        else:
            if p.probe_at >= 0:
                saved[id(p)] = p.probe_at
            p.probe_at = -1
            p._set(1 if mode == "on" else 0)


def body(comm, sizes: list[int], rounds: int) -> dict:
    be, saved, out = comm._session.backend, {}, {}
    for nb in sizes:
        x = np.ones(nb // 4, np.float32)
        y = np.empty_like(x)
        nops = max(5, min(200, (64 << 20) // nb // 2))
        for _ in range(3):
            comm.all_reduce(x, y)
        res: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(rounds):
            for m in MODES[r % 3:] + MODES[:r % 3]:
                set_mode(be, m, saved)
                comm.barrier()
                t = time.perf_counter()
                for _ in range(nops):
                    comm.all_reduce(x, y)
                res[m].append((time.perf_counter() - t) / nops * 1e6)
        out[nb] = {m: statistics.median(v) for m, v in res.items()}
    set_mode(be, "auto", saved)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256K,1M,4M,16M,64M")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--ranks", type=int, default=2)
    a = p.parse_args()
    sizes = [sweep.parse_size(s, "size") for s in a.sizes.split(",")]
    res = slicetrace.launch(body, a.ranks, sizes, a.rounds, backend="cpu")
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} all_reduce float32, {a.ranks} ranks, us per op (median of "
          f"{a.rounds} blocks per mode)")
    for nb, d in res[0].items():
        print(f"{nb >> 10:8d} KiB  " + "  ".join(f"{m} {d[m]:9.1f}" for m in MODES)
              + f"   auto/off {d['auto'] / d['off']:.2f}  on/off {d['on'] / d['off']:.2f}")


if __name__ == "__main__":
    main()
