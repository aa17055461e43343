"""`slicetrace bench`: nccl-tests' sweep, columns and busbw factors, with the reference library side by side."""
from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import sys
import time

import numpy as np

from ..errors import UsageError, plural
from ..events.abi import EventType
from ..plan.traffic import busbw_factor
from .bench_rounds import compare_fields, round_count, round_stats, run_rounds
from .outputs import log_row
from .sweep import avg_atol, counts, distinct_sizes, make_input, np_dtype, rank_bytes, reference, wrong
from .table import HEADER, UNITS, ci_coverage_pct, ci_words, format_row, ref_header

_REGISTER = {1: ", registered buffers (-R 1)", 2: ", symmetric windows (-R 2)"}
_NO_STEPS = ~int(EventType.KERNEL_STEP) & ((1 << 32) - 1)   # every event type but KernelStep

def _arrays(comm, register: int = 0):
    if register:                    # -R 1 / 2: cpu only (main.py refuses it elsewhere)
        from .registered import Registered
        reg = Registered(comm, register == 2)
        return reg, reg.to_dev, lambda a: a, lambda: None
    if comm.backend_name == "cuda":
        import cupy
        cupy.cuda.Device(comm.rank % cupy.cuda.runtime.getDeviceCount()).use()
        return cupy, lambda a: cupy.asarray(a), lambda a: cupy.asnumpy(a), cupy.cuda.runtime.deviceSynchronize
    return np, lambda a: a, lambda a: a, lambda: None


def _call(comm, op: str, x, out, redop: str, root: int) -> None:
    if op == "all_reduce":
        comm.all_reduce(x, out, op=redop)
    elif op == "broadcast":
        comm.broadcast(x, out, root=root)
    elif op == "reduce":
        comm.reduce(x, out, root=root, op=redop)
    elif op == "all_gather":
        comm.all_gather(x, out)
    elif op == "reduce_scatter":
        comm.reduce_scatter(x, out, op=redop)
    elif op == "all_to_all":
        comm.all_to_all(x, out)
    elif op == "send_recv":
        with comm.group():
            comm.send(x, (comm.rank + 1) % comm.world_size)
            comm.recv(out, (comm.rank - 1) % comm.world_size)


REDUCING = ("all_reduce", "reduce", "reduce_scatter")
IN_PLACE = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")   # as nccl-tests lays them out


def _buffers(op: str, inplace: bool, host_in, cin: int, cout: int, rank: int, xp, to_dev, dtype):
    """(x, out, reset). In place as nccl-tests does it: all_gather's input is this rank's block of the output,
    reduce_scatter's output this rank's block of the input, the others share one buffer. reset() puts the
    input back and poisons the rest of the output (before the checked run, and after it in place)."""
    x = to_dev(host_in)
    poison = -77 if dtype.kind != "u" else 77
    if not (inplace and op in IN_PLACE):
        out = xp.empty(cout, dtype=dtype)
        return x, out, lambda: out.fill(poison)
    if op == "all_gather":
        out = xp.empty(cout, dtype=dtype)
        mine = out[rank * cin:(rank + 1) * cin]

        def reset_ag():
            out.fill(poison)
            mine[...] = x
        return mine, out, reset_ag
    out = x[rank * cout:(rank + 1) * cout] if op == "reduce_scatter" else x

    def reset():
        x[...] = host_in if isinstance(x, np.ndarray) else to_dev(host_in)
    return x, out, reset


def _align(comm, fn, sync) -> None:
    """Before a timed block: the store barrier polls with a backoff, so ranks leave it up to a few ms apart; one
    untimed op after it ends within microseconds on all. Unprofiled, so that no block pays for its events."""
    comm.barrier()
    with comm.profiling(False):
        fn()
        sync()


def _meet(comm, xp, sync) -> None:
    """Before a size's first ops: rank 0 prints each row while the others go on, and came late to them (a healthy
    run's trace named it a straggler). Aligned on a scratch op: on cpu an input is its host array, which a run of
    the size's own op in place would change before its check."""
    one = xp.zeros(1, dtype=np.float32)
    _align(comm, lambda: comm.all_reduce(one), sync)


