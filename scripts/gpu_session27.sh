#!/usr/bin/env bash
# One device call: the CUDA tests, the torch CPU tests, the signal tests, and the example plugin's writer probe
# for this tree against ./prev26 (git archive 6cb41e6 src), alternating. Logs in $OUT.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 330 python3 -m pytest -q -rs tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 100 python3 -m pytest -q -rs -p no:cacheprovider tests/cpu/test_torch_tensors.py \
  tests/cpu/test_torchrun.py tests/cpu/test_torchrun_reinit.py tests/cpu/test_torchrun_store.py \
  tests/cpu/test_launcher_errors.py tests/cpu/test_launcher_signals.py > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
mkdir -p /tmp/wp
for i in 1 2; do
  for t in src prev26/src; do
    echo "== $t run $i" >> "$OUT/writer.log"
    PYTHONPATH=$t timeout 50 python3 scripts/gpu_writer_probe.py 4000 16777216 /tmp/wp/t >> "$OUT/writer.log" 2>&1
    echo "rc=$?" >> "$OUT/writer.log"
  done
done
