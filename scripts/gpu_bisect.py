"""Which op transition stalls on the GPU? Each sequence in a fresh job, bounded waits."""

import slicetrace


def seq(comm, names):
    import cupy as cp
    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    x = cp.random.standard_normal(16 << 20, dtype=cp.float32)
    small = x[: 1 << 20]
    ops = {"AR64M": lambda: comm.all_reduce(x, cp.empty_like(x)), "AR1001": lambda: comm.all_reduce(x[:1001]),
           "AR4K": lambda: comm.all_reduce(x[:1024]), "BC4M": lambda: comm.broadcast(small, root=0),
           "RD4M": lambda: comm.reduce(small, root=0), "BC1001": lambda: comm.broadcast(x[:1001], root=0),
           "AG4M": lambda: comm.all_gather(small), "RS4M": lambda: comm.reduce_scatter(small), "AR4M": lambda: comm.all_reduce(small)}
    log = []
    for name in names:
        try:
            ops[name]()
            comm.synchronize()
            log.append(name)
        except Exception:
            log.append(f"{name} STALL")
            break
    return " ".join(log)


if __name__ == "__main__":
    for names in (["BC4M", "RD4M", "AR1001"], ["AR64M", "AG4M", "RS4M", "BC4M", "RD4M", "AR1001", "AR64M"],
                  ["BC1001", "RD4M", "AR4M", "BC4M", "RD4M", "AG4M"]):
        try:
            r = slicetrace.launch(seq, 2, names, backend="cuda", timeout_s=5.0, join_timeout_s=40)
            print(names, "->", r[0], flush=True)
        except Exception as e:
            print(names, "-> launch failed", str(e).splitlines()[0][:200], flush=True)
