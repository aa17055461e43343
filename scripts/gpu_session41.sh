#!/usr/bin/env bash
# One device call (session 41): where a cuda rank's records go when its peer is killed (fail_trace_check --detail:
# which ops delivered KernelSteps and KernelCh, the counters), then the CUDA test folder.
source "$(dirname "$0")/gpu_env.sh"
PYTHONPATH=src timeout 200 python3 scripts/fail_trace_check.py "$OUT/fail" --backend cuda --trials 2 --nchannels 4 \
  --delay 3 --detail > "$OUT/fail.log" 2>&1 || rc=1
rm -rf "$OUT/fail"
PYTHONPATH=src timeout 330 python3 -m pytest -q -rs --durations=5 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
exit ${rc:-0}
