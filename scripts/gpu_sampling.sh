#!/usr/bin/env bash
# One device call after the op-sampling change: the CUDA tests, the full-stack profiling overhead with every op
# profiled and with one op in 10 and in 100 (SLICETRACE_PROFILE_OP_SAMPLE_RATE), and a traced, checked, sampled
# run through report and convert. Logs in $OUT.
#     [SKIP_TESTS=1] [RATES="10 100"] [ITERS="-n 2000"] [SIZES="-b 1M -e 16M -f 4"] bash scripts/gpu_sampling.sh
source "$(dirname "$0")/gpu_env.sh"
export PYTHONPATH=src
{ date -u; nvidia-smi -L; } > "$OUT/env.txt" 2>&1
[ -z "$SKIP_TESTS" ] && { timeout 330 python3 -m pytest -q -x -rs tests/cuda 2>&1 | tail -8 | tee "$OUT/pytest.log" || rc=1; }
for k in ${RATES:-1 10 100}; do
  echo "== op sample rate $k $(date -u +%T)"
  SLICETRACE_PROFILE_OP_SAMPLE_RATE=$k timeout 150 python3 -m slicetrace.cli.main bench --backend cuda \
    --op all_reduce ${SIZES:--b 64K -e 64M -f 4} ${ITERS:--n 200} -w 5 -c 0 --overhead --rounds ${ROUNDS:-6} 2>&1 || rc=1
done | tee "$OUT/overhead.log"
rm -rf /tmp/st_samp
SLICETRACE_PROFILE_OP_SAMPLE_RATE=10 SLICETRACE_PROFILE_MIN_BYTES=4096 timeout 120 python3 -m slicetrace.cli.main \
  bench --backend cuda --op all_reduce,all_to_all -b 1K -e 4M -f 4 -n 20 -w 5 --trace /tmp/st_samp \
  > "$OUT/traced.log" 2>&1 || rc=1
tail -4 "$OUT/traced.log"
timeout 60 python3 -m slicetrace.cli.main report /tmp/st_samp > "$OUT/report.log" 2>&1 || rc=1
grep -E "loss counters|not profiled" "$OUT/report.log"
timeout 60 python3 scripts/convert_check.py /tmp/st_samp "$OUT/samp.pftrace" > "$OUT/convert.log" 2>&1 || rc=1
tail -3 "$OUT/convert.log"; rm -f "$OUT/samp.pftrace"
python3 - /tmp/st_samp > "$OUT/trace_check.log" 2>&1 <<'PY' || rc=1
import glob, sys
from slicetrace.analyze.trace import check_trace
files = sorted(glob.glob(sys.argv[1] + "/*_*_*.json"))
bad = {f: check_trace(f) for f in files}
print(len(files), "files;", sum(len(v) for v in bad.values()), "problems", [v[:3] for v in bad.values() if v])
PY
cat "$OUT/trace_check.log"
exit $rc
