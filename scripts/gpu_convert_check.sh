#!/usr/bin/env bash
# On a 2-GPU machine: the CUDA tests, then a traced cuda bench with the example and linkstats plugins, and the
# converter's and report's checks on those traces. Logs, traces and the .pftrace go to $OUT (or ./out).
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src PYTHONUNBUFFERED=1 SLICETRACE_CACHE_DIR=${CACHE:-$PWD/.kcache}
OUT=${OUT:-out}; mkdir -p "$OUT/gtr"
rc=0
nvidia-smi -L | tee "$OUT/env.txt"
[ -n "$SKIP_TESTS" ] || timeout 300 python3 -m pytest -q -x -rs tests/cuda 2>&1 | tail -5 | tee "$OUT/pytest.log" || rc=1
SLICETRACE_PROFILER_PLUGIN=example,linkstats SLICETRACE_LINKSTATS_FILE="$OUT/gtr/links" \
  timeout 200 python3 -m slicetrace.cli.main bench --backend cuda --op all_reduce,all_gather,send_recv \
  -b 64K -e 16M -f 4 -n 5 -w 2 -T 30 --trace "$OUT/gtr" 2>&1 | tee "$OUT/bench.log" || rc=1
ls -la "$OUT/gtr" | tee -a "$OUT/bench.log"
timeout 120 python3 scripts/convert_check.py "$OUT/gtr/trace" "$OUT/g.pftrace" 2>&1 | tee "$OUT/convert.log" || rc=1
timeout 120 python3 -m slicetrace.cli.main report "$OUT/gtr" 2>&1 | head -60 | tee "$OUT/report.log" || rc=1
head -12 "$OUT"/gtr/links_*_0.prom >> "$OUT/convert.log" 2>&1
exit $rc
