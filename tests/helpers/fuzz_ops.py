"""Rank-side half of the randomized profiled runs (tests/cpu/test_fuzz_profiled.py): one communicator per case,
made with the case's settings and a recording plugin, the case's ops checked against numpy, then what the plugin
received, the loss counters and what the engine wrote (from each op's plan), handed back to the test process."""
from __future__ import annotations

import contextlib

import numpy as np

from tests.helpers.ref import data, mismatches, npdtype

PLUGINS = {"batch": "tests.helpers.recorder:Recorder", "slow": "tests.helpers.recorder:SlowRecorder"}
PLUGINS["both"] = f"{PLUGINS['batch']},{PLUGINS['slow']}"
PLUGINS["faulty"] = f"{PLUGINS['batch']},tests.helpers.recorder:Faulty"


def _sendrecv(comm, dtype, shifts, count, seed) -> int:
    """One group: for each shift d, a send to rank + d and a receive from rank - d (d = 0: to itself)."""
    n, r = comm.world_size, comm.rank
    outs, want = [], []
    with comm.group():
        for i, d in enumerate(shifts):
            comm.send(data(seed + i, r, count, dtype, "sum"), (r + d) % n)
            out = np.full(count, 55, npdtype(dtype))
            comm.recv(out, (r - d) % n)
            outs.append(out)
            want.append(data(seed + i, (r - d) % n, count, dtype, "sum").astype(np.float64))
    return sum(mismatches(o, w, npdtype(dtype)) for o, w in zip(outs, want))


def _written(works: list) -> tuple[int, int, int]:
    """(KernelStep records, KernelCh entries, slices sampled out) the engine writes for these works."""
    from slicetrace.plan.traffic import stamp_records
    steps = chs = skipped = 0
    for plan, st, sc, rate in works:
        for prog in plan.programs:
            k, s = stamp_records(prog, rate, st, False)
            steps, skipped = steps + k, skipped + s
            chs += 2 * sc
    return steps, chs, skipped


def run_case(ctx, key: str, kw: dict, plugin: str, ops: list, ctl: list) -> dict:
    """ops: ("coll", op, dtype, redop, count, root, inplace, seed) or ("p2p", dtype, shifts, count, seed); ctl, per
    op: (the plugins' new mask or None, profiling on, a comm.profiling(mask=) limit or None)."""
    import slicetrace
    from tests.cpu.test_collectives import run_case as coll_case
    from tests.helpers.recorder import RECORDERS
    from slicetrace.backend.cpu import worker
    worker.DIRECT_MIN = 1           # registered buffers: every slice direct (the 16 KiB default skips small ones)
    comm = slicetrace.init(rank=ctx["rank"], world_size=ctx["world"], store=ctx["store"], job=key,
                           profiler_plugin=PLUGINS[plugin], **kw)
    works: list = []
    try:
        sess = comm._session
        real = sess.run

        def run(work, info):              # what each op's plan makes the engine stamp
            try:
                return real(work, info)
            finally:
                works.append((work.plan, work.stamp_steps, work.stamp_channels, work.sample_rate))
        sess.run = run
        wrong = []
        mine = [RECORDERS[k] for k in RECORDERS if k[0] == comm.rank]
        for op, (pm, on, limit) in zip(ops, ctl):
            for rec in mine if pm is not None else ():
                rec.mask.value = pm             # a plugin may change its mask at any time
            with comm.profiling(on, mask=limit) if not on or limit is not None else contextlib.nullcontext():
                wrong.append(coll_case(comm, *op[1:]) if op[0] == "coll" else _sendrecv(comm, *op[1:]))
        comm.flush_profiler()
        recs = [RECORDERS.pop((comm.rank, name)) for name in ("recorder", "slow_recorder", "faulty")
                if (comm.rank, name) in RECORDERS]
        got = [rec.take() for rec in recs]
        counters = comm.drop_counters()
    finally:
        comm.close()
    steps, chs, skipped = _written(works)
    plugins = [dict(name=rec.name, final=rec.counters, finalized=rec.finalized, **g) for rec, g in zip(recs, got)]
    return dict(wrong=wrong, counters=counters, plugins=plugins, written_steps=steps, written_chs=chs,
                skipped=skipped, nworks=len(works))
