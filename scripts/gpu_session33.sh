#!/usr/bin/env bash
# One device call (session 33): the whole CUDA test folder (send_recv messages counted right after the launch; the
# host's cheaper event path), the torch CPU tests, then a traced 2-rank cuda bench with ProxyCtrl in the mask, the converter's check of its flow instants, and report.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L > "$OUT/smi.txt" 2>&1
PYTHONPATH=src timeout 400 python3 -m pytest -q -rs --durations=15 tests/cuda -p no:cacheprovider > "$OUT/cuda.log" 2>&1
echo "rc=$?" >> "$OUT/cuda.log"
PYTHONPATH=src timeout 150 python3 -m pytest -q -rs tests/cpu/test_torch_tensors.py tests/cpu/test_torchrun.py tests/cpu/test_torchrun_store.py tests/cpu/test_torchrun_reinit.py -p no:cacheprovider > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"
mkdir -p "$OUT/gtr"
SLICETRACE_PROFILE_EVENT_MASK=$((2|4|32|64|65536)) PYTHONPATH=src timeout 120 python3 -m slicetrace bench --backend cuda \
  --ranks 2 --op all_reduce,send_recv -b 64K -e 16M -f 4 -n 5 -w 2 -T 30 --trace "$OUT/gtr" > "$OUT/bench.log" 2>&1 || rc=1
PYTHONPATH=src timeout 100 python3 scripts/convert_check.py "$OUT/gtr/trace" "$OUT/g.pftrace" > "$OUT/convert.log" 2>&1 || rc=1
PYTHONPATH=src timeout 60 python3 - "$OUT/gtr" > "$OUT/proxy.log" 2>&1 <<'PY' || rc=1
import collections, glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f)); ev = d["traceEvents"] if isinstance(d, dict) else d
    print(f, collections.Counter((e.get("name"), e.get("ph")) for e in ev if e.get("cat") == "PROXY"))
PY
rm -f "$OUT/g.pftrace"
exit $rc
