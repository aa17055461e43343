"""all_to_all around the sizes where it was slow (2 MiB: 4-6 ms per op against NCCL's 50 us): CUDA-event time
per op, back to back and one at a time, with the own block copied beside the kernel (default) or in line.

    PYTHONPATH=src python3 scripts/gpu_a2a_probe.py
"""
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


if __name__ == "__main__":
    sizes = [1 << 20, 3 << 19, 2 << 20, 5 << 19, 3 << 20, 4 << 20, 8 << 20]
    for r in slicetrace.launch(body, 2, sizes, backend="cuda", timeout_s=20.0):
        print("\n".join(r), flush=True)
