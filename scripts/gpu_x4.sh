#!/usr/bin/env bash
# One device call on a 4-GPU machine (nvidia-h200-x4): every operation at 3 and 4 ranks against NCCL (#wrong and
# busbw ratio), the trace check (exact traffic, cross-GPU causality, nesting) at 3 and 4 ranks, and a traced
# 4-rank bench through convert and report. Logs in $OUT.     bash scripts/gpu_x4.sh
source "$(dirname "$0")/gpu_env.sh"
export PYTHONPATH=src
{ date -u; nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/env.txt" 2>&1
for n in 4 3; do
  echo "== $n ranks $(date -u +%T)"
  timeout 200 python3 -m slicetrace.cli.main bench --backend cuda --ranks $n --op all -b 8 -e 256M -f 32 -n 10 -w 3 \
    --compare nccl 2>&1 || rc=1
done > "$OUT/bench.log"
grep -E "^== |^# [a-z_]+$|^ +[0-9]|Out of bounds|rror" "$OUT/bench.log" \
  | awk '/^ +[0-9]/ {print $1, $6, $8, $9, $12; next} {print}' | head -120     # size, us, busbw, #wrong, ratio
for n in 4 3; do
  rm -rf /tmp/st_tr$n
  timeout 150 python3 scripts/gpu_trace_check.py /tmp/st_tr$n --ranks $n --seconds 3 --timeout 30 \
    > "$OUT/trace_check_$n.log" 2>&1 || rc=1
  echo "== trace check $n ranks"; grep -E "traffic_|causality|nesting|rror" "$OUT/trace_check_$n.log" | head -8
done
rm -rf /tmp/st_x4
timeout 150 python3 -m slicetrace.cli.main bench --backend cuda --ranks 4 --op all_reduce,all_to_all -b 64K -e 16M \
  -f 16 -n 10 -w 3 --trace /tmp/st_x4 > "$OUT/traced.log" 2>&1 || rc=1
tail -3 "$OUT/traced.log"
timeout 60 python3 scripts/convert_check.py /tmp/st_x4 /tmp/x4.pftrace 2>&1 | tail -2 || rc=1
timeout 60 python3 -m slicetrace.cli.main report /tmp/st_x4 > "$OUT/report.log" 2>&1 || rc=1
grep -E "loss counters|slow link|most waited" "$OUT/report.log"
exit $rc
