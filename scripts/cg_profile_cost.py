#!/usr/bin/env python3
"""Profiling's CPU instructions per op on the cpu backend, read with cachegrind: rank 0 of a real 2-rank job
(API, session, inline drain, event host, plugin) runs in this process, rank 1 in a plain child process (valgrind
does not follow it), both waiting by futex so the slow rank 0 is not raced by a spinning peer, FIFO reclaim off (its
"auto" is timed). Polls every 32 ops (as natively: under valgrind the 20 ms poll timer would fire every op or two).

    PYTHONPATH=src OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 setarch -R valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/tmp/cg.%p python scripts/cg_profile_cost.py --ops 512 --mask 0x10046

(the variables before valgrind: it does not follow an `env` it runs into python)

Per op = (Ir at --ops 1536 - Ir at --ops 512) / 1024; --mask none runs unprofiled, --mask 0x46 without KernelStep.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

import slicetrace
from slicetrace.rendezvous import Store


class FileStore(Store):
    """A store of one file per key in a folder: enough for two processes on one host."""

    def __init__(self, root: str):
        self.root = root

    def _p(self, key: str) -> str:
        return os.path.join(self.root, key.replace("/", "%"))

    def set(self, key: str, value: bytes) -> None:
        tmp = self._p(key) + ".tmp%d" % os.getpid()
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, self._p(key))

    def try_get(self, key: str) -> bytes | None:
        try:
            with open(self._p(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def claim(self, key: str, value: bytes) -> bytes:
        try:
            fd = os.open(self._p(key) + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return self.get(key, 60.0)
        os.close(fd)
        self.set(key, value)
        return value

    def delete(self, key: str) -> None:
        for p in (self._p(key), self._p(key) + ".claim"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def body(rank: int, a: argparse.Namespace) -> None:
    prof = {} if a.mask == "none" else dict(profiler_plugin="example", profile_event_mask=int(a.mask, 0),
                                            profile_dump_file=os.path.join(a.dir, "trace"))
    # cpu_reclaim off: "auto" decides from timed FIFO writes, and its stores varied by ~10k instructions per op
    comm = slicetrace.init("cpu", rank, 2, store=FileStore(a.dir), job="cg", cpu_wait="futex", cpu_bind="off",
                           cpu_reclaim="off", timeout_s=600, **prof)
    sess = comm._session
    x = np.ones(a.bytes // 4, np.float32)
    out = np.empty_like(x)
    for _ in range(a.warmup + a.ops):
        sess._poll_at = math.inf            # poll by op count only (see the docstring)
        comm.all_reduce(x, out=out)
    comm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=512)
    p.add_argument("--warmup", type=int, default=64)
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--mask", default="0x10046", help="the example plugin's event mask, or 'none' (no plugin)")
    p.add_argument("--keep", default=None, help="write the traces into this folder (kept) instead of a temporary one")
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank == 1:
        body(1, a)
        return
    with tempfile.TemporaryDirectory() as tmp:
        a.dir = d = a.keep or tmp
        os.makedirs(d, exist_ok=True)
        child = subprocess.Popen([sys.executable, __file__, "--rank", "1", "--dir", d, "--ops", str(a.ops),
                                  "--warmup", str(a.warmup), "--bytes", str(a.bytes), "--mask", a.mask])
        try:
            body(0, a)
        finally:
            if child.wait(600):
                raise SystemExit(f"rank 1 failed (exit {child.returncode})")
        if a.mask != "none":
            sizes = sorted((f, os.path.getsize(os.path.join(d, f))) for f in os.listdir(d) if f.startswith("trace"))
            print("traces:", sizes)


if __name__ == "__main__":
    main()
