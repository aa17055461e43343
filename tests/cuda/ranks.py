"""Functions run inside rank processes (spawned; they must be importable). ctx: rank, world, store, job, state."""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from slicetrace.backend.base import Work
from slicetrace.config import Settings
from slicetrace.plan.schedule import P2pPart, plan_collective, plan_p2p
from slicetrace.stamps.layout import provisional_word

NP = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int64": np.int64, "float16": np.float16,
      "float32": np.float32, "float64": np.float64, "bfloat16": np.float32}
INTS = ("int8", "uint8", "int32", "int64")


def setup(ctx: dict, kw: dict) -> int:
    import cupy
    from slicetrace.backend.cuda.backend import CudaBackend
    old = ctx["state"].pop("be", None)
    if old is not None:
        old.close()
    kw = dict(kw)
    dtypes = kw.pop("dtypes", ("float32",))
    s = Settings(backend="cuda", **kw)
    be = CudaBackend(s, ctx["rank"], ctx["world"], ctx["store"], ctx["job"])
    ctx["state"]["be"] = be
    ctx["state"]["close"] = be.close
    ctx["state"]["tag"] = 0
    be.prepare(dtypes)
    return be.device


def prepare(ctx: dict, dtypes: tuple) -> list:
    """Every kernel variant of these dtypes compiled or loaded: its (dtype, steps) keys with a function handle."""
    be = ctx["state"]["be"]
    be.prepare(dtypes)
    return sorted(k for k, f in be._fns.items() if f)


def inputs(seed: int, rank: int, n: int, dtype: str, op: str) -> np.ndarray:
    """Deterministic random input of a rank (every rank can rebuild every other rank's input)."""
    rng = np.random.default_rng([seed, rank])
    if dtype in INTS:
        lo, hi = (0, 4) if dtype == "uint8" else (-3, 4)
        if op in ("sum", "avg") and dtype in ("int32", "int64"):
            lo, hi = -1000, 1000
        return rng.integers(lo, hi, n).astype(NP[dtype])
    if op == "prod":
        return (0.5 + rng.random(n, dtype=np.float32)).astype(NP[dtype])
    return rng.standard_normal(n, dtype=np.float32).astype(NP[dtype])


def with_nans(x: np.ndarray, rank: int, world: int) -> np.ndarray:
    """x with NaNs: some of this rank's own, some shared with other ranks, and every 97th on every rank."""
    x = x.copy()
    x[rank::world + 1] = np.nan
    x[::97] = np.nan
    return x


def to_device(x: np.ndarray, dtype: str, device: int) -> Any:
    import cupy
    if dtype != "bfloat16":
        return cupy.asarray(x)
    import torch
    return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).to(f"cuda:{device}")


def to_host(buf: Any, dtype: str) -> np.ndarray:
    import cupy
    from slicetrace.backend.cuda.buffers import RawBuf
    if isinstance(buf, RawBuf):
        return buf.owner.float().cpu().numpy()[: buf.count]
    if type(buf).__module__.startswith("torch"):
        return buf.float().cpu().numpy()
    return cupy.asnumpy(buf)


def poisoned(be: Any, like: Any, n: int) -> Any:
    import cupy
    from slicetrace.backend.cuda.buffers import RawBuf, pointer
    out = be.empty_like(like, n)
    if n:
        nbytes = n * (like.itemsize if isinstance(like, RawBuf) else like.dtype.itemsize)
        cupy.cuda.runtime.memset(pointer(out), 0x7B, nbytes)
    return out


def run_coll(ctx: dict, func: str, dtype: str, op: str, count: int, root: int, seed: int,
             nchannels: int = 0, steps: bool = False, wait_s: float = 0.0, nans: bool = False,
             late_s: float = 0.0) -> dict:
    """Run one collective (late_s after the ranks met); return this rank's output (host) for the test to check."""
    be = ctx["state"]["be"]
    r, w = ctx["rank"], ctx["world"]
    n_in = count * w if func == "reduce_scatter" else count
    n_out = count * w if func == "all_gather" else count
    x = inputs(seed, r, n_in, dtype, op)
    x = to_device(with_nans(x, r, w) if nans else x, dtype, be.device)
    send, _, _ = be.as_buffer(x, "x")
    recv = poisoned(be, send, n_out)
    it = np.dtype(NP[dtype]).itemsize if dtype != "bfloat16" else 2
    nch = nchannels or be.channels_for(count * it)
    plan = plan_collective(func, w, r, count, it, root, nch, be.settings.step_bytes)
    ctx["state"]["tag"] += 1
    work = Work(ctx["state"]["tag"], plan, dtype, op, sendbuf=send, recvbuf=recv,
                stamp_steps=steps, stamp_channels=steps, sample_rate=be.settings.sample_rate)
    ctx["store"].barrier(f"coll/{work.tag}", r, w, 300.0)     # big inputs take long to make: start together
    time.sleep(late_s)
    before = be.rings.header["reserved"].astype(np.int64)
    tok = be.submit(work)
    be.wait(tok, wait_s or be.settings.timeout_s)
    nres = int((be.rings.header["reserved"].astype(np.int64) - before).sum())   # stamp seqs the host reserved
    return {"out": to_host(recv, dtype), "tag": work.tag, "reserved": nres}


