#!/usr/bin/env bash
# One device call: the CUDA tests and the trace check on this tree, then the full-stack profiling overhead
# (`slicetrace bench --overhead`, all profiling and KernelStep alone) of this tree and, when ./prev holds an
# older tree (git archive REV src | tar -x -C prev), of that one, alternating. Logs in $OUT.
#   ROUNDS=2 SIZES="-b 64K -e 64M -f 4" TRACE_SECONDS=10 bash scripts/gpu_host_ab.sh
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache
OUT=${OUT:-out}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; python3 -c "import torch, cupy; print(torch.__version__, cupy.__version__)"; } > "$OUT/env.txt" 2>&1
rc=0
if [ -z "$SKIP_TESTS" ]; then
  PYTHONPATH=src timeout 300 python3 -m pytest -q -x -rs tests/cuda 2>&1 | tail -15 | tee "$OUT/pytest.log" || rc=1
fi
if [ -n "$TRACE_SECONDS" ]; then
  PYTHONPATH=src timeout $((TRACE_SECONDS * 8 + 60)) python3 scripts/gpu_trace_check.py /tmp/st_tr \
    --seconds "$TRACE_SECONDS" --timeout 30 > "$OUT/trace_check.log" 2>&1 || rc=1
  grep -iE "traffic|causal|violation|nesting|loss|overrun|error" "$OUT/trace_check.log" | head -20
fi
ovh() {   # tree label [extra args]
  (cd "$1" && PYTHONPATH=src timeout 150 python3 -m slicetrace.cli.main bench --backend cuda --op all_reduce \
     ${SIZES:--b 64K -e 64M -f 4} -n 20 -w 5 -c 0 --overhead $3 2>&1 | tail -8 | tee "$OUT/ovh_$2.log") || rc=1
}
for r in $(seq ${ROUNDS:-2}); do
  ovh . "new_all_$r"; [ -d prev/src ] && ovh prev "prev_all_$r"
  ovh . "new_ks_$r" "--overhead-of kernel_step"; [ -d prev/src ] && ovh prev "prev_ks_$r" "--overhead-of kernel_step"
done
exit $rc
