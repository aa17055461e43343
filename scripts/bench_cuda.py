#!/usr/bin/env python3
"""slicetrace's cuda backend vs NCCL (torch.distributed) in the same processes, on the same sizes, alternating.

Each rank drives CudaBackend directly (Work + plans) and torch.distributed's NCCL on the same stream; times
are CUDA-event medians over repetitions after warmup. Columns follow nccl-tests (size, time, algbw,
busbw); `ratio` is busbw(slicetrace) / busbw(NCCL). Also: all_reduce latency through CUDA graphs (small
sizes, launch overhead out), KernelStep on/off overhead, and a channel sweep.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=src python3 scripts/bench_cuda.py --max-bytes 1G --out bench.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid

from slicetrace.cli import sweep

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv")


def parse_size(s: str) -> int:
    return sweep.parse_size(s, "size")


def parse_variants(s: str) -> list[tuple[str, dict[str, str]]]:
    """'name:K=V,K=V;name2:K=V' -> [(name, {K: V})]: extra -D defines, measured beside the default build."""
    out = []
    for item in filter(None, s.split(";")):
        name, _, defs = item.partition(":")
        out.append((name, dict(d.split("=", 1) for d in defs.split(",") if d)))
    return out


def sizes(lo: int, hi: int, f: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= f
    return out


class Rank:
    def __init__(self, rank: int, world: int, port: int, cache: str, nch: int):
        import cupy
        import torch
        import torch.distributed as dist
        from slicetrace.backend.cuda.backend import CudaBackend
        from slicetrace.config import Settings
        from slicetrace.rendezvous import TorchStore
        torch.cuda.set_device(rank % torch.cuda.device_count())
        cupy.cuda.Device(rank % torch.cuda.device_count()).use()
        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=__import__("datetime").timedelta(seconds=120))
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world)
        self.rank, self.world, self.cp, self.torch, self.dist = rank, world, cupy, torch, dist
        self.be = CudaBackend(Settings(backend="cuda", cache_dir=cache, nchannels=nch), rank, world,
                              TorchStore(store), "bench")
        self.be.prepare(("float32",))
        self.tag = 0

    def timed(self, fn, iters: int, reps: int) -> float:
        cp = self.cp
        for _ in range(min(iters, 5)):
            fn()
        out = []
        for _ in range(reps):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            out.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / iters)
        return statistics.median(out)

    def work(self, func: str, nbytes: int, bufs, nch: int = 0, steps: bool = False, split: int = 0,
             chunk: int = 0):
        from slicetrace.backend.base import Work
        from slicetrace.plan.schedule import P2pPart, p2p_pieces, plan_collective, plan_p2p
        w, r = self.world, self.rank
        x, y = bufs
        if func == "send_recv":          # each direction split into `split` 16-byte aligned pieces (0: the API's)
            split = split or p2p_pieces(nbytes, self.be.channels_for(nbytes), 2 if w == 2 else 1, w)
            n = nbytes // 4
            per = ((n + split - 1) // split + 3) // 4 * 4 if split > 1 else n
            parts = []
            for peer, is_send, buf in (((r + 1) % w, True, x), ((r - 1) % w, False, y)):
                for lo in range(0, n, per):
                    m = min(per, n - lo)
                    parts.append((P2pPart(peer, is_send, m, len(parts)), buf[lo:lo + m]))
            plan = plan_p2p([p for p, _ in parts], w, r, 4, chunk or self.be.settings.p2p_chunk_bytes,
                            self.be.settings.step_bytes, nch or self.be.channels_for(nbytes))
            return Work(0, plan, "float32", "sum", parts=parts, stamp_steps=steps, stamp_channels=steps)
        total = nbytes // 4
        count = total // w if func in ("all_gather", "reduce_scatter") else total
        n_in = total if func == "reduce_scatter" else count
        n_out = total if func == "all_gather" else count
        plan = plan_collective(func, w, r, count, 4, 0, nch or self.be.channels_for(count * 4),
                               self.be.settings.step_bytes)
        return Work(0, plan, "float32", "sum", sendbuf=x[:n_in], recvbuf=y[:n_out], stamp_steps=steps,
                    stamp_channels=steps)

    def st_fn(self, work):
        be = self.be

        def fn():
            self.tag += 1
            work.tag = self.tag
            be.submit(work)
        return fn

    def nccl_fn(self, func: str, nbytes: int, tx, ty):
        dist, w, r = self.dist, self.world, self.rank
        total = nbytes // 4
        if func == "all_reduce":
            return lambda: dist.all_reduce(tx[:total])
        if func == "all_gather":
            return lambda: dist.all_gather_into_tensor(ty[:total], tx[:total // w])
        if func == "reduce_scatter":
            return lambda: dist.reduce_scatter_tensor(ty[:total // w], tx[:total])
        if func == "broadcast":
            return lambda: dist.broadcast(tx[:total], 0)
        if func == "reduce":
            return lambda: dist.reduce(tx[:total], 0)

        def sr():
            ops = [dist.P2POp(dist.isend, tx[:total], (r + 1) % w), dist.P2POp(dist.irecv, ty[:total], (r - 1) % w)]
            for q in dist.batch_isend_irecv(ops):
                q.wait()
        return sr

    def graph_us(self, func_fn_st, func_fn_nccl, iters: int) -> tuple[float, float]:
        """Per-op time of `iters` ops replayed from a CUDA graph (slicetrace, NCCL); nan when capture fails."""
        cp, torch = self.cp, self.torch
        res = []
        for kind in ("st", "nccl") if func_fn_nccl is not None else ("st",):
            try:
                if kind == "st":
                    s = cp.cuda.Stream(non_blocking=True)
                    work = func_fn_st
                    work.stream = s
                    with s:
                        s.begin_capture()
                        for _ in range(iters):
                            self.be.submit(work)
                        g = s.end_capture()
                    work.stream = None
                    launch = lambda: g.launch(s)
                    sync = s.synchronize
                else:
                    tg = torch.cuda.CUDAGraph()
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        func_fn_nccl()
                    torch.cuda.current_stream().wait_stream(side)
                    with torch.cuda.graph(tg):
                        for _ in range(iters):
                            func_fn_nccl()
                    launch, sync = tg.replay, torch.cuda.synchronize
                launch(); sync()
                times = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    launch(); sync()
                    times.append((time.perf_counter() - t0) * 1e6 / iters)
                res.append(statistics.median(times))
            except Exception as e:      # noqa: BLE001 - reported as nan
                if self.rank == 0:
                    print(f"graph capture ({kind}) failed: {type(e).__name__}: {e}", flush=True)
                res.append(float("nan"))
        return res[0], res[1] if len(res) > 1 else float("nan")


def iters_for(nbytes: int) -> int:
    return 200 if nbytes <= 1 << 20 else 40 if nbytes <= 1 << 26 else 8


def rank_main(rank: int, world: int, port: int, a: argparse.Namespace, q) -> None:
    try:
        R = Rank(rank, world, port, a.cache_dir, 0)
        cp, torch = R.cp, R.torch
        maxb = max([a.max_bytes, *a.overhead, *a.sweep, *a.p2p_sizes])   # every section's largest op fits
        x = cp.random.random(maxb // 4, dtype=cp.float32)
        y = cp.empty(maxb // 4, dtype=cp.float32)
        tx = torch.rand(maxb // 4, device="cuda")
        ty = torch.empty(maxb // 4, device="cuda")
        from slicetrace.plan.traffic import BUSBW_FACTOR
        rows = []
        for func in a.ops:
            for nbytes in sizes(a.min_bytes, a.max_bytes, a.factor):
                if func in ("all_gather", "reduce_scatter") and nbytes < 4 * world:
                    continue
                work = R.work(func, nbytes, (x, y))
                it = iters_for(nbytes)
                st, nc = [], []
                for _ in range(2):             # alternate the two libraries
                    st.append(R.timed(R.st_fn(work), it, a.reps))
                    nc.append(R.timed(R.nccl_fn(func, nbytes, tx, ty), it, a.reps))
                st_us, nc_us = min(st), min(nc)
                f = BUSBW_FACTOR[func](world)
                rows.append({"op": func, "bytes": nbytes, "st_us": st_us, "nccl_us": nc_us,
                             "st_busbw": nbytes / st_us / 1e3 * f, "nccl_busbw": nbytes / nc_us / 1e3 * f})
                if rank == 0 and a.verbose:
                    print(json.dumps(rows[-1]), flush=True)
        graph = []
        for nbytes in [s for s in sizes(8, 1 << 20, 8)] if a.graph else []:
            work = R.work("all_reduce", nbytes, (x, y))
            g_st, g_nc = R.graph_us(work, R.nccl_fn("all_reduce", nbytes, tx, ty), 50)
            graph.append({"bytes": nbytes, "st_us": g_st, "nccl_us": g_nc})
        over = []
        for (variant, defs), nbytes in [(v, n) for v in [("", {})] + a.variants for n in a.overhead]:
            if rank == 0 and a.verbose:
                print(f"overhead {variant} {nbytes}", flush=True)
            R.be.extra_defines = defs
            R.be.prepare(("float32",))
            w_off, w_on = R.work("all_reduce", nbytes, (x, y)), R.work("all_reduce", nbytes, (x, y), steps=True)
            w_ch = R.work("all_reduce", nbytes, (x, y))
            w_ch.stamp_channels = True
            off, on, ch = [], [], []
            for _ in range(3):
                off.append(R.timed(R.st_fn(w_off), iters_for(nbytes), a.reps))
                ch.append(R.timed(R.st_fn(w_ch), iters_for(nbytes), a.reps))
                on.append(R.timed(R.st_fn(w_on), iters_for(nbytes), a.reps))
            g_off, _ = R.graph_us(w_off, None, 50) if a.graph else (float("nan"), 0)
            g_on, _ = R.graph_us(w_on, None, 50) if a.graph else (float("nan"), 0)
            over.append({"variant": variant, "bytes": nbytes, "off_us": statistics.median(off), "on_us": statistics.median(on),
                         "ch_us": statistics.median(ch), "graph_off_us": g_off, "graph_on_us": g_on})
        R.be.extra_defines = {}
        gch = []
        for nbytes in [s for s in sizes(4096, 256 << 10, 2)] if a.graph_channels else []:
            for nch in a.graph_channels:
                work = R.work("all_reduce", nbytes, (x, y), nch=nch)
                g_st, _ = R.graph_us(work, None, 50)
                gch.append({"bytes": nbytes, "nch": nch, "st_us": g_st})
        p2p = []
        for nbytes in a.p2p_sizes:
            nc = R.timed(R.nccl_fn("send_recv", nbytes, tx, ty), iters_for(nbytes), a.reps)
            for split in a.p2p_split:
                for chunk in a.p2p_chunks:
                    work = R.work("send_recv", nbytes, (x, y), split=split, chunk=chunk)
                    t = R.timed(R.st_fn(work), iters_for(nbytes), a.reps)
                    p2p.append({"bytes": nbytes, "split": split, "chunk": chunk, "st_us": t, "nccl_us": nc})
        sweep = []
        for nbytes in a.sweep:
            for nch in a.sweep_channels:
                work = R.work("all_reduce", nbytes, (x, y), nch=nch)
                t = R.timed(R.st_fn(work), iters_for(nbytes), a.reps)
                sweep.append({"bytes": nbytes, "nch": nch, "us": t, "busbw": nbytes / t / 1e3 * 2 * (world - 1) / world})
        # correctness spot check of the last all_reduce shape
        R.be.close()
        R.dist.destroy_process_group()
        q.put((rank, {"rows": rows, "graph": graph, "overhead": over, "sweep": sweep, "graph_ch": gch, "p2p": p2p}))
    except BaseException as e:                 # noqa: BLE001 - shipped to the parent
        import traceback
        q.put((rank, {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}))


def fmt_size(b: int) -> str:
    for u, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= s:
            return f"{b / s:g}{u}"
    return f"{b}B"


def report(res: dict, world: int) -> str:
    lines = [f"# slicetrace cuda vs NCCL, {world} ranks, float32, sum (times: median of CUDA-event means)",
             f"{'op':<15}{'size':>8}{'st us':>11}{'st busbw':>10}{'nccl us':>11}{'nccl busbw':>11}{'ratio':>7}"]
    for r in res["rows"]:
        lines.append(f"{r['op']:<15}{fmt_size(r['bytes']):>8}{r['st_us']:>11.1f}{r['st_busbw']:>10.1f}"
                     f"{r['nccl_us']:>11.1f}{r['nccl_busbw']:>11.1f}{r['st_busbw'] / r['nccl_busbw']:>7.2f}")
    if res["graph"]:
        lines.append("# all_reduce latency from CUDA graph replay (us per op)")
        for g in res["graph"]:
            lines.append(f"graph          {fmt_size(g['bytes']):>8}{g['st_us']:>11.1f}{'':>10}{g['nccl_us']:>11.1f}"
                         f"{'':>11}{g['nccl_us'] / g['st_us'] if g['st_us'] == g['st_us'] else float('nan'):>7.2f}")
    if res["overhead"]:
        lines.append("# KernelStep overhead, all_reduce, us per op: stamps off, KernelCh only, KernelCh+KernelStep "
                     "(eager back-to-back), then the same off/on from CUDA-graph replay")
        for o in res["overhead"]:
            pct = lambda on, off: 100 * (on - off) / off          # noqa: E731
            label = f"overhead {o.get('variant', '')}"
            lines.append(f"{label:<15}{fmt_size(o['bytes']):>8}{o['off_us']:>11.1f}{o['ch_us']:>10.1f}"
                         f"{o['on_us']:>10.1f}{pct(o['on_us'], o['off_us']):>+9.2f}%   graph "
                         f"{o['graph_off_us']:.1f} -> {o['graph_on_us']:.1f} "
                         f"({pct(o['graph_on_us'], o['graph_off_us']):+.2f}%)")
    if res.get("graph_ch"):
        lines.append("# all_reduce graph-replay latency by channel count (us per op)")
        for g in res["graph_ch"]:
            lines.append(f"graph_ch       {fmt_size(g['bytes']):>8} nch={g['nch']:<4}{g['st_us']:>11.1f}")
    if res.get("p2p"):
        lines.append("# send_recv by split (pieces per direction) and chunk bytes (0 = default), vs NCCL")
        for g in res["p2p"]:
            bw, nbw = g["bytes"] / g["st_us"] / 1e3, g["bytes"] / g["nccl_us"] / 1e3
            lines.append(f"p2p            {fmt_size(g['bytes']):>8} split={g['split']:<3} chunk={g['chunk']:<8}"
                         f"{g['st_us']:>11.1f}{bw:>10.1f}{g['nccl_us']:>11.1f}{nbw:>11.1f}{bw / nbw:>7.2f}")
    if res["sweep"]:
        lines.append("# all_reduce channel sweep")
        for s in res["sweep"]:
            lines.append(f"sweep          {fmt_size(s['bytes']):>8} nch={s['nch']:<4}{s['us']:>11.1f}{s['busbw']:>10.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--ops", type=lambda s: s.split(","), default=list(OPS))
    p.add_argument("--min-bytes", type=parse_size, default=8)
    p.add_argument("--max-bytes", type=parse_size, default=1 << 30)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--graph", action="store_true", help="all_reduce latency through CUDA graphs, 8 B..1 MiB")
    p.add_argument("--overhead", type=lambda s: [parse_size(v) for v in s.split(",") if v], default=[])
    p.add_argument("--variants", type=parse_variants, default=[],
                   help="kernel build variants for --overhead too, e.g. 'nostores:ST_STORES=0;fast:A=1,B=2'")
    p.add_argument("--sweep", type=lambda s: [parse_size(v) for v in s.split(",") if v], default=[])
    p.add_argument("--sweep-channels", type=lambda s: [int(v) for v in s.split(",")], default=[8, 16, 32, 48, 64])
    p.add_argument("--graph-channels", type=lambda s: [int(v) for v in s.split(",") if v], default=[],
                   help="all_reduce graph latency, 4 KiB..256 KiB, at each of these channel counts")
    p.add_argument("--p2p-sizes", type=lambda s: [parse_size(v) for v in s.split(",") if v], default=[])
    p.add_argument("--p2p-split", type=lambda s: [int(v) for v in s.split(",")], default=[1, 8, 16, 32])
    p.add_argument("--p2p-chunks", type=lambda s: [parse_size(v) for v in s.split(",")], default=[0])
    p.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "slicetrace"))
    p.add_argument("--out", default="")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + uuid.uuid4().int % 2000
    procs = [ctx.Process(target=rank_main, args=(r, a.nranks, port, a, q)) for r in range(a.nranks)]
    for pr in procs:
        pr.start()
    out = {}
    try:
        for _ in procs:
            r, res = q.get(timeout=3000)
            out[r] = res
    finally:
        for pr in procs:
            pr.join(30)
        for pr in procs:
            if pr.is_alive():
                pr.kill()
    errs = {r: v["error"] for r, v in out.items() if "error" in v}
    if errs:
        for r, e in errs.items():
            print(f"rank {r} failed: {e}", file=sys.stderr)
        return 1
    print(report(out[0], a.nranks))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"world": a.nranks, **out[0]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
