#!/usr/bin/env bash
# The all_to_all transient: our all_to_all per op right after NCCL's first all_to_all, with nothing, a 2 s sleep,
# 200 of our ops, 50 more NCCL all_to_all, or a gc.collect() in between; each in a fresh pair of ranks, twice. Log in $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src
OUT=${OUT:-out}; mkdir -p $OUT
for rep in 1 2; do
  for mode in ${MODES:-none sleep ops nccl gc}; do
    timeout 90 python3 scripts/gpu_a2a_probe.py --after $mode 2>&1 | grep -E '^rank|Error' | tee -a $OUT/a2a_after.log
  done
done
