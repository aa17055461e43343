#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 SLICETRACE_CACHE_DIR=$PWD/.kcache PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 240 python3 -m pytest -q -x -rs tests/cuda 2>&1 | tail -5 | tee $OUT/pytest_cuda.txt
timeout 150 python3 -m slicetrace.cli.main bench --backend cuda -b 64K -e 64M -f 4 -n 20 -w 5 -c 0 --overhead --overhead-of kernel_step --rounds 20 2>&1 | tee $OUT/ks_overhead.txt
timeout 120 python3 -m slicetrace.cli.main bench --backend cuda -b 1M -e 256M -f 4 -n 20 -w 5 --compare nccl 2>&1 | tee $OUT/vs_nccl.txt
