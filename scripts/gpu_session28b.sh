#!/usr/bin/env bash
# Session 28, second call: the close-after-a-peer-found-the-mismatch test on ./prev27 (git archive 0e61bf8 src)
# and on this tree, twice each, then tests/cuda/test_faults.py whole. Carry .kcache and prev27. Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
T=tests/cuda/test_faults.py::test_a_mismatch_the_peer_found_first_is_raised_at_close_not_logged
for i in 1 2; do
  for t in prev27/src src; do
    echo "== $t run $i" >> "$OUT/close.log"
    PYTHONPATH=$t timeout 120 python3 -m pytest -q -rs -p no:cacheprovider "$T" >> "$OUT/close.log" 2>&1
    echo "rc=$?" >> "$OUT/close.log"
  done
done
PYTHONPATH=src timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/cuda/test_faults.py > "$OUT/faults.log" 2>&1
echo "rc=$?" >> "$OUT/faults.log"
