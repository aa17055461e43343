"""Ctrl-C (or SIGTERM) on a CUDA bench with a trace: the bench runs cycles (-N 1000000; -N 0 with --trace is
refused) until its first row, then its process group gets the signal; prints the exit code, whether stderr has a
traceback, and per trace file whether it ends whole and its KernelSteps.

    PYTHONPATH=src python3 scripts/gpu_ctrlc_check.py OUT_DIR [RANKS [BACKEND [SIGNAL]]]     (SIGNAL: INT, TERM)
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time

from slicetrace.analyze.trace import kernel_steps, load_traces

if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help") or len(sys.argv) > 5:
    print(__doc__)
    sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
out, ranks = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "1"
backend = sys.argv[3] if len(sys.argv) > 3 else "cuda"
for name, value, ok, want in (("RANKS", ranks, ranks.isdigit() and int(ranks) > 0, "a number >= 1"),
                              ("BACKEND", backend, backend in ("cpu", "cuda"), "cpu or cuda"),
                              ("SIGNAL", (sys.argv[4:] or ["INT"])[0], (sys.argv[4:] or ["INT"])[0] in ("INT", "TERM"),
                               "INT or TERM")):
    if not ok:
        sys.exit(f"{name}={value!r}: must be {want}\n{__doc__}")
sig = getattr(signal, "SIG" + (sys.argv[4] if len(sys.argv) > 4 else "INT"))
t0 = time.monotonic()
p = subprocess.Popen([sys.executable, "-m", "slicetrace.cli.main", "bench", "--backend", backend, "--ranks", ranks,
                      "-b", "16M", "-e", "16M", "-n", "20", "-w", "2", "-N", "1000000", "--trace", out],
                     stdout=subprocess.PIPE, stderr=open(out + ".err", "wb"), start_new_session=True)
first = None
for line in p.stdout:
    if line.strip().startswith(b"16777216"):
        first = time.monotonic() - t0
        break
os.killpg(p.pid, sig)
t1 = time.monotonic()
try:
    rc = p.wait(timeout=60)
except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    rc = "killed after 60 s"
err = open(out + ".err", errors="replace").read()
files = {os.path.basename(f): {"whole": open(f).read().endswith("]\n"),
                                "kernel_steps": len(kernel_steps(load_traces([f])))}
         for f in sorted(glob.glob(os.path.join(out, "trace_*.json")))}
print(json.dumps({"first_row_s": first, "close_s": round(time.monotonic() - t1, 2), "rc": rc,
                  "traceback": "Traceback" in err, "interrupted_msg": "slicetrace: interrupted" in err,
                  "files": files}))