def run_p2p(ctx: dict, dtype: str, count: int, seed: int, pattern: str, nchannels: int = 4,
            steps: bool = False) -> dict:
    """pattern 'ring': send to r+1, recv from r-1; 'multi': three of each (connections 0-2 of one peer, each
    counting its steps from the same start); 'a2a': a block to and from every rank (self included)."""
    be = ctx["state"]["be"]
    r, w = ctx["rank"], ctx["world"]
    it = np.dtype(NP[dtype]).itemsize if dtype != "bfloat16" else 2
    reps = 3 if pattern == "multi" else 1
    peers = [(r + 1) % w] * reps if pattern in ("ring", "multi") else list(range(w))
    src_of = [(r - 1) % w] * reps if pattern in ("ring", "multi") else list(range(w))
    parts, outs = [], []
    for j, (to, frm) in enumerate(zip(peers, src_of)):
        x = to_device(inputs(seed + to, r, count, dtype, "sum"), dtype, be.device)
        sb, _, _ = be.as_buffer(x, "x")
        rb = poisoned(be, sb, count)
        parts.append((P2pPart(to, True, count, 2 * j), sb))
        parts.append((P2pPart(frm, False, count, 2 * j + 1), rb))
        outs.append((frm, rb))
    plan = plan_p2p([p for p, _ in parts], w, r, it, be.settings.p2p_chunk_bytes, be.settings.step_bytes, nchannels)
    ctx["state"]["tag"] += 1
    work = Work(ctx["state"]["tag"], plan, dtype, "sum", parts=parts, stamp_steps=steps, stamp_channels=steps)
    before = be.rings.header["reserved"].astype(np.int64)
    be.wait(be.submit(work), be.settings.timeout_s)
    nres = int((be.rings.header["reserved"].astype(np.int64) - before).sum())
    return {"outs": [(frm, to_host(b, dtype)) for frm, b in outs], "tag": work.tag, "reserved": nres}


def stamps(ctx: dict, tag: int) -> dict:
    """Published entries of op `tag` per channel in seq order, and the clock offset."""
    be = ctx["state"]["be"]
    v = be.rings
    top = v.header["reserved"].astype(np.int64)
    be.fetch_stamps(np.maximum(top - v.slots, 0), top)     # the ops are done: bring their records to the host
    off, unc = be.clock_sync()
    out = {}
    for ch in range(v.nchannels):
        top = int(v.header["reserved"][ch])
        if not top:
            continue
        seqs = np.arange(max(1, top - v.slots + 1), top + 1, dtype=np.uint64)
        idx = (seqs & np.uint64(v.slots - 1)).astype(np.intp)
        st, co = v.started[ch][idx].copy(), v.completed[ch][idx].copy()
        # after the op completed its provisional seq words count as published (stamps.layout)
        prov = np.uint64(provisional_word(0, tag)) | (seqs & np.uint64(0xFFFFFFFF))
        pub = [(w == seqs) | (w == prov) for w in (st["seq"], co["seq"])]
        ok = pub[0] & pub[1] & (st["op"] == (tag & 0xFFFFFFFF))
        if ok.any():
            out[ch] = (st[ok], co[ok])
    return {"stamps": out, "offset": off, "unc": unc, "sampled": int(v.header["sampled_out"].sum()),
            "reserved": v.header["reserved"].copy()}


def plan_expected(ctx: dict, func: str, dtype_size: int, count: int, nchannels: int) -> list:
    from slicetrace.plan.traffic import expected_slices
    be = ctx["state"]["be"]
    plan = plan_collective(func, ctx["world"], ctx["rank"], count, dtype_size, 0, nchannels, be.settings.step_bytes)
    return expected_slices(plan)


