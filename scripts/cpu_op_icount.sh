#!/bin/sh
# Instructions per op (cachegrind "I refs", exact with ASLR off and a fixed hash seed) of cpu_op_icount.py:
# (total at HI ops - total at LO ops) / (HI - LO).  Usage: scripts/cpu_op_icount.sh LO HI ARGS...
# e.g. PYTHON=/tmp/venv/bin/python scripts/cpu_op_icount.sh 200 600 --mode ring --bytes 1M --steps
lo=$1 hi=$2; shift 2
py=${PYTHON:-python3}
ir() {
    n=$1; shift
    OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 PYTHONPATH=src setarch -R valgrind --tool=cachegrind --cache-sim=no \
        --cachegrind-out-file=/dev/null "$py" scripts/cpu_op_icount.py --ops "$n" "$@" 2>&1 |
        sed -n 's/.*I *refs: *//p' | tr -d ,
}
a=$(ir "$lo" "$@") b=$(ir "$hi" "$@")
echo "$* : $(( (b - a) / (hi - lo) )) instructions per op ($a at $lo ops, $b at $hi)"
