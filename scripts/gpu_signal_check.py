#!/usr/bin/env python3
"""The launcher's cuda ranks never outlive it: SIGTERM and SIGKILL to a launcher whose 2 ranks loop all_reduce
on GPUs; prints the exit status, surviving rank pids and leftover /dev/shm entries for each.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=src python3 scripts/gpu_signal_check.py
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

from slicetrace.backend.procs import proc_dead

DRIVER = """
import os, sys, cupy, slicetrace
def body(comm, d):
    x = cupy.ones(1 << 20, cupy.float32)
    comm.all_reduce(x)
    cupy.cuda.Stream.null.synchronize()
    open(os.path.join(d, f"rank{comm.rank}.pid"), "w").write(str(os.getpid()))
    while True:
        comm.all_reduce(x)
if __name__ == "__main__":
    slicetrace.launch(body, 2, sys.argv[1], backend="cuda", timeout_s=30.0)
"""


def one(sig: signal.Signals) -> None:
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "driver.py"), "w") as f:
        f.write(DRIVER)
    shm = set(glob.glob("/dev/shm/*"))
    p = subprocess.Popen([sys.executable, os.path.join(d, "driver.py"), d], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pids: list[int] = []
    deadline = time.monotonic() + 120
    while len(pids) < 2 and time.monotonic() < deadline and p.poll() is None:
        pids = [int(open(f).read()) for f in glob.glob(os.path.join(d, "rank*.pid")) if open(f).read()]
        time.sleep(0.2)
    if len(pids) < 2:
        print(f"{sig.name}: ranks did not start; rc={p.poll()} {p.stderr.read().decode()[-2000:]}")
        os.killpg(p.pid, signal.SIGKILL)
        return
    time.sleep(1.0)
    t = time.monotonic()
    os.kill(p.pid, sig)
    rc = p.wait(timeout=60)
    end = time.monotonic() + 20
    while any(proc_dead(q, 0) is None for q in pids) and time.monotonic() < end:
        time.sleep(0.1)
    gone_s = time.monotonic() - t
    survivors = [q for q in pids if proc_dead(q, 0) is None]
    leaked = sorted(set(glob.glob("/dev/shm/*")) - shm)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    print(f"{sig.name}: launcher rc={rc}, ranks gone after {gone_s:.1f} s, survivors={survivors}, "
          f"new /dev/shm entries={leaked}")


if __name__ == "__main__":
    for s in (signal.SIGTERM, signal.SIGKILL):
        one(s)