def start_many(ctx: dict, count: int, nops: int, die: bool) -> float:
    """Enqueue nops all_reduces; with die, leave the process while they run (a peer dying mid-collective)."""
    import cupy
    be = ctx["state"]["be"]
    x = cupy.ones(count, dtype=cupy.float32)
    y = cupy.empty_like(x)
    plan = plan_collective("all_reduce", ctx["world"], ctx["rank"], count, 4, 0, be.channels_for(count * 4),
                           be.settings.step_bytes)
    for i in range(nops):
        ctx["state"]["tag"] += 1
        ctx["state"]["last"] = be.submit(Work(ctx["state"]["tag"], plan, "float32", "sum", sendbuf=x, recvbuf=y))
    if die:
        os._exit(3)
    return time.monotonic()


def wait_last(ctx: dict, timeout_s: float) -> dict:
    """Wait for the last op started; its error, and a small sum the GPU must compute afterwards. `elapsed` is
    printed by the tests, never asserted (how an error was found is told by its type and message)."""
    import cupy
    be = ctx["state"]["be"]
    t0 = time.monotonic()
    err = None
    try:
        be.wait(ctx["state"]["last"], timeout_s)
    except Exception as e:               # noqa: BLE001 - reported to the test
        err = f"{type(e).__name__}: {e}"
    elapsed = time.monotonic() - t0
    z = cupy.arange(1000, dtype=cupy.float32).sum()     # the GPU must be free again
    cupy.cuda.runtime.deviceSynchronize()
    return {"err": err, "elapsed": elapsed, "z": float(z)}


def user_sync(ctx: dict, count: int) -> dict:
    """The user's own device synchronize (not the communicator's wait) after ops a dead peer cannot finish: the
    watchdog must abort them; the next op then says why."""
    import cupy
    be = ctx["state"]["be"]
    t0 = time.monotonic()
    cupy.cuda.runtime.deviceSynchronize()
    elapsed = time.monotonic() - t0
    err = None
    try:
        start_many(ctx, count, 1, False)
    except Exception as e:               # noqa: BLE001 - reported to the test
        err = f"{type(e).__name__}: {e}"
    z = cupy.arange(1000, dtype=cupy.float32).sum()
    cupy.cuda.runtime.deviceSynchronize()
    return {"err": err, "elapsed": elapsed, "z": float(z), "broken": be.broken}


def close_backend(ctx: dict) -> None:
    """This rank leaves the communicator (its peers may still have work that needs it)."""
    ctx["state"].pop("close", None)
    ctx["state"].pop("be").close()


def free_bytes(ctx: dict) -> int:
    """Free memory of this rank's device (its context made first, so that is not counted as a change)."""
    import cupy
    cupy.cuda.Device(ctx["rank"] % cupy.cuda.runtime.getDeviceCount()).use()
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1 << 20))
    cupy.cuda.runtime.deviceSynchronize()
    return cupy.cuda.runtime.memGetInfo()[0]


def failed_setup(ctx: dict, kw: dict, how: str) -> str:
    """A CudaBackend whose set-up fails: 'peer' (rank 0 alone: the peer's IPC handle never comes, inside
    CommMemory) or 'late' (after CommMemory: the liveness record cannot be published). Returns the error."""
    import cupy
    from slicetrace.backend.cuda import backend as cb
    cupy.cuda.Device(ctx["rank"] % cupy.cuda.runtime.getDeviceCount()).use()
    orig = cb.PeerWatch.publish
    if how == "late":
        def refuse(self):
            raise RuntimeError("publish refused by the test")
        cb.PeerWatch.publish = refuse
    try:
        cb.CudaBackend(Settings(backend="cuda", **kw), ctx["rank"], ctx["world"], ctx["store"], ctx["job"] + how)
        return "no error"
    except Exception as e:  # noqa: BLE001 - reported to the test
        return f"{type(e).__name__}: {e}"
    finally:
        cb.PeerWatch.publish = orig


def mismatch_case(ctx: dict, cases: list, wait_s: float, next_op: bool = True) -> dict:
    """Collective cases[rank] (func, dtype, op, count, root: the ranks disagree; late_s: start that much after
    the peer; no_watchdog: stop this rank's first), then (next_op) a matching all_reduce, then close; stops at the
    first error. Returns it ('Type: message'), where it came, and a sum the GPU must compute afterwards."""
    import cupy
    c, err, where = cases[ctx["rank"]], None, None
    if c.get("no_watchdog"):
        ctx["state"]["be"]._dog.stop()
    steps = (("op", lambda: run_coll(ctx, c["func"], c["dtype"], c.get("op", "sum"), c["count"], c.get("root", 0),
                                    1, wait_s=wait_s, late_s=c.get("late_s", 0.0))),
             ("next op", lambda: _unsynced_all_reduce(ctx, wait_s) if next_op else None),
             ("close", lambda: close_backend(ctx)))
    for where, fn in steps:
        try:
            fn()
        except Exception as e:           # noqa: BLE001 - reported to the test
            err = f"{type(e).__name__}: {e}"
            break
    z = cupy.arange(1000, dtype=cupy.float32).sum()
    cupy.cuda.runtime.deviceSynchronize()
    return {"err": err, "where": where if err else None, "z": float(z)}


