#!/usr/bin/env python3
"""The host side of profiling alone, for cachegrind: drain poll, event host, example plugin (trace written or not),
with the rings written by numpy once per poll (a 1-channel all_reduce's records per op: KernelCh start, --slices
KernelSteps as recv/send pairs, KernelCh stop), so that, unlike scripts/bench_event_path.py, no per-op Python
stamping is in the count. Instructions per op = (Ir at --ops 1536 - Ir at --ops 512) / 1024; --slices 0 for the
same ops without KernelStep records (their difference: KernelStep's host-side share).

    PYTHONPATH=src OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 setarch -R valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/tmp/hp.%p python scripts/cg_host_path.py --ops 512 --slices 8
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from slicetrace.config import Settings
from slicetrace.events.abi import CommInfo
from slicetrace.events.host import EventHost, OpInfo, TaskInfo
from slicetrace.events.loading import load_plugins
from slicetrace.stamps.drain import Drain
from slicetrace.stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP, RingViews, ring_bytes

SLOTS = 16384


def poll_records(ops: int, slices: int) -> np.ndarray:
    """(ops * (slices + 2), 6) ring entry words of `ops` ops from tag 0 and clock 0 (the seq word 0): add a poll's
    first tag to word 4 and its clock to words 1..3."""
    per = slices + 2
    k = np.arange(per)
    kind = np.where((k == 0) | (k == per - 1), KIND_CHANNEL, KIND_STEP).astype(np.uint64)
    flags = np.where(k == per - 1, FLAG_CH_STOP, np.where((k > 0) & (k % 2 == 0), FLAG_SEND, 0)).astype(np.uint64)
    step = np.where(kind == KIND_STEP, (k - 1) // 2 * 2, 0).astype(np.uint64)
    size = np.where(kind == KIND_STEP, 65536, 0).astype(np.uint64)
    w5 = size | np.uint64(1) << np.uint64(32) | kind << np.uint64(48) | flags << np.uint64(56)
    t = np.arange(ops * per, dtype=np.uint64).reshape(ops, per) * np.uint64(3000)
    out = np.zeros((ops, per, 6), np.uint64)
    out[:, :, 1], out[:, :, 2] = t, t + np.uint64(10) * (kind == KIND_STEP)
    out[:, :, 3] = out[:, :, 2] + np.uint64(40) * (kind == KIND_STEP)
    out[:, :, 4] = np.arange(ops, dtype=np.uint64)[:, None] | step[None, :] << np.uint64(32)
    out[:, :, 5] = w5[None, :]
    return out.reshape(-1, 6)


class DrainOnly:
    """The drain's consumer that takes every poll's records and does nothing with them (--drain-only)."""

    def batch(self, recs: np.ndarray, runs: list) -> None:
        pass

    def end_ops(self, tags: list, ts_ns: int) -> None:
        pass

    def drop(self, reason: str, n: int = 1) -> None:
        raise AssertionError(f"{n} record(s) dropped: {reason}")

    def begin_op(self, info: OpInfo) -> None:
        pass

    def op_mask(self) -> int:
        return 0

    def close(self) -> None:
        pass


def run(a: argparse.Namespace, dump: str | None) -> None:
    if a.plugin == "inspector":     # it always writes, <host>-pid<pid>.log in the run's folder
        s = Settings(inspector_dump_dir=os.path.dirname(dump))
    elif a.plugin == "flightrec":   # a healthy run: it keeps the last ops and writes nothing
        s = Settings(flightrec_file=dump) if dump else Settings()
    else:
        s = Settings(profile_dump_file=dump) if dump else Settings()
    host = DrainOnly() if a.drain_only else EventHost(load_plugins(a.plugin, s), CommInfo(1, "x", 1, 2, 0), 16)
    v = RingViews(bytearray(ring_bytes(1, SLOTS)), 1, SLOTS)
    d = Drain(v, host)
    st = v.started.view(np.uint64).reshape(SLOTS, 6)
    co = v.completed.view(np.uint64).reshape(SLOTS, 6)
    hdr = v.header.view(np.uint64).reshape(1, 8)
    tag, clock = 0, time.monotonic_ns
    base = poll_records(a.batch, a.slices)
    recs = base.copy()
    for _ in range(a.ops // a.batch):
        np.add(base[:, 1:4], np.uint64(clock()), out=recs[:, 1:4])
        np.add(base[:, 4], np.uint64(tag + 1), out=recs[:, 4])
        for _ in range(a.batch):
            tag += 1
            host.begin_op(OpInfo(tag=tag, func="all_reduce", seq_number=tag, mask=host.op_mask(), ts_ns=clock(),
                                 tasks=[TaskInfo(func="AllReduce", count=262144, n_programs=1)]))
            d.expect(tag, True, True)
        first, n = int(hdr[0, 0]) + 1, 0
        while n < len(recs):                       # at most two pieces: the ring's end
            i = (first + n) & (SLOTS - 1)
            k = min(len(recs) - n, SLOTS - i)
            for ring in (st, co):
                ring[i:i + k, 1:] = recs[n:n + k, 1:]
                ring[i:i + k, 0] = np.arange(first + n, first + n + k, dtype=np.uint64)
            n += k
        hdr[0, 0] = first + len(recs) - 1
        snap = v.header["reserved"].copy()
        for t in range(tag - a.batch + 1, tag + 1):
            d.op_submitted(t, lambda: True, snap)
        d.poll_once()
    host.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=512)
    p.add_argument("--batch", type=int, default=32, help="ops per drain poll (the cpu session's inline drain: 32)")
    p.add_argument("--slices", type=int, default=8, help="KernelSteps per op (rank 0 of a 1 MiB all_reduce: 8)")
    p.add_argument("--no-trace", action="store_true", help="no dump file: the plugin counts its records (no writer)")
    p.add_argument("--plugin", default="example", choices=("example", "inspector", "linkstats", "flightrec"),
                   help="the built-in plugin fed (inspector: Coll and KernelCh only, so give --slices 0)")
    p.add_argument("--drain-only", action="store_true", help="the drain alone: its consumer takes records and drops them")
    a = p.parse_args()
    a.no_trace |= a.drain_only
    if a.plugin == "inspector" and a.no_trace:
        p.error("--plugin inspector always writes its file: no --no-trace / --drain-only")
    with tempfile.TemporaryDirectory() as tmp:
        run(a, None if a.no_trace else os.path.join(tmp, "t"))
        if not a.no_trace:
            print("trace bytes:", sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)))


if __name__ == "__main__":
    main()
