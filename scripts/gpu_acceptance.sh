#!/usr/bin/env bash
# One device call for the CUDA acceptance: smoke, stamp tests, trace checks, the CLI side by side with NCCL,
# and the KernelStep overhead. Every stage has its own timeout; logs go to $OUT.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src PYTHONUNBUFFERED=1 SLICETRACE_CACHE_DIR=${SLICETRACE_CACHE_DIR:-/tmp/kcache}
OUT=${OUT:-out}
mkdir -p "$OUT"
{ date -u; nvidia-smi -L; nvidia-smi topo -m; python3 -c 'import cupy, torch; print("cupy", cupy.__version__, "torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$OUT/env.txt" 2>&1
st=slicetrace.cli.main
timeout 120 python3 -m $st bench --backend cuda --compare nccl -b 8 -e 1M -f 32 -n 5 -w 2 2>&1 | tee "$OUT/smoke.log"
timeout 150 python3 -m pytest -q -x -rs tests/cuda/test_stamps.py 2>&1 | tail -15 | tee "$OUT/pytest_stamps.log"
timeout 150 python3 scripts/gpu_trace_check.py "$OUT/tr" --seconds 10 2>&1 | tail -60 | tee "$OUT/trace_check.log"
rm -f "$OUT"/tr/trace_*.json
timeout 200 python3 -m $st bench --backend cuda --compare nccl --op all -b 8 -e 1G -f 8 -n 20 -w 5 \
  --json "$OUT/cli_bench.json" 2>&1 | tee "$OUT/cli_bench.log"
timeout 80 python3 -m $st bench --backend cuda --op all_reduce -b 64K -e 256M -f 4 -n 20 -w 5 -c 0 --overhead \
  --rounds 6 --json "$OUT/cli_ovh.json" 2>&1 | tee "$OUT/cli_ovh.log"
