#!/usr/bin/env bash
# Second device call of session 27: the torch CPU tests and the signal tests on the GPU host (torch 2.11), and a
# Ctrl-C on a CUDA bench with a trace (scripts/gpu_ctrlc_check.py). Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
PYTHONPATH=src timeout 300 python3 -m pytest -q -rs -p no:cacheprovider --durations=8 tests/cpu/test_torch_tensors.py \
  tests/cpu/test_torchrun.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_torchrun_store.py \
  tests/cpu/test_launcher_errors.py tests/cpu/test_launcher_signals.py tests/cpu/test_interrupt_review.py \
  > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
for r in 1 2; do
  PYTHONPATH=src timeout 120 python3 scripts/gpu_ctrlc_check.py /tmp/ctrlc_$r 2 >> "$OUT/ctrlc.log" 2>&1
  echo "rc=$?" >> "$OUT/ctrlc.log"
done
