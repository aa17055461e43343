"""all_to_all around the sizes where it was slow (2 MiB: 4-6 ms per op against NCCL's 50 us): CUDA-event time
per op, back to back and one at a time, with the own block copied beside the kernel (default) or in line.
--cli: the bench command's own sweep (bench_rank, 1-4 MiB, --compare nccl, -c 0) with every all_to_all call
timed on the host and by a CUDA event after it, per rank.

    PYTHONPATH=src python3 scripts/gpu_a2a_probe.py [--cli [--inline] [--nowrap] [--seed1234] [--rich] [--parent-cuda]]
    PYTHONPATH=src python3 scripts/gpu_a2a_probe.py --after none|sleep|ops|nccl|gc     (one fresh pair of ranks each)
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


def after_body(comm, mode: str) -> str:
    """Our all_to_all per op (CUDA events) right after torch's NCCL ran its first all_to_all, with `mode` in
    between: none, sleep (2 s), ops (200 of our all_reduce), nccl (50 more NCCL all_to_all), gc (gc.collect()).
    Python's garbage collections during the timed ops are listed with their generation and duration."""
    import gc
    import cupy as cp
    from slicetrace.cli.reference import TorchReference
    cp.cuda.Device(comm.rank).use()
    ref = TorchReference("nccl", comm.rank, comm.world_size, comm._session.job, device=comm.rank)
    x = cp.ones((2 << 20) // 4, cp.float32)
    y = cp.empty_like(x)

    def ours(n: int) -> list[float]:
        ev = [cp.cuda.Event() for _ in range(n + 1)]
        ev[0].record()
        for i in range(n):
            comm.all_to_all(x, y)
            ev[i + 1].record()
        ev[-1].synchronize()
        return [cp.cuda.get_elapsed_time(a, b) * 1e3 for a, b in zip(ev, ev[1:])]
    before = ours(20)
    comm.barrier()
    ref.run("all_to_all", x, y, "sum", 0)
    ref.sync()
    comm.barrier()
    t0 = time.perf_counter()
    if mode == "sleep":
        time.sleep(2.0)
    elif mode == "ops":
        for _ in range(200):
            comm.all_reduce(x, y)
        comm.synchronize()
    elif mode == "nccl":
        for _ in range(50):
            ref.run("all_to_all", x, y, "sum", 0)
        ref.sync()
    elif mode == "gc":
        gc.collect()
    comm.barrier()
    between = (time.perf_counter() - t0) * 1e3
    gcs, t_gc = [], [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            t_gc[0] = time.perf_counter()
        else:
            gcs.append(f"gen{info['generation']} {(time.perf_counter() - t_gc[0]) * 1e3:.1f} ms")
    gc.callbacks.append(on_gc)
    after = ours(30)
    gc.callbacks.remove(on_gc)
    ref.close()
    fmt = lambda v: " ".join(f"{u:.0f}" for u in v)     # noqa: E731
    return (f"rank {comm.rank} mode {mode} ({between:.0f} ms between): before, us per op: {fmt(before[-5:])}; "
            f"after NCCL's first all_to_all: {fmt(after)}; sum after {sum(after) / 1e3:.1f} ms; "
            f"collections during it: {', '.join(gcs) or 'none'}")


if __name__ == "__main__" and "--after" in sys.argv:
    mode = sys.argv[sys.argv.index("--after") + 1]
    for r in slicetrace.launch(after_body, 2, mode, backend="cuda", timeout_s=30.0):
        print(r, flush=True)
elif __name__ == "__main__" and "--cli" in sys.argv:
    opts = {"sizes": [1 << 20, 2 << 20, 4 << 20], "ops": ["all_to_all"], "dtypes": ["float32"], "redops": ["sum"],
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
