#!/usr/bin/env bash
# The bench's all_to_all rows against NCCL from fresh processes, REPS times (the sizes where a slow block used to
# show), then all_reduce 8 B .. 1 GiB once. Log in $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src
OUT=${OUT:-out}; mkdir -p $OUT
st="python3 -m slicetrace.cli.main bench --backend cuda -n 20 -w 5 --compare nccl"
for rep in $(seq ${REPS:-4}); do
  echo "## all_to_all run $rep"; timeout 120 $st --op all_to_all -b 512K -e 8M -f 2 2>&1 | tail -5
done | tee $OUT/a2a_rows.log
{ echo "## all_reduce"; timeout 150 $st --op all_reduce -b 8 -e 1G -f 8 2>&1 | tail -10; } | tee $OUT/ar_rows.log
