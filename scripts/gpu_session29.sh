#!/usr/bin/env bash
# One device call (session 29): the whole CUDA test folder (with the 1 GiB case the last session's time missed),
# then, if time is left, the torch CPU tests with the signal tests (torch 2.11). Carry .kcache. Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 420 python3 -m pytest -q -rs --durations=15 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 140 python3 -m pytest -q -rs -p no:cacheprovider tests/cpu/test_torch_tensors.py \
  tests/cpu/test_torchrun.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_torchrun_store.py \
  tests/cpu/test_launcher_signals.py tests/cpu/test_interrupt_review.py > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