def _unsynced_all_reduce(ctx: dict, wait_s: float) -> None:
    """A float32 all_reduce of 1000 without run_coll's start barrier (a peer that raised never comes to it)."""
    start_many(ctx, 1000, 1, False)
    ctx["state"]["be"].wait(ctx["state"]["last"], wait_s)


def abort_now(ctx: dict, reason: str) -> None:
    """This rank aborts the communicator (as its own timeout or error path would)."""
    ctx["state"]["be"].abort(reason)


def submit_after_abort(ctx: dict, timeout_s: float) -> dict:
    """Once the last op ended (on the peer's abort word), enqueue another without waiting on the first: it must
    be refused, not run from the aborted op's stale step counters."""
    import cupy
    last = ctx["state"]["last"]
    end = time.monotonic() + timeout_s
    while not last.event.done and time.monotonic() < end:
        time.sleep(1e-3)
    done, err = bool(last.event.done), None
    try:
        start_many(ctx, 1000, 1, False)
    except Exception as e:               # noqa: BLE001 - reported to the test
        err = f"{type(e).__name__}: {e}"
    z = cupy.arange(1000, dtype=cupy.float32).sum()
    cupy.cuda.runtime.deviceSynchronize()
    return {"done": done, "err": err, "z": float(z)}


def queued_behind_work_then_abort(ctx: dict, spin_s: float) -> dict:
    """An all_reduce queued behind spin_s of other work on the stream, the communicator aborted and closed
    meanwhile: close must not free the memory the queued kernel will use. Then the GPU must work."""
    import cupy
    spin = cupy.RawKernel(r'''extern "C" __global__ void spin(unsigned long long ns) {
        unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        for (;;) { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
                   if (t - t0 > ns) break; __nanosleep(100000); } }''', "spin")
    be = ctx["state"]["be"]
    spin((1,), (1,), (np.uint64(int(spin_s * 1e9)),))
    start_many(ctx, 1 << 20, 1, False)
    be.abort("the test aborts")
    ctx["state"].pop("close", None)
    closed = None
    try:
        ctx["state"].pop("be").close()
    except Exception as e:               # noqa: BLE001 - the abort nobody waited on, raised at close
        closed = f"{type(e).__name__}: {e}"
    err = None
    try:
        cupy.cuda.runtime.deviceSynchronize()
        z = float(cupy.arange(1000, dtype=cupy.float32).sum())
        cupy.cuda.runtime.deviceSynchronize()
    except Exception as e:               # noqa: BLE001 - reported to the test
        err, z = f"{type(e).__name__}: {e}", None
    return {"err": err, "z": z, "close": closed}


def queued_pair_then_abort(ctx: dict, count: int) -> int:
    """Two all_reduces queued on this rank alone (the peer runs nothing): the first waits on the peer, the second
    is queued behind it; abort, let both end, then count the second's values (5.0) in the peer's FIFO of
    channel 0 (the first sent 3.0, earlier ops 1.0 and 2.0)."""
    import cupy
    be = ctx["state"]["be"]
    plan = plan_collective("all_reduce", ctx["world"], ctx["rank"], count, 4, 0, be.channels_for(count * 4),
                           be.settings.step_bytes)
    toks = []
    for v in (3.0, 5.0):
        x = cupy.full(count, v, cupy.float32)
        ctx["state"]["tag"] += 1
        toks.append(be.submit(Work(ctx["state"]["tag"], plan, "float32", "sum", sendbuf=x,
                                   recvbuf=cupy.empty_like(x))))
    time.sleep(0.5)                     # the first spins on the peer, the second waits behind it
    be.abort("the test aborts")
    end = time.monotonic() + 20
    while not toks[1].event.done and time.monotonic() < end:
        time.sleep(1e-3)
    peer = 1 - ctx["rank"]
    h = np.zeros(be.mem.buffsize // 4, np.float32)
    cupy.cuda.runtime.memcpy(h.ctypes.data, be.mem.peer_base[peer] + be.mem.fifo_off, h.nbytes, 2)
    return int((h == 5.0).sum())
