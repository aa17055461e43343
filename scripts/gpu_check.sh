#!/usr/bin/env bash
# One command on a GPU machine: the CUDA tests, then a short benchmark against NCCL. Logs go to $OUT (or ./out).
#   PYTEST_ARGS="-k stamps" BENCH_ARGS="--max-bytes 1G" bash scripts/gpu_check.sh
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
CACHE=${CACHE:-$PWD/.kcache}          # carried prebuilt cubins are used when the toolchain matches
export SLICETRACE_CACHE_DIR=$CACHE
{ nvidia-smi -L; nvidia-smi topo -m; python3 -c 'import cupy, torch; print("cupy", cupy.__version__, "torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
rc=0
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -x -rs --durations=10 tests/cuda ${PYTEST_ARGS} 2>&1 | tee "$OUT/pytest.log" || rc=1
fi
if [ -z "$SKIP_BENCH" ]; then
  timeout ${BENCH_TIMEOUT:-400} python3 scripts/bench_cuda.py --cache-dir "$CACHE" \
    ${BENCH_ARGS:---max-bytes 256M --factor 4 --overhead 64K,1M,16M --graph} --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" || rc=1
fi
if [ -n "$WITH_CLI" ] && python3 -c 'import slicetrace.cli.main' 2>/dev/null; then
  timeout 300 python3 -m slicetrace.cli.main bench --backend cuda --compare nccl -b 8 -e 64M -f 8 2>&1 | tee "$OUT/cli_bench.log" || rc=1
fi
exit $rc
