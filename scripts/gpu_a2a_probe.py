"""all_to_all around the sizes where it was slow (2 MiB: 4-6 ms per op against NCCL's 50 us): CUDA-event time
per op, back to back and one at a time, with the own block copied beside the kernel (default) or in line.
--cli: the bench command's own sweep (bench_rank, 1-4 MiB, --compare nccl, -c 0) with every all_to_all call
timed on the host and by a CUDA event after it, per rank.

    PYTHONPATH=src python3 scripts/gpu_a2a_probe.py [--cli [--inline] [--nowrap] [--seed1234] [--rich] [--parent-cuda]]
"""
import sys
import time

import slicetrace


def body(comm, sizes):
    import cupy as cp
    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    be = comm._session.backend
    orig = be._self_copies
    out = []
    for inline in (False, True):
        be._self_copies = (lambda w, s, b, _o=orig: _o(w, s, False)) if inline else orig
        for nbytes in sizes:
            x = cp.ones(nbytes // 4, cp.float32)
            y = cp.empty_like(x)
            for _ in range(3):
                comm.all_to_all(x, y)
            comm.synchronize()
            comm.barrier()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            for _ in range(20):
                comm.all_to_all(x, y)
            e1.record()
            e1.synchronize()
            b2b = cp.cuda.get_elapsed_time(e0, e1) / 20 * 1e3
            one = []
            for _ in range(5):
                comm.barrier()
                t = time.perf_counter()
                comm.all_to_all(x, y)
                comm.synchronize()
                one.append((time.perf_counter() - t) * 1e6)
            ok = bool((y == 1).all())
            out.append(f"rank {comm.rank} {'inline' if inline else 'beside'} {nbytes >> 10:6d} KiB: back to back "
                       f"{b2b:8.1f} us/op, alone {min(one):8.1f}-{max(one):8.1f} us, correct {ok}")
    be._self_copies = orig
    return out


def cli_body(comm, opts):
    import cupy as cp
    from slicetrace.cli.bench import bench_rank
    orig, log = comm.all_to_all, []
    if "--inline" in sys.argv:                      # the own block copied in line, not beside the kernel
        be = comm._session.backend
        sc = be._self_copies
        be._self_copies = lambda w, s, b: sc(w, s, False)

    def timed(x, out=None, **k):
        t = time.perf_counter()
        r = orig(x, out, **k)
        e = cp.cuda.Event()
        e.record(cp.cuda.get_current_stream())
        log.append((x.nbytes, t, time.perf_counter(), e))
        return r
    import os
    import threading
    aff0 = sorted(os.sched_getaffinity(0))
    if "--nowrap" not in sys.argv:
        comm.all_to_all = timed
    prog = None
    if "--rich" in sys.argv and comm.rank == 0:     # the bench command's progress bar (it shows one on a tty)
        from rich.progress import Progress
        prog = Progress(transient=True)
        prog.start()
    tty = sys.stderr.isatty()
    rows = bench_rank(comm, opts)
    if prog is not None:
        prog.stop()
    aff1 = sorted(os.sched_getaffinity(0))
    cp.cuda.runtime.deviceSynchronize()
    out, by = [], {}
    for nb, t0, t1, e in log:
        by.setdefault(nb, []).append((t0, t1, e))
    for nb, ent in by.items():
        timed_block = ent[-20:]                     # the last 20 calls of a size are the timed block
        gaps = [cp.cuda.get_elapsed_time(a[2], b[2]) * 1e3 for a, b in zip(timed_block, timed_block[1:])]
        enq = [(b - a) * 1e6 for a, b, _ in timed_block]
        out.append(f"rank {comm.rank} {nb >> 10} KiB: {len(ent)} calls; timed block: enqueue us "
                   f"min/med/max {min(enq):.0f}/{sorted(enq)[10]:.0f}/{max(enq):.0f}, GPU gaps between ops us "
                   f"{' '.join(f'{g:.0f}' for g in gaps)}")
    out.append(f"rank {comm.rank} cpu affinity before {len(aff0)} cpus {aff0[:4]}..., after {len(aff1)} cpus "
               f"{aff1[:8]}; threads {threading.active_count()}; stderr is a tty: {tty}")
    if comm.rank == 0:
        out += [f"row {r['size'] >> 10} KiB: {r['time_us']:.1f} us, ref {r.get('ref_time_us', 0):.1f} us" for r in rows]
    return out


if __name__ == "__main__" and "--cli" in sys.argv:
    opts = {"sizes": [1 << 20, 2 << 20, 4 << 20], "ops": ["all_to_all"], "dtype": "float32", "redop": "sum",
            "root": 0, "iters": 20, "warmup": 5, "check": False, "compare": "nccl", "overhead": False,
            "rounds": 1, "seed": 1234 if "--seed1234" in sys.argv else 0, "inplace": False}
    if "--parent-cuda" in sys.argv:                 # as the bench command does to count the GPUs
        import cupy
        print("parent sees", cupy.cuda.runtime.getDeviceCount(), "GPUs", flush=True)
    for r in slicetrace.launch(cli_body, 2, opts, backend="cuda", timeout_s=30.0):
        print("\n".join(r), flush=True)
elif __name__ == "__main__":
    sizes = [1 << 20, 3 << 19, 2 << 20, 5 << 19, 3 << 20, 4 << 20, 8 << 20]
    for r in slicetrace.launch(body, 2, sizes, backend="cuda", timeout_s=20.0):
        print("\n".join(r), flush=True)
