#!/usr/bin/env bash
# Full-stack profiling overhead on CUDA under different measuring protocols, in one device call: the bench's
# usual 20-op blocks (each block includes a flush, so every poll's fixed cost is paid per 20 ops), 200-op blocks,
# 200-op blocks with a 4 ms drain interval, KernelStep alone; then the host time per stage (gpu_host_profile.py).
#   bash scripts/gpu_overhead_protocol.sh        (logs in $OUT)
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src
OUT=${OUT:-out}; mkdir -p $OUT
st="python3 -m slicetrace.cli.main bench --backend cuda --op all_reduce -b 64K -e 64M -f 4 -w 5 -c 0 --overhead"
{ echo "## -n 20 (the usual protocol)"; timeout 120 $st -n 20 2>&1 | tail -7
  echo "## -n 200"; timeout 150 $st -n 200 2>&1 | tail -7
  echo "## -n 200, SLICETRACE_DRAIN_INTERVAL_US=4000"; SLICETRACE_DRAIN_INTERVAL_US=4000 timeout 150 $st -n 200 2>&1 | tail -7
  echo "## -n 200, KernelStep alone"; timeout 150 $st -n 200 --overhead-of kernel_step 2>&1 | tail -7
} | tee $OUT/ovh.log
timeout 150 python3 scripts/gpu_host_profile.py --sizes 1M,16M --ops 400 --top 30 2>&1 | tee $OUT/host_profile.log | tail -5
