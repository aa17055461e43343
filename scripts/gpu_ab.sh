#!/usr/bin/env bash
# One device call: the CUDA tests, then the kernel-side KernelStep overhead (CUDA-graph replay) of this tree and,
# when ./prev holds an older tree (git archive REV src scripts | tar -x -C prev, its kernels prebuilt into
# prev/.kcache), of that tree, back to back in the same call. Logs go to $OUT.
#   VARIANTS="nostores:ST_STORES=0" SIZES=64K,1M,16M,256M ROUNDS=2 TRACE_SECONDS=10 MAXB=1G CLI=1 \
#     OPS=1 bash scripts/gpu_ab.sh
# OPS=1 adds every operation side by side with NCCL, 8 B .. 1 GiB (bench_cuda.py's table). CLI=1: all_reduce
# through the API against NCCL, then the full-stack overhead of all profiling and of KernelStep alone.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
SIZES=${SIZES:-64K,1M,16M,256M}
{ date -u; nvidia-smi -L; } > "$OUT/env.txt" 2>&1
rc=0
if [ -z "$SKIP_TESTS" ]; then
  SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x -rs \
    --durations=5 tests/cuda ${PYTEST_ARGS} 2>&1 | tail -25 | tee "$OUT/pytest.log" || rc=1
fi
ab() {   # tree label
  (cd "$1" && PYTHONPATH=src timeout ${BENCH_TIMEOUT:-150} python3 scripts/bench_cuda.py --cache-dir "$PWD/.kcache" \
     --ops all_reduce --min-bytes ${MINB:-1M} --max-bytes ${MAXB:-1M} --factor ${FACTOR:-16} --reps 3 --overhead "$SIZES" --graph ${3:+--variants "$3"} \
     --out "$OUT/bench_$2.json" 2>&1 | tail -30 | tee "$OUT/bench_$2.log") || rc=1
}
for round in $(seq ${ROUNDS:-2}); do
  ab . "new$round" "${VARIANTS}"
  [ -d prev/src ] && ab prev "prev$round"
done
if [ -n "$TRACE_SECONDS" ]; then       # trace invariants and the profiled loops at 1 MiB and 1 GiB
  SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src timeout $((TRACE_SECONDS * 8 + 60)) python3 \
    scripts/gpu_trace_check.py /tmp/st_tr --seconds "$TRACE_SECONDS" 2>&1 | tee "$OUT/trace_check.log" || rc=1
fi
if [ -n "$CLI" ]; then                  # through the public API: all_reduce side by side, then the full-stack overhead
  st="python3 -m slicetrace.cli.main bench --backend cuda --op all_reduce -n 20 -w 5"
  SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src timeout 120 $st -b 8 -e 1G -f 8 --compare nccl 2>&1 \
    | tee "$OUT/cli_bench.log" || rc=1
  SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src timeout 100 $st -b 64K -e 256M -f 4 -c 0 --overhead 2>&1 \
    | tee "$OUT/cli_ovh.log" || rc=1
  SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src timeout 100 $st -b 64K -e 256M -f 4 -c 0 --overhead \
    --overhead-of kernel_step 2>&1 | tee -a "$OUT/cli_ovh.log" || rc=1       # KernelStep alone, full stack
fi
if [ -n "$OPS" ]; then                  # every operation vs NCCL, profiling off
  PYTHONPATH=src timeout ${OPS_TIMEOUT:-200} python3 scripts/bench_cuda.py --cache-dir "$PWD/.kcache" --min-bytes 8 \
    --max-bytes 1G --factor 8 --reps 3 --out "$OUT/bench_ops.json" 2>&1 | tail -80 | tee "$OUT/bench_ops.log" || rc=1
fi
exit $rc
