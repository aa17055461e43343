#!/usr/bin/env bash
# Session 28: what the abort read at each program's start costs: small all_reduce latency, this tree against
# ./prev27 (the kernel before), alternating, three times. 2 ranks share the one GPU. Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
for i in 1 2 3; do
  for t in src prev27/src; do
    echo "== $t run $i" >> "$OUT/lat.log"
    PYTHONPATH=$t timeout 80 python3 -m slicetrace.cli.main bench --backend cuda --ranks 2 -b 8 -e 1M -f 16 -n 500 \
      -w 50 -c 0 2>&1 | grep -E "^ +[0-9]" >> "$OUT/lat.log"
  done
done
