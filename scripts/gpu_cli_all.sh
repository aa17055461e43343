#!/usr/bin/env bash
# Every operation through the public API against NCCL, 8 B .. 1 GiB (the bench command users run). Log in $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src
OUT=${OUT:-out}; mkdir -p $OUT
timeout ${CLI_TIMEOUT:-500} python3 -m slicetrace.cli.main bench --backend cuda --op all -b 8 -e 1G -f 8 -n 20 -w 5 \
  --compare nccl --json $OUT/cli_all.json 2>&1 | tee $OUT/cli_all.log