_reader_gone = False


def say(text: str) -> None:
    """One line of the table. Once its reader has gone (`| head`), the rest is not printed and the sweep runs to
    its end, so --json and --trace files still come out, instead of a broken-pipe traceback per rank."""
    global _reader_gone
    if _reader_gone:
        return
    try:
        print(text, flush=True)
    except OSError as e:
        _reader_gone = True
        with contextlib.suppress(OSError):      # the interpreter flushes stdout at exit: land nowhere, not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if not isinstance(e, BrokenPipeError):      # a full disk: the table is lost, which is an error
            raise UsageError(f"cannot write the output ({e.strerror or e})") from None


def _time(fn, iters: int, sync, flush=None, collector_off: bool = True) -> float:
    """Seconds per call. The garbage collector is off while timing, as in timeit: ops are lockstep, so one
    rank's collection stalls every rank (on the H200 host a full one took ~90 ms, right after torch's NCCL set up
    its all_to_all: a block of 20 ops read 4-5 ms per op). The overhead blocks keep it on (`collector_off`):
    the collections that profiling's allocations cause are part of what it costs."""
    off = collector_off and gc.isenabled()
    if off:
        gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        if flush is not None:
            flush()
        return (time.perf_counter() - t0) / iters
    finally:
        if off:
            gc.enable()


AVERAGE = {0: "rank 0's", 1: "the mean over ranks of the", 2: "the least over ranks of the",
           3: "the most over ranks of the"}       # nccl-tests' -a


def _gather(comm, key: str, vals: list[float], times: tuple[int, ...], average: int,
            block: int | None = None) -> list[float]:
    """On rank 0, every rank's vals combined through the rendezvous store (the timing exchange is no collective of
    ours): the times at `times` as -a says (--compare --rounds: each round's block too), the wrong values (vals[1])
    and the ranks with any (vals[2]) summed, the rest their max; vals[block:] (the overhead's figures) all from one
    rank, the one whose vals[block + 2] (median ratio) is largest."""
    store = comm._session.store
    store.set(f"bench/{key}/{comm.rank}", json.dumps(vals).encode())
    if comm.rank != 0:
        return vals
    allv = [json.loads(store.get(f"bench/{key}/{r}", comm.settings.timeout_s)) for r in range(comm.world_size)]
    for r in range(comm.world_size):
        store.delete(f"bench/{key}/{r}")        # read once: -N 0 would grow the launcher's store without end
    out = [max(v[i] for v in allv) for i in range(len(vals))]
    out[1], out[2] = sum(v[1] for v in allv), sum(v[2] for v in allv)
    for i in times:
        col = [v[i] for v in allv]
        out[i] = (col[0], sum(col) / len(col), min(col), max(col))[average]
    if block is not None:
        out[block:] = max(allv, key=lambda v: v[block + 2])[block:]
    return out


def _unloaded(comm) -> str:
    """' (k of the m plugins failed in init ...)': the plugins' own traceback is logged above, but 'profiling on'
    alone read as if they recorded (a plugin whose init raises is unloaded, as NCCL does; all of them: off)."""
    failed = comm.drop_counters().get("plugin_init_failed", 0)
    if not failed:
        return ""
    listed = len([p for p in (comm.settings.profiler_plugin or "").split(",") if p.strip()])
    return f" ({failed} of {plural(listed, 'plugin')} failed in init and {'was' if failed == 1 else 'were'} unloaded)"


