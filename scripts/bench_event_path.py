"""Per-op cost of the profiled event path, in process: begin_op + stamping + drain + host + chrome plugin.

A realistic 1-channel all_reduce: KernelCh start, `--slices` send/recv KernelStep pairs, KernelCh stop,
staged with the cpu backend's FastRingWriter and published by the drain's fetch step; the drain polls once per
`--batch` ops. Prints us per op per stage.
--gpu writes the records the way the cuda backend does instead (ranges reserved per op, whole entries with
provisional seq words, numpy-vectorised so that "stamping" stands for the kernel's share).

    PYTHONPATH=src python scripts/bench_event_path.py [--ops 2000] [--batch 10] [--slices 10] [--channels 1] [--gpu] [--trace]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from slicetrace.backend.cpu.stamper import FastRingWriter, tail
from slicetrace.config import Settings
from slicetrace.events.abi import CommInfo
from slicetrace.events.host import EventHost, OpInfo, TaskInfo
from slicetrace.events.loading import load_plugins
from slicetrace.stamps.drain import Drain
from slicetrace.stamps.layout import (FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP, RingViews, provisional_word,
                                      ring_bytes)


class GpuLikeWriter:
    """Every channel's records of one op at once, as the cuda kernel leaves them: whole entries in one ring per
    channel (a merged RingViews, the cuda backend's host mirror)."""

    def __init__(self, v: RingViews, slices: int):
        self.v, self.n = v, slices + 2
        self.ring = v.completed.view("<u8").reshape(v.nchannels, v.slots, 6)
        self.hdr = v.header.view("<u8").reshape(v.nchannels, 8)
        k = np.arange(self.n)
        self.kind = np.where(k < 2, KIND_CHANNEL, 0).astype(np.uint64)
        self.flags = np.where(k == 1, FLAG_CH_STOP, np.where(k % 2 == 1, FLAG_SEND, 0)).astype(np.uint64)
        self.step = np.where(k < 2, 0, (k - 2) // 2 * 2).astype(np.uint64)
        self.size = np.where(k < 2, 0, 65536).astype(np.uint64)

    def op(self, tag: int, t0: int) -> None:
        nch, n, S = self.v.nchannels, self.n, self.v.slots
        base = self.hdr[:, 0].astype(np.int64) + 1
        seq = base[:, None] + np.arange(n)[None, :]
        idx = seq & (S - 1)
        t = np.uint64(t0) + np.arange(n, dtype=np.uint64) * np.uint64(50)
        i0 = np.uint64(tag) | (self.step << np.uint64(32))
        i1 = self.size | (np.uint64(1) << np.uint64(32)) | (self.kind << np.uint64(48)) | (self.flags << np.uint64(56))
        word = (np.uint64(provisional_word(0, tag)) | (seq.astype(np.uint64) & np.uint64(0xFFFFFFFF)))
        ch = np.arange(nch)[:, None]
        ring = self.ring
        for j, c in enumerate((word, t, t + np.uint64(10), t + np.uint64(40), i0, i1)):
            ring[ch, idx, j] = c
        self.hdr[:, 0] = base + n - 1


def run(args, dump: str | None) -> dict[str, float]:
    s = Settings(profile_dump_file=dump) if dump else Settings()
    host = EventHost(load_plugins("example", s), CommInfo(1, "x", 1, 2, 0), 16)
    nch = args.channels
    merged = bool(args.gpu)
    v = RingViews(bytearray(ring_bytes(nch, 16384, merged)), nch, 16384, merged)
    ws = [FastRingWriter(v, c) for c in range(nch)]
    d = Drain(v, host, fetch=None if args.gpu else lambda lo, hi: [w.publish() for w in ws])
    gw = GpuLikeWriter(v, args.slices) if args.gpu else None
    clock = time.monotonic_ns
    t_begin = t_stamp = t_drain = 0.0
    pc = time.perf_counter
    tag = 0
    for _ in range(args.ops // args.batch):
        for _ in range(args.batch):
            tag += 1
            a = pc()
            info = OpInfo(tag=tag, func="all_reduce", tasks=[TaskInfo(func="AllReduce", count=262144, n_programs=nch)],
                          seq_number=tag, mask=host.op_mask(), ts_ns=clock())
            host.begin_op(info)
            d.expect(tag)
            b = pc()
            for w in ws if gw is None else ():
                t = clock()
                recs = [t, t, t, tag, 0, tail(0, KIND_CHANNEL, 0)]
                for k in range(args.slices // 2):
                    t = clock()
                    recs += (t, t + 10, t + 50, tag, 2 * k, 65536 | tail(1, KIND_STEP, 0),
                             t + 10, t + 10, t + 50, tag, 2 * k, 65536 | tail(1, KIND_STEP, FLAG_SEND))
                t = clock()
                recs += (t, t, t, tag, 0, tail(0, KIND_CHANNEL, FLAG_CH_STOP))
                w.stage(recs)
            if gw is not None:
                gw.op(tag, clock())
            c = pc()
            d.op_submitted(tag, lambda: True, v.header["reserved"].copy())
            t_begin += b - a + pc() - c
            t_stamp += c - b
        a = pc()
        d.poll_once()
        t_drain += pc() - a
    host.close()
    n = args.ops
    return {"begin_op": t_begin / n * 1e6, "stamping": t_stamp / n * 1e6, "drain+host+plugin": t_drain / n * 1e6,
            "total": (t_begin + t_stamp + t_drain) / n * 1e6}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--slices", type=int, default=10, help="KernelStep records per op and channel")
    p.add_argument("--channels", type=int, default=1, help="channels per op (the cuda backend uses up to 64)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--gpu", action="store_true", help="records as the cuda backend writes them")
    p.add_argument("--trace", action="store_true", help="write a trace file (else events are counted only)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args, None)                                     # warm up
        res = [run(args, f"{tmp}/t{i}" if args.trace else None) for i in range(args.reps)]
    print(f"us per op (median of {args.reps}; {args.batch} ops per poll, {args.slices} KernelSteps per op and channel, {args.channels} channel(s), "
          f"trace={'on' if args.trace else 'off'})")
    for k in res[0]:
        print(f"  {k:>18}: {statistics.median(r[k] for r in res):7.2f}")


if __name__ == "__main__":
    main()
