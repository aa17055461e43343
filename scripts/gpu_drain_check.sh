#!/usr/bin/env bash
# One device call after a drain change: the CUDA tests, the trace invariants (10 s loops), the host time per
# stage, and the full-stack profiling overhead (20- and 200-op blocks, and KernelStep alone). Logs in $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src
OUT=${OUT:-out}; mkdir -p $OUT
rc=0
timeout 300 python3 -m pytest -q -x -rs tests/cuda 2>&1 | tail -5 | tee $OUT/pytest.log || rc=1
timeout 150 python3 scripts/gpu_trace_check.py /tmp/st_tr --seconds 10 > $OUT/trace_check.log 2>&1 || rc=1
tail -12 $OUT/trace_check.log
timeout 150 python3 scripts/gpu_host_profile.py --sizes 1M,16M --ops 400 > $OUT/host_profile.log 2>&1 || rc=1
st="python3 -m slicetrace.cli.main bench --backend cuda --op all_reduce -b 64K -e 64M -f 4 -w 5 -c 0 --overhead"
{ echo "## -n 20"; timeout 120 $st -n 20 2>&1 | tail -6
  echo "## -n 200"; timeout 150 $st -n 200 2>&1 | tail -6
  echo "## -n 200, KernelStep alone"; timeout 150 $st -n 200 --overhead-of kernel_step 2>&1 | tail -6
} > $OUT/ovh.log 2>&1 || rc=1
cat $OUT/ovh.log
exit $rc
