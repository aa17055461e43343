#!/usr/bin/env bash
# One device call (session 28): the CUDA tests, the torch CPU tests with the signal tests (torch 2.11), and a
# Ctrl-C on a traced 2-rank CUDA bench (gpu_ctrlc_check.py). Carry .kcache (prebuild_kernels.py). Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 330 python3 -m pytest -q -rs --durations=10 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/cpu/test_torch_tensors.py \
  tests/cpu/test_torchrun.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_torchrun_store.py \
  tests/cpu/test_launcher_signals.py tests/cpu/test_interrupt_review.py > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
PYTHONPATH=src timeout 90 python3 scripts/gpu_ctrlc_check.py /tmp/ctrlc_1 2 >> "$OUT/ctrlc.log" 2>&1
echo "rc=$?" >> "$OUT/ctrlc.log"
