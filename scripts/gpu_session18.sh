#!/usr/bin/env bash
# eighteenth session: the CUDA tests on this tree, the API's new refusals on cuda, a CLI bench against NCCL
source scripts/gpu_env.sh
export PYTHONPATH=src
nvidia-smi -L > "$OUT/env.txt" 2>&1
timeout 300 python3 -m pytest -q -rs --durations=5 tests/cuda 2>&1 | tail -25 | tee "$OUT/pytest.log" || rc=1
timeout 120 python3 scripts/gpu_api_probe.py 2>&1 | tee "$OUT/api_cuda.log" || rc=1
timeout 200 python3 -m slicetrace.cli.main bench --backend cuda --compare nccl -b 64K -e 256M -f 4 -n 20 -w 5 2>&1 | tee "$OUT/cli_bench.log" || rc=1
exit $rc