def bench_rank(comm, o: dict) -> tuple[list[dict], list[str]]:
    """(rank 0's rows, [] on the others; the plugins that recorded on this rank)."""
    xp, to_dev, to_host, sync = _arrays(comm, o.get("register") or 0)
    n = comm.world_size
    ref = None
    if o["compare"]:
        from .reference import TorchReference
        ref = TorchReference(o["compare"], comm.rank, n, comm._session.job,
                             device=comm.rank if o["compare"] == "nccl" else None)
    rows, progress, cycles = [], None, o.get("cycles", 1)
    combos = {op: [(np_dtype(d), r) for d in o["dtypes"] for r in (o["redops"] if op in REDUCING else ["sum"])]
              for op in o["ops"]}       # -d all / -o all: every type, every reduction of the ops that reduce
    # sizes whose element count repeats the last one's (-b 0: 0, 1, 2 B of float32) are left out, as nccl-tests does
    sweeps = {(op, d): distinct_sizes(o["sizes"], op, d.itemsize, n) for op in o["ops"] for d, _ in combos[op]}
    total = sum(len(sweeps[op, d]) for op in o["ops"] for d, _ in combos[op]) * cycles or None     # -N 0: no end
    if comm.rank == 0:
        chans = comm.settings.nchannels or ("auto" if comm.backend_name == "cuda" else 1)
        say(f"# slicetrace bench: backend {comm.backend_name}, {n} ranks, channels {chans}, "
            f"profiling {'on' if comm.profiler_enabled and not o.get('main_unprofiled') else 'off'}"
            + (f" (1 op in {comm.settings.op_sample_rate})" if comm.profiler_enabled
               and comm.settings.op_sample_rate > 1 else "")
            + (f" (ops from {comm.settings.profile_min_bytes} B)" if comm.profiler_enabled
               and comm.settings.profile_min_bytes else "")
            + _unloaded(comm)
            + (", in place" if o["inplace"] else "") + _REGISTER.get(o.get("register") or 0, "")
            + (f", compare {o['compare']}" if ref else "")
            + ((f" in {round_count(o['rounds'])} ABBA rounds" if o.get("compare_rounds") else
                " (one block each: --rounds 12 for ABBA rounds and an interval)") if ref else "")
            + (f", time: {AVERAGE[o['average']]} timings" if o.get("average", 3) != 3 else "")
            + (", overhead of KernelStep (profiled with it / without it)" if o["overhead"]
               and o.get("overhead_of") == "kernel_step" else ""))
        say(HEADER + (ref_header((o["rounds"] + 1) // 2 if o.get("compare_rounds") else None) if ref else "")
            + ("  {:>9} [{}]".format("overhead", ci_words((o["rounds"] + 1) // 2)) if o["overhead"] else ""))
        say(UNITS)
        if sys.stderr.isatty():
            from rich.progress import Progress
            from rich.console import Console
            # the table owns stdout: rows printed while the bar is live go to the terminal above it only when
            # stdout is that terminal; redirected, they go to the file (rich would route them to stderr)
            tty = sys.stdout.isatty()
            progress = Progress(transient=True, console=Console(stderr=True, soft_wrap=True),     # rows unbroken
                                redirect_stdout=tty, redirect_stderr=tty)
            progress.start()
            task = progress.add_task("sweep", total=total)
    gc.collect()
    gc.freeze()          # what the imports and set-up made is old: later collections only walk what the sweep makes
    try:
        for cyc in (itertools.count() if cycles == 0 else range(cycles)):
            if cycles != 1 and comm.rank == 0:
                say(f"# cycle {cyc}")
                if cycles == 0:
                    rows.clear()         # a run without end keeps the current cycle's rows only
            for op in o["ops"]:
                if comm.rank == 0 and (len(o["ops"]) > 1 or o["inplace"]):
                    say(f"# {op}" + (" (out of place: no in-place form)" if o["inplace"] and op not in IN_PLACE
                                     else ""))
                for dtype, redop in combos[op]:
                    if cyc == 0:
                        for nbytes in (o["sizes"][-1], o["sizes"][0]):    # nccl-tests' warm-up: largest, smallest
                            with _memory(o, op, nbytes, dtype, n, comm.rank):
                                _warm(comm, op, nbytes, dtype, redop, o, xp, to_dev, sync, ref)
                    for i, nbytes in enumerate(sweeps[op, dtype]):
                        with _memory(o, op, nbytes, dtype, n, comm.rank):
                            row = _one(comm, op, nbytes, dtype, {**o, "redop": redop}, xp, to_dev, to_host, sync,
                                       ref, f"{cyc}/{op}/{dtype}/{redop}/{i}")
                        if row is not None and comm.rank == 0:
                            if cycles != 1:
                                row["cycle"] = cyc
                            rows.append(row)
                            log_row(o.get("rows_file"), row)     # --json's rows if the run fails later
                            say(format_row(row, ref is not None, o["overhead"]))
                        if progress is not None:
                            progress.advance(task)
    finally:
        if progress is not None:
            progress.stop()
        if ref is not None:
            ref.close()
    return rows, comm.profiler_plugins


_TOO_BIG = ("Maximum allowed dimension exceeded", "array is too big")       # numpy's words for it


@contextlib.contextmanager
def _memory(o: dict, op: str, nbytes: int, dtype, n: int, rank: int):
    """A size too large for this host is a usage error naming the size and what it needs, not a MemoryError
    traceback per rank."""
    try:
        yield
    except (MemoryError, ValueError) as e:
        # numpy refuses a size past its index limit with a ValueError; other ValueErrors (ours: UsageError) pass
        if not isinstance(e, MemoryError) and not str(e).startswith(_TOO_BIG):
            raise
        buffers, more = rank_bytes(op, nbytes, dtype.itemsize, n, o["check"])
        check = f" and about {more:,} B more to check it (-c 0 skips the check)" if more else ""
        top, given = o["sizes"][-1], o.get("maxbytes", str(o["sizes"][-1]))     # -e as typed: 100G, not 2**36
        flag = f"-e {given}" + (f" (the sweep's largest size: {top:,} B)" if given != str(top) else "")
        raise UsageError(f"{flag}: {op} of {nbytes:,} B ({dtype}) ran out of memory on rank {rank}: "
                         f"each rank needs at least {buffers:,} B for its buffers{check}; "
                         f"give a smaller -e (or -b)") from None


def _warm(comm, op, nbytes, dtype, redop, o, xp, to_dev, sync, ref) -> None:
    """-w untimed, unchecked runs of one size (and of the reference), before a sweep's first size is timed."""
    if not o["warmup"]:
        return
    cin, cout = counts(op, nbytes, dtype.itemsize, comm.world_size)
    x = to_dev(np.zeros(cin, dtype=dtype))
    out = xp.empty(cout, dtype=dtype)
    _meet(comm, xp, sync)
    _repeat(lambda: _call(comm, op, x, out, redop, o["root"]), o["warmup"], sync)
    if ref is not None:
        _repeat(lambda: ref.run(op, x, out, redop, o["root"]), o["warmup"], ref.sync)


def _repeat(fn, times: int, sync) -> None:
    for _ in range(times):
        fn()
    sync()


def _one(comm, op, nbytes, dtype, o, xp, to_dev, to_host, sync, ref, key):
    n, rank = comm.world_size, comm.rank
    cin, cout = counts(op, nbytes, dtype.itemsize, n)
    redop, root = o["redop"], o["root"]        # bench_rank passes "sum" for the ops that do not reduce
    host_in = make_input(o["seed"], rank, cin, dtype, redop)
    inplace = bool(o["inplace"]) and op in IN_PLACE
    x, out, reset = _buffers(op, inplace, host_in, cin, cout, rank, xp, to_dev, dtype)
    fn = (lambda: _call(comm, op, x, out, redop, root))
    _meet(comm, xp, sync)
    n_wrong = 0
    if o["check"]:
        reset()
        fn()
        sync()
        inputs = [make_input(o["seed"], r, cin, dtype, redop) for r in range(n)]
        n_wrong = wrong(to_host(out), reference(op, inputs, rank, root, redop), dtype,
                        avg_atol(inputs, redop, dtype))
        if inplace:
            reset()
    _repeat(fn, o["warmup"], sync)
    flush = comm.flush_profiler if comm.profiler_enabled else None
    prof = not o.get("main_unprofiled")      # --overhead alone: the main columns unprofiled

    def ours() -> float:
        _align(comm, fn, sync)
        with comm.profiling(prof):
            return _time(fn, o["iters"], sync, flush if prof else None)
    cmp_rounds = ref is not None and bool(o.get("compare_rounds"))
    vals = [0.0 if cmp_rounds else ours(), float(n_wrong), float(n_wrong > 0)]
    times = [0]
    if ref is not None:
        rfn = (lambda: ref.run(op, x, out, redop, root))
        _repeat(rfn, o["warmup"], ref.sync)

        def theirs() -> float:
            _align(comm, rfn, ref.sync)
            return _time(rfn, o["iters"], ref.sync)
        times.append(3)
        if cmp_rounds:          # each round's block from every rank, combined per -a as one block's time is;
            mine, refs = run_rounds(o["rounds"], ours, theirs)
            vals.append(0.0)    # vals[0], vals[3] stay 0: both sides' times come from the gathered blocks (st)
            times += range(4, 4 + 2 * len(mine))
            vals += mine + refs
        else:
            vals.append(theirs())
    block = len(vals)
    if o["overhead"]:
        vals += _overhead(comm, fn, sync, flush, o)
    vals = _gather(comm, key, vals, tuple(times), o.get("average", 3), block if o["overhead"] else None)
    if rank != 0:
        return None
    half = (block - 4) // 2                 # --compare --rounds: ours' blocks, then the reference's, from vals[4]
    st = round_stats(vals[4:4 + half], vals[4 + half:block]) if cmp_rounds else None
    t = vals[0] if st is None else st.a_median
    f = busbw_factor(op, n)
    size = cout * dtype.itemsize if op in ("all_gather",) else cin * dtype.itemsize
    algbw = size / t / 1e9 if t > 0 else 0.0
    # count as nccl-tests prints it: per rank for all_gather and reduce_scatter, per peer for all_to_all
    count = cout if op == "reduce_scatter" else cin // n if op == "all_to_all" else cin
    row = {"op": op, "size": size, "count": count, "type": str(dtype),
           "redop": redop if op in REDUCING else "none", "inplace": inplace,
           "root": root if op in ("broadcast", "reduce") else -1, "time_us": t * 1e6,
           "algbw": algbw, "busbw": algbw * f, "wrong": int(vals[1]) if o["check"] else None, "ranks": n}
    if o["check"]:
        row["wrong_ranks"] = int(vals[2])       # nccl-tests' error count: one per rank whose check failed
    if ref is not None:
        rt = vals[3] if st is None else st.b_median
        row["ref_time_us"] = rt * 1e6
        row["ref_busbw"] = size / rt / 1e9 * f if rt > 0 else 0.0
        row["ratio"] = row["busbw"] / row["ref_busbw"] if row["ref_busbw"] else None     # 0 bytes: no ratio
    if st is not None:
        compare_fields(row, st)
    if o["overhead"]:
        on, off, ratio, q1, q3, lo, hi = vals[block:block + 7]
        row["profiled_us"], row["unprofiled_us"] = on * 1e6, off * 1e6
        row["overhead_pct"] = (ratio - 1) * 100
        row["overhead_iqr_pct"] = [(q1 - 1) * 100, (q3 - 1) * 100]     # the rounds' spread
        row["overhead_ci95_pct"] = [(lo - 1) * 100, (hi - 1) * 100]    # where the median is: is a difference real?
        row["overhead_of"] = o.get("overhead_of", "profiling")
        nr = (o.get("rounds", 12) + 1) // 2
        row["overhead_ratios"] = nr
        if nr < 6:                      # the interval is the whole sample: it covers the median 1 - 2/2**n only
            row["overhead_ci_coverage_pct"] = ci_coverage_pct(nr)
    return row


def _overhead(comm, fn, sync, flush, o: dict) -> list[float]:
    """--overhead's rounds (bench_rounds: A unprofiled, B profiled), this rank's figures: [profiled median block,
    unprofiled median block, median ratio, q1, q3, CI lo, CI hi]. kernel_step: both sides profiled, the
    "unprofiled" one with every event type but KernelStep. The collector stays on (`_time`)."""
    steps_only = o.get("overhead_of") == "kernel_step"

    def side(prof: bool):
        def block() -> float:
            _align(comm, fn, sync)
            with comm.profiling(prof or steps_only, None if prof or not steps_only else _NO_STEPS):
                return _time(fn, o["iters"], sync, flush if prof or steps_only else None, False)
        return block
    st = round_stats(*run_rounds(o["rounds"], side(False), side(True)))
    return [st.b_median, st.a_median, st.ratio, st.q1, st.q3, st.lo, st.hi]
