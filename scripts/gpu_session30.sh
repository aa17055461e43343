#!/usr/bin/env bash
# One device call (session 30): gpu_session29.sh (the CUDA test folder, then the torch CPU tests), then a traced
# 2-rank cuda bench on the one GPU, the converter's check of its flow instants and report on those traces.
source "$(dirname "$0")/gpu_env.sh"
OUT="$OUT" bash scripts/gpu_session29.sh
mkdir -p "$OUT/gtr"
PYTHONPATH=src timeout 150 python3 -m slicetrace bench --backend cuda --ranks 2 --op all_reduce,all_gather,send_recv \
  -b 64K -e 16M -f 4 -n 5 -w 2 -T 30 --trace "$OUT/gtr" > "$OUT/bench.log" 2>&1 || rc=1
PYTHONPATH=src timeout 120 python3 scripts/convert_check.py "$OUT/gtr/trace" "$OUT/g.pftrace" > "$OUT/convert.log" 2>&1 || rc=1
PYTHONPATH=src timeout 120 python3 -m slicetrace report "$OUT/gtr" > "$OUT/report.log" 2>&1 || rc=1
rm -f "$OUT/g.pftrace"
exit $rc
