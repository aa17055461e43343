"""GPU acceptance through the public API: traced ops -> trace invariants, traffic, cross-GPU causality within
the reported clock uncertainty, and drop counts of 10-second profiled all_reduce loops.

    python3 scripts/gpu_trace_check.py OUTDIR [--seconds 10] [--size 256M] [--timeout 120]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import time

import slicetrace
from slicetrace.analyze.trace import check_trace, kernel_steps, load_traces
from slicetrace.cli.sweep import parse_size
from slicetrace.plan.schedule import plan_collective
from slicetrace.plan.traffic import expected_slices

FUNCS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
         "Broadcast": "broadcast", "Reduce": "reduce"}


def _device(comm):
    import cupy as cp
    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    return cp


def traced(comm, nbytes):
    import faulthandler
    faulthandler.dump_traceback_later(60, exit=True)     # a hang shows every thread's stack
    cp = _device(comm)
    n = nbytes // 4
    x = cp.random.standard_normal(n, dtype=cp.float32)
    w = comm.world_size
    comm.all_reduce(x, cp.empty_like(x))
    small = x[: n // 16 // w * w]
    comm.all_gather(small)
    comm.reduce_scatter(small)
    comm.broadcast(small, root=0)
    comm.reduce(small, root=0)
    comm.all_reduce(x[:1001])
    cp.cuda.runtime.deviceSynchronize()
    comm.flush_profiler()
    be = comm._session.backend
    plans = {}
    for func, count in (("all_reduce", n), ("all_gather", len(small)), ("reduce_scatter", len(small) // w),
                        ("broadcast", len(small)), ("reduce", len(small)), ("all_reduce", 1001)):
        plan = plan_collective(func, w, comm.rank, count, 4, 0, be.channels_for(count * 4), comm.settings.step_bytes)
        plans[(func, count)] = sorted((c, s, p, b) for c, s, p, _, b in expected_slices(plan))
    return comm.drop_counters(), comm._session.clock_uncertainty_ns, {f"{k[0]}/{k[1]}": v for k, v in plans.items()}


def loop(comm, nbytes, seconds):
    import faulthandler
    faulthandler.dump_traceback_later(seconds + comm.settings.timeout_s + 30, exit=True)   # after the library's own
    cp = _device(comm)
    x = cp.random.standard_normal(nbytes // 4, dtype=cp.float32)
    out = cp.empty_like(x)
    go = cp.ones(1, dtype=cp.int32)
    comm.barrier()
    t0, ops = time.monotonic(), 0
    while True:
        for _ in range(20):
            comm.all_reduce(x, out)
        ops += 20
        comm.synchronize()          # the library's wait: a stuck kernel becomes its timeout error, then abort
        # Rank 0's clock decides for everyone: ranks that each read their own clock can disagree on the last
        # block, and a rank that runs one more block waits for a peer that has left.
        go.fill(int(time.monotonic() - t0 < seconds))
        comm.broadcast(go, go, root=0)           # in place (out=None would return a new array)
        if not int(go.get()[0]):
            break
    comm.flush_profiler()
    c = comm.drop_counters()
    return ops, {k: v for k, v in c.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=lambda s: parse_size(s, "--size"), default=256 << 20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="the library's timeout_s")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    prefix = os.path.join(a.out, "trace")
    for old in glob.glob(prefix + "_*_*.json"):               # an earlier run's files would be read as this one's
        os.remove(old)
    kw = dict(backend="cuda", profiler_plugin="example", timeout_s=a.timeout)
    res = slicetrace.launch(traced, a.ranks, a.size, profile_dump_file=prefix, **kw)
    print("traced ops done", flush=True)
    files = sorted(glob.glob(prefix + "_*_*.json"))          # trace_<commHash>_<rank>.json
    report = {"files": len(files), "problems": {f: check_trace(f)[:5] for f in files}}
    recs = load_traces(files)
    ks = kernel_steps(recs)
    colls = {(r["pid"], r["id"]): r for r in recs if r.get("ph") == "b" and r.get("cat") == "COLL"}
    traffic_ok, traffic_bad = 0, []
    for (rank, oid), c in colls.items():
        key = f"{FUNCS[c['name']]}/{c['args']['Count']}"
        want = res[rank][2].get(key)
        m = ks[(ks["rank"] == rank) & (ks["op"] == oid)]
        got = sorted((int(r["channel"]), bool(r["is_send"]), int(r["peer"]), int(r["size"])) for r in m)
        if want is not None and [tuple(x) for x in want] == got:
            traffic_ok += 1
        else:
            traffic_bad.append((rank, key, len(got), len(want or [])))
    unc = [r[1] for r in res]
    # ring and p2p connections count steps apart; both ends of a connection share its channel
    def kind(r):
        return (int(r["rank"]), int(r["op"])) in colls
    sends = {(kind(r), int(r["rank"]), int(r["peer"]), int(r["channel"]), int(r["step"])): int(r["done_ns"])
             for r in ks[ks["is_send"] == 1]}
    pairs = viol = 0
    worst = 0
    for r in ks[ks["is_send"] == 0]:
        k = (kind(r), int(r["peer"]), int(r["rank"]), int(r["channel"]), int(r["step"]))
        if k in sends:
            pairs += 1
            margin = int(r["ready_ns"]) - sends[k]
            worst = min(worst, margin)
            if margin < -(unc[int(r["rank"])] + unc[int(r["peer"])]):
                viol += 1
    nest = sum(len(v) for v in report["problems"].values())
    report.update(kernel_steps=len(ks), colls=len(colls), traffic_ok=traffic_ok, traffic_bad=traffic_bad[:10],
                  causality_pairs=pairs, causality_violations=viol, worst_margin_ns=worst,
                  clock_uncertainty_ns=unc, counters=[r[0] for r in res], nesting_problems=nest)
    for size in (1 << 20, 1 << 30):
        try:
            ops = slicetrace.launch(loop, a.ranks, size, a.seconds, **kw)
        except slicetrace.errors.LaunchError as e:
            ops = f"FAILED: {e}"
        print(f"loop {size}: {ops}", flush=True)
        report[f"loop_{size}"] = ops
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    short = {k: v for k, v in report.items() if k not in ("problems", "counters")}
    print(json.dumps(short, indent=1, default=str))


if __name__ == "__main__":
    main()
