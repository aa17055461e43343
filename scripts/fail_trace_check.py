#!/usr/bin/env python3
"""Traces of a failed run stay valid: a 2-rank job (either backend) loops all_reduce with the example and flightrec
plugins until rank 1 is SIGKILLed by a timer mid-loop; rank 0's example trace and flight record must pass
check_trace (the killed op's channels that never ended included) and name the failure.

    PYTHONPATH=src python scripts/fail_trace_check.py OUTDIR [--backend cuda] [--trials 3] [--nchannels 2]

Prints one line per trial (the failed op, its channels with and without a KernelCh, the problems found) and exits 1
when any trace has a problem or no failure was recorded.
"""
from __future__ import annotations

import argparse
import glob
import os
import signal
import sys
import threading

import numpy as np

import slicetrace
from slicetrace.analyze import check_trace
from slicetrace.analyze.records import read_records
from slicetrace.analyze.trace import counters


# the counters that say records were not delivered (the rest count deliveries and choices)
LOSS = ("overrun", "unpaired", "unwritten", "no_parent", "missing_kernel_ch", "undrained", "parent_dropped",
        "pool_full", "plugin_disabled", "aborted")


def killed_mid(comm, delay: float, backend: str) -> None:
    if backend == "cuda":
        import cupy as xp
    else:
        xp = np
    x = xp.ones(1 << 18, xp.float32)
    if comm.rank == 1:
        threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    for _ in range(10 ** 6):
        comm.all_reduce(x, x)


def failed_op(path: str) -> tuple[str, list[int], list[int]] | None:
    """(op, channels with a KernelCh, channels with KernelSteps only) of the op the ERROR instant names."""
    recs = read_records(path)
    errs = [r["args"] for r in recs if r.get("ph") == "i" and r.get("cat") == "ERROR"]
    if not errs or errs[0].get("SeqNum") is None:
        return None
    op, seq = errs[0].get("Op"), errs[0]["SeqNum"]
    ids = {r["id"] for r in recs if r.get("ph") == "b" and r.get("cat") == "COLL" and r.get("name") == op
           and (r.get("args") or {}).get("SeqNum") == seq}
    kch = {r["args"]["Channel"] for r in recs if r.get("name") == "KernelCh" and r.get("ph") == "b"
           and r["args"].get("ParentId") in ids}
    steps = {r["args"]["Channel"] for r in recs if r.get("name") == "KernelStep" and r["args"].get("ParentId") in ids}
    return f"{op} #{seq}", sorted(kch), sorted(steps - kch)


def delivery(path: str) -> str:
    """Which Coll ops the trace holds, and which of them have KernelSteps / KernelCh records (by SeqNum)."""
    recs = read_records(path)
    seq_of = {r["id"]: (r.get("args") or {}).get("SeqNum") for r in recs if r.get("ph") == "b"
              and r.get("cat") == "COLL"}
    with_steps = {seq_of.get((r.get("args") or {}).get("ParentId")) for r in recs if r.get("name") == "KernelStep"}
    with_ch = {seq_of.get((r.get("args") or {}).get("ParentId")) for r in recs if r.get("name") == "KernelCh"
               and r.get("ph") == "b"}

    def span(xs):
        xs = sorted(x for x in xs if x is not None)
        return f"{len(xs)} [{xs[0]}..{xs[-1]}]" if xs else "0"
    got = {k: v for c in counters(recs).values() for k, v in c.items() if k.startswith("delivered") or k in LOSS}
    return (f"Coll ops {span(seq_of.values())}, with KernelSteps {span(with_steps)}, with KernelCh "
            f"{span(with_ch)}; counters {got}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--nchannels", type=int, default=2)
    p.add_argument("--delay", type=float, default=0.5, help="seconds into the loop rank 1 is killed")
    p.add_argument("--detail", action="store_true", help="also print, per trace, which ops delivered KernelSteps and "
                                                          "KernelCh records, and the delivery counters")
    a = p.parse_args()
    bad = 0
    for k in range(a.trials):
        pre = os.path.join(a.out, f"t{k}")
        try:
            slicetrace.launch(killed_mid, 2, a.delay, a.backend, backend=a.backend, nchannels=a.nchannels,
                              profiler_plugin="example,flightrec", profile_dump_file=pre + "_trace",
                              flightrec_file=pre + "_rec", timeout_s=10, join_timeout_s=120)
            print(f"trial {k}: the job did not fail")
            bad += 1
            continue
        except slicetrace.LaunchError as e:
            first = str(e).splitlines()[0]
        for f in sorted(glob.glob(pre + "_trace_*_0.json") + glob.glob(pre + "_rec_*_0.json")):
            probs, op = check_trace(f), failed_op(f)
            bad += bool(probs) + (op is None)
            lost = {k: v for c in counters(read_records(f)).values() for k, v in c.items() if v and k in LOSS}
            print(f"trial {k}: {os.path.basename(f)}: failed op {op and op[0]}, KernelCh on {op and op[1]}, "
                  f"steps without one on {op and op[2]}; {len(probs)} problem(s) {probs[:2]}; counted {lost}")
            if a.detail:
                print(f"trial {k}: {os.path.basename(f)}: {delivery(f)}")
        print(f"trial {k}: launch error: {first[:160]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
