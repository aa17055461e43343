#!/usr/bin/env bash
# Is the drain's host CPU per op on the GPU host inflated by its thread and the main thread running on different
# cores? gpu_host_profile.py as is and with every thread of a rank on one CPU, then the in-process model of the
# same records (bench_event_path.py --gpu) on the same host. Logs in $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src
OUT=${OUT:-out}; mkdir -p $OUT
{ nproc; lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node|L2|L3'; } > $OUT/host.txt 2>&1
timeout 150 python3 scripts/gpu_host_profile.py --sizes 1M,16M --ops 400 > $OUT/unpinned.log 2>&1
timeout 150 python3 scripts/gpu_host_profile.py --sizes 1M,16M --ops 400 --pin > $OUT/pinned.log 2>&1
{ timeout 100 python3 scripts/bench_event_path.py --gpu --channels 32 --slices 4 --batch 80 --ops 800 --reps 3
  timeout 100 python3 scripts/bench_event_path.py --gpu --channels 64 --slices 8 --batch 133 --ops 1064 --reps 3
} > $OUT/model.log 2>&1
cat $OUT/*.log | grep -v '^ ' | head -40
