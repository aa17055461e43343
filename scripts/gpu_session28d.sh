#!/usr/bin/env bash
# Session 28: a kernel queued behind an aborted one (abort word read at each program's start): the new test on
# ./prev27 (git archive 0e61bf8 src, the kernel before) and on this tree, then tests/cuda whole. Carry .kcache
# (prebuilt for both kernels) and prev27. Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
T=tests/cuda/test_faults.py::test_a_kernel_queued_behind_an_aborted_one_moves_nothing
for t in prev27/src src; do
  echo "== $t" >> "$OUT/queued.log"
  PYTHONPATH=$t timeout 100 python3 -m pytest -q -rs -p no:cacheprovider "$T" >> "$OUT/queued.log" 2>&1
  echo "rc=$?" >> "$OUT/queued.log"
done
PYTHONPATH=src timeout 330 python3 -m pytest -q -rs --durations=5 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
