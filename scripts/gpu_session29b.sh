#!/usr/bin/env bash
# Session 29's last device call: the CUDA tests that reach the group lock and the at-exit finish (point-to-point,
# threads, faults), then the torch 2.11 CPU tests with the signal tests. Carry .kcache. Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
PYTHONPATH=src timeout 300 python3 -m pytest -q -rs tests/cuda/test_p2p_api.py tests/cuda/test_p2p_review.py \
  tests/cuda/test_threads.py tests/cuda/test_faults.py -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 140 python3 -m pytest -q -rs -p no:cacheprovider tests/cpu/test_torch_tensors.py \
  tests/cpu/test_torchrun.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_torchrun_store.py \
  tests/cpu/test_launcher_signals.py tests/cpu/test_interrupt_review.py tests/cpu/test_api_review.py > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
