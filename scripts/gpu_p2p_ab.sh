#!/usr/bin/env bash
# One device call after a p2p placement change: the CUDA tests, the traced convert/report check, the trace check's
# causality, then send_recv and all_to_all against NCCL for this tree and ./prev (git archive REV src | tar -x -C
# prev), alternating. Logs in $OUT.   ROUNDS=2 SIZES="-b 1M -e 256M -f 4" bash scripts/gpu_p2p_ab.sh
# SKIP_CONVERT=1: the tests alone instead of the convert check; ITERS, AB_TIMEOUT, AB_LOG: the A/B runs' -n/-w,
# time limit and log name (scripts/gpu_final.sh sets them).
source "$(dirname "$0")/gpu_env.sh"
if [ -z "$SKIP_CONVERT" ]; then
  bash scripts/gpu_convert_check.sh || rc=1        # tests, traced bench, convert, report (its own logs)
  rm -rf "$OUT/gtr"
else
  { date -u; nvidia-smi -L; } > "$OUT/env.txt" 2>&1
  PYTHONPATH=src timeout 330 python3 -m pytest -q -x -rs tests/cuda 2>&1 | tail -8 | tee "$OUT/pytest.log" || rc=1
fi
PYTHONPATH=src timeout 120 python3 scripts/gpu_trace_check.py /tmp/st_tr --seconds 5 --timeout 30 \
  > "$OUT/trace_check.log" 2>&1 || rc=1
grep -E "traffic_|causality|nesting" "$OUT/trace_check.log"
ab() {   # tree label
  echo "== $2 $(date -u +%T)"
  (cd "$1" && PYTHONPATH=src timeout ${AB_TIMEOUT:-150} python3 -m slicetrace.cli.main bench --backend cuda \
     --op send_recv,all_to_all ${SIZES:--b 1M -e 256M -f 4} ${ITERS:--n 20 -w 5} -c 0 --compare nccl 2>&1) || rc=1
}
for r in $(seq ${ROUNDS:-2}); do
  ab . "new_$r"; [ -d prev/src ] && ab prev "prev_$r"
done > "$OUT/${AB_LOG:-ab.log}"
exit $rc
