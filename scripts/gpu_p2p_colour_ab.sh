#!/usr/bin/env bash
# One device call on 4 GPUs after a p2p channel-placement change: the CUDA tests and the trace check (3 ranks) on
# this tree, then all_to_all and send_recv against NCCL at 3 and 4 ranks for this tree and the trees in ./prev and
# ./prevb (git archive REV src | tar -x -C prev), alternating, checked (#wrong). Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
PYTHONPATH=src timeout 300 python3 -m pytest -q -x -rs tests/cuda 2>&1 | tail -3 | tee "$OUT/pytest.log" || rc=1
rm -rf /tmp/st_tr3
PYTHONPATH=src timeout 120 python3 scripts/gpu_trace_check.py /tmp/st_tr3 --ranks 3 --seconds 2 --timeout 30 \
  > "$OUT/trace_check_3.log" 2>&1 || rc=1
grep -E "traffic_ok|traffic_bad|causality|nesting" "$OUT/trace_check_3.log"
for r in $(seq ${ROUNDS:-2}); do
  for n in 3 4; do
    for t in . prevb prev; do
      [ -d "$t/src" ] || continue
      echo "== $t $n ranks round $r"
      (cd "$t" && PYTHONPATH=src timeout 120 python3 -m slicetrace.cli.main bench --backend cuda --ranks $n \
        --op all_to_all,send_recv ${SIZES:--b 256K -e 256M -f 8} -n 30 -w 5 --compare nccl 2>&1) \
        | grep -E "^# [a-z_]+$|^ +[0-9]|rror" | awk '/^ +[0-9]/ {print $1, $6, $9, $10, $12; next} {print}' || rc=1
    done
  done
done | tee "$OUT/ab.log"
exit $rc
