"""The example plugin's longest KernelStep callback with a trace file: 1 Mi synthetic KernelSteps handed in batches
of 8,192 (one pool full), then finalize. Before the writer thread, the batch that filled the pool formatted and
wrote the whole buffer inside the call (under the host's lock, which the user's thread takes to begin an op).

    PYTHONPATH=src python scripts/chrome_callback_probe.py [--rows 1048576] [--dir /tmp/ccp]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from slicetrace.config import Settings
from slicetrace.events.abi import KERNEL_STEP_DTYPE, ActivationMask, CommInfo
from slicetrace.sinks.chrome import ChromePlugin


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1 << 20)
    p.add_argument("--dir", default="/tmp/ccp")
    a = p.parse_args()
    plugin = ChromePlugin(Settings(profile_dump_file=os.path.join(a.dir, "t")))
    ctx = plugin.init(CommInfo(5, "probe", 1, 8, 0), ActivationMask())
    n = a.rows
    r = np.zeros(n, KERNEL_STEP_DTYPE)
    r["channel"], r["peer"], r["step"], r["size"] = np.arange(n) % 32, np.arange(n) % 8, np.arange(n), 1 << 19
    base = 33_000_000_000_000 + np.arange(n, dtype=np.int64) * 1000
    r["wait_ns"], r["ready_ns"], r["done_ns"] = base, base + 100, base + 900
    r["wait_clk"], r["ready_clk"], r["done_clk"] = base, base + 100, base + 900
    r.flags.writeable = False
    t, longest = time.perf_counter(), 0.0
    for i in range(0, n, 8192):
        t0 = time.perf_counter()
        plugin.kernel_step_batch(ctx, None, r[i:i + 8192])
        longest = max(longest, time.perf_counter() - t0)
    fed = time.perf_counter() - t
    plugin.finalize(ctx)
    print(f"fed {n:,} rows in {fed:.2f} s, longest call {longest:.3f} s; finalized after "
          f"{time.perf_counter() - t:.2f} s, {os.path.getsize(ctx.path) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
