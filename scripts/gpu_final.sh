#!/usr/bin/env bash
# One device call at the end of a session: the CUDA tests, the trace check, and small send_recv/all_to_all against
# NCCL for this tree and ./prev (git archive REV src | tar -x -C prev), alternating. Logs in $OUT.
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache
OUT=${OUT:-out}; mkdir -p "$OUT"
rc=0
{ date -u; nvidia-smi -L; } > "$OUT/env.txt" 2>&1
PYTHONPATH=src timeout 330 python3 -m pytest -q -x -rs tests/cuda 2>&1 | tail -8 | tee "$OUT/pytest.log" || rc=1
PYTHONPATH=src timeout 120 python3 scripts/gpu_trace_check.py /tmp/st_tr --seconds 5 --timeout 30 \
  > "$OUT/trace_check.log" 2>&1 || rc=1
grep -E "traffic_|causality|nesting" "$OUT/trace_check.log"
for r in 1 2; do
  for t in . prev; do
    [ -d "$t/src" ] || continue
    echo "== $t $r"
    (cd "$t" && PYTHONPATH=src timeout 100 python3 -m slicetrace.cli.main bench --backend cuda \
      --op send_recv,all_to_all ${SIZES:--b 8 -e 256K -f 8} -n 50 -w 10 -c 0 --compare nccl 2>&1) || rc=1
  done
done > "$OUT/ab_small.log"
exit $rc
