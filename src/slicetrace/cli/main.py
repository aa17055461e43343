"""`slicetrace` command line: bench (nccl-tests flags), report (traces), convert (to Perfetto), config, diff (runs)."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from dataclasses import fields

from ..backend.base import REDOPS
from .. import errors
from ..config import Settings, describe, env_source, value_source
from ..errors import BackendError, SliceTraceError, UsageError
from ..events.abi import parse_mask
from ..events.loading import load_plugins
from ..launch_signals import _terminate_as_exit
from .bench_json import completeness, json_value, provenance
from .benchflags import backend_source, bench_settings, check_flags, has_example, register_pool, timeout_hint
from .diff_cmd import diff_parser, run_diff
from .outputs import dump_files, flightrec_note, logged_rows, rows_log, trace_note, writable_folder, write_json
from .sweep import (DTYPE_ALIASES, OPS, all_dtypes, available_memory, bench_dtype, memory_check, parse_size,
                    shm_check, sizes)
from .trace_cmds import add_all_comms, run_convert, run_report


def _mask(v: str) -> int:
    """--profile MASK: an event mask, decimal or 0x hex, or event type names (events.abi.parse_mask)."""
    try:
        m = parse_mask(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{v!r} is not an event mask: {e}; give an integer, e.g. 65606 or "
                                         f"0x10046, or event types joined by ',' or '|', e.g. "
                                         f"Coll|P2p|KernelCh|KernelStep") from None
    if not 0 <= m < 1 << 32:
        raise argparse.ArgumentTypeError(f"{v!r} must be in 0..0xFFFFFFFF")
    return m


def _brief(e: SliceTraceError) -> str:
    """A rank's failure that is one of ours (a timeout, a peer that left, bad input) reads as one line per rank;
    anything else (a bug) keeps its tracebacks."""
    errs = getattr(e, "errors", None)
    if not errs or not all(errors.ours(str(v)) for v in errs.values()):
        return str(e)
    return "; ".join(f"rank {r}: {str(v).splitlines()[0]}" for r, v in sorted(errs.items()))


# bench's exit status (--help's epilog and the README say the same): argparse's 2 for what is refused
USAGE, RUN_FAILED = 2, 1
EXIT_CODES = ("exit status: 0 done; 1 the run failed (a rank failed or was killed, a -T timeout) or a result was "
              "wrong; 2 refused: bad flags, settings or input; 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)")


def _exit_code(a: argparse.Namespace, e: SliceTraceError) -> int:
    """bench's run that failed (a LaunchError) is RUN_FAILED, unless the rank it leads with refused its input (its
    first line is "rank R failed: Type: message"; a size too large for memory is found there); what is refused
    before the ranks start, and the other commands' errors, USAGE."""
    lead = str(e).split("\n", 1)[0].split(" failed: ", 1)[-1].split(":", 1)[0]
    if a.cmd == "bench" and isinstance(e, errors.LaunchError) and lead not in ("UsageError", "ConfigError"):
        return RUN_FAILED
    return USAGE


# nccl-tests' flags without a counterpart here: a hint, not argparse's bare "unrecognized arguments"
_NCCL_TESTS_ONLY = {
    ("-t", "--nthreads"): "one process runs each rank here; give the rank count with --ranks N",
    ("-g", "--ngpus"): "one process runs each rank (on cuda, one GPU each) here; give the rank count with --ranks N",
    ("-m", "--agg_iters"): "operations are not aggregated into groups here; -n sets the timed iterations",
    ("-p", "--parallel_init"): "the ranks always start in parallel here",
    ("-z", "--blocking"): "not supported: time is taken over -n iterations, synchronized once at their end",
    ("-G", "--cudagraph"): "CUDA graphs are not supported",
}


class _NcclTestsOnly(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        key = next(k for k in _NCCL_TESTS_ONLY if option_string in k)
        if key[0] in ("-z", "-G") and values == "0":        # nccl-tests' default, and what bench does
            return
        parser.error(f"{option_string} (nccl-tests' {key[1]}) has no counterpart in slicetrace bench: "
                     f"{_NCCL_TESTS_ONLY[key]}")


def _bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="nccl-tests-style sweep on the cpu (default) or cuda backend",
                       epilog=EXIT_CODES)
    for short, _ in _NCCL_TESTS_ONLY:      # short only: --parallel_init would make --p, --pro ambiguous
        p.add_argument(short, nargs="?", action=_NcclTestsOnly, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("-b", "--minbytes", default="4K", help="smallest size (default 4K)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=None, help="size multiplier (default 2)")
    p.add_argument("-i", "--stepbytes", default=None, help="size increment instead of -f (e.g. 1M)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warmup iterations (default 5)")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                   help="1 = check results against numpy (default 1), 0 = do not")
    p.add_argument("-d", "--datatype", default="float", help=f"one of {sorted(DTYPE_ALIASES)}, or all (default float)")
    p.add_argument("-o", "--redop", dest="redop", default="sum",
                   help="reduction: sum prod min max avg, or all (default sum)")
    p.add_argument("-r", "--root", type=int, default=0, help="root for broadcast/reduce (default 0)")
    p.add_argument("-a", "--average", type=int, choices=(0, 1, 2, 3), default=3,
                   help="time reported per size, over the ranks' own timings: 0 rank 0, 1 mean (nccl-tests' "
                   "default), 2 min, 3 max (default: the slowest rank, which the collective waits for)")
    p.add_argument("-N", "--run_cycles", type=int, default=1,
                   help="run the sweep this many times (0 = until interrupted, as nccl-tests; not with trace files, "
                   "--trace or SLICETRACE_PROFILE_DUMP_FILE, which would grow without bound); rows carry the cycle")
    p.add_argument("-T", "--timeout", type=float, default=None,
                   help="seconds any wait, the ranks' start-up included, may take before it is an error on every "
                   "rank, >= 1 (default: SLICETRACE_TIMEOUT, else 60)")
    p.add_argument("--op", dest="ops", default="all_reduce",
                   help=f"comma list of {OPS} or 'all' (default all_reduce)")
    p.add_argument("--ranks", type=int, default=None, help="ranks to spawn (cpu default 2; cuda: GPUs)")
    p.add_argument("--backend", default=None, type=str.lower, help="cpu (default) or cuda")
    p.add_argument("--channels", type=int, default=None, help="channels per collective (0: the backend chooses)")
    p.add_argument("--inplace", action="store_true", help="run in place as nccl-tests does (all_gather: input = "
                   "this rank's block of the output; reduce_scatter: output = this rank's block of the input; "
                   "all_reduce, broadcast, reduce: one buffer); all_to_all and send_recv stay out of place")
    p.add_argument("--trace", metavar="DIR", help="write per-rank Chrome traces via the example plugin")
    p.add_argument("--profile", nargs="?", const=-1, type=_mask, metavar="MASK",
                   help="profile with the example plugin; event mask: an integer or event types joined by '|' or ',' "
                   "(without MASK: SLICETRACE_PROFILE_EVENT_MASK, else 65606 = Coll|P2p|KernelCh|KernelStep)")
    p.add_argument("--overhead", action="store_true", help="alternate profiled/unprofiled runs, print overhead %%")
    p.add_argument("--overhead-of", choices=("profiling", "kernel_step"), default="profiling",
                   help="--overhead compares profiled with unprofiled runs (profiling, default), or profiled runs "
                        "with and without KernelStep (kernel_step: what the per-slice events alone cost)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds for --overhead and for --compare, one block of each kind each; two make an ABBA "
                   "quad (off-on-on-off; ours-ref-ref-ours), whose ratio is one sample; the column is the quads' "
                   "median with its confidence interval (odd counts round up; default 12: 6 ratios, the fewest a "
                   "95%% interval of the median needs; --compare without --rounds times one block of each)")
    p.add_argument("--compare", choices=("gloo", "nccl"),
                   help="run the reference library side by side; ratio = busbw(ours)/busbw(reference), from one "
                   "block of each per size, or with --rounds the median over ABBA rounds with its interval")
    p.add_argument("--json", metavar="FILE", help="write results as JSON")
    p.add_argument("-R", "--local_register", dest="register", type=int, choices=(0, 1, 2), default=0,
                   help="1: buffers from registered memory (cpu: Comm.mem_alloc, SLICETRACE_CPU_POOL sized for the "
                        "sweep), so ring collectives read and write the peers' buffers directly; 2: symmetric "
                        "windows (mem_alloc(symmetric=True)): all_reduce, all_gather and reduce_scatter run the "
                        "symmetric kernels; default 0")
    p.add_argument("--seed", type=int, default=1234, help="seed of the inputs, >= 0 (default 1234)")


def run_bench(a: argparse.Namespace) -> int:
    from ..launcher import launch
    from ..sinks.chrome import event_mask
    from .bench import bench_rank, say
    from .table import format_summary, summarize
    ops = check_flags(a)
    s, overrides = bench_settings(a)
    # a bad spec: one line here, not per rank; its items come from the variable (--trace/--profile add 'example')
    source = env_source("profiler_plugin") or "profiler_plugin"
    plugins = [lp.name for lp in load_plugins(s.profiler_plugin, s, source)]
    nranks = a.ranks
    if nranks is None:
        nranks = 2
        if s.backend == "cuda":
            try:
                import cupy
                nranks = cupy.cuda.runtime.getDeviceCount()
            except Exception as e:      # no CuPy, no driver, no device: say so plainly
                raise BackendError(f"{backend_source(a, s)}: no usable CUDA device ({type(e).__name__}: {e})") \
                    from None
    if not 0 <= a.root < nranks and {"broadcast", "reduce"} & set(ops):     # the rest have no root (-1)
        raise UsageError(f"-r {a.root} must be a rank, 0..{nranks - 1} (the run has {nranks} rank(s): --ranks)"
                         + ("; nccl-tests' -r -1, every root in turn, is not supported" if a.root == -1 else ""))
    left_out: list[str] = []
    dtypes = (all_dtypes(s.backend, left_out) if a.datatype == "all"
              else [bench_dtype(DTYPE_ALIASES[a.datatype], s.backend)])
    for why in left_out:
        say(f"# -d all: {why}")
    step = None if a.stepbytes is None else parse_size(a.stepbytes, "-i")
    swept = sizes(parse_size(a.minbytes, "-b"), parse_size(a.maxbytes, "-e"), a.stepfactor, step)
    if a.register:
        overrides["cpu_pool"] = pool = register_pool(a, s, swept, ops, dtypes, nranks)
        s = s.with_(cpu_pool=pool)
    if s.backend == "cpu":
        shm_check(nranks, s)
    # what is knowable: host memory (the buffers on cpu, the check's everywhere); not the GPUs' (the ranks say)
    memory_check(swept, ops, dtypes, nranks, bool(a.check), s.backend == "cpu", (a.minbytes, a.maxbytes),
                 available_memory())
    opts = {"sizes": swept,
            "ops": ops, "dtypes": dtypes, "redops": list(REDOPS) if a.redop == "all" else [a.redop],
            "root": a.root, "iters": a.iters,
            "warmup": a.warmup_iters, "check": bool(a.check), "compare": a.compare, "overhead": a.overhead,
            "overhead_of": a.overhead_of, "main_unprofiled": a.overhead and a.trace is None and a.profile is None,
            "rounds": a.rounds or 12, "compare_rounds": a.compare is not None and a.rounds is not None,
            "seed": a.seed, "inplace": a.inplace, "register": a.register,
            "average": a.average, "cycles": a.run_cycles, "maxbytes": a.maxbytes}
    # the trace files' prefix: --trace's, or SLICETRACE_PROFILE_DUMP_FILE's when the example plugin writes there
    dump = os.path.join(a.trace, "trace") if a.trace is not None else (
        s.profile_dump_file if s.profile_dump_file and has_example(s.profiler_plugin) else None)
    what = None if a.trace is not None else f"SLICETRACE_PROFILE_DUMP_FILE={s.profile_dump_file!r}"
    folder, stem = (os.path.dirname(dump) or ".", os.path.basename(dump)) if dump else ("", "")
    for line in _unwritten_files(s, plugins):
        say(line)
    if dump is not None and a.run_cycles == 0:      # each cycle appends to the files: none would ever be finished
        src = f"--trace {a.trace!r}" if a.trace is not None else f"{what} (the example plugin's trace files)"
        raise UsageError(f"-N 0 with {src}: a run without end would grow each rank's trace file without bound; give "
                         f"-N a count of cycles, or for a live view of a run without end the linkstats plugin, whose "
                         f"file is rewritten, not grown (SLICETRACE_PROFILER_PLUGIN=linkstats "
                         f"SLICETRACE_LINKSTATS_FILE=PREFIX)")
    if dump is not None:        # made after every check: a refused run leaves no folder behind
        flag, path = ("--trace", a.trace) if a.trace is not None else ("SLICETRACE_PROFILE_DUMP_FILE", folder)
        if a.json is not None and os.path.realpath(a.json) == os.path.realpath(path):  # not there yet: --json passed
            raise UsageError(f"--json {a.json!r} is the folder {flag} writes the trace files in; give the JSON a "
                             f"file of its own, e.g. {a.json}.json")
        writable_folder(flag, path)
    traces_before = dump_files(folder, stem) if dump else {}
    fr = s.flightrec_file if "flightrec" in plugins else None      # its files come only at a failure, by default
    fr_before = dump_files(os.path.dirname(fr) or ".", os.path.basename(fr)) if fr else {}
    failed, active = None, plugins
    opts["rows_file"] = rows_file = rows_log(a.json)
    try:
        results = launch(bench_rank, nranks, opts, **overrides)
        rows = results[0][0]
        active = [p for p in plugins if all(p in got for _, got in results)]     # past init on every rank
    except (errors.LaunchError, KeyboardInterrupt, SystemExit) as e:   # the rows so far are still written, then e
        failed, rows = e, logged_rows(rows_file) if rows_file else []
    finally:
        if rows_file is not None:
            with contextlib.suppress(OSError):
                os.remove(rows_file)
    bad_rows = [r for r in rows if (r["wrong"] or 0) > 0]       # None: unchecked (-c 0)
    summary = summarize(rows, bool(a.check))
    for line in format_summary(summary, a.compare) if failed is None else ():
        say(line)
    if a.json is not None:
        # what profiling ran: a bare --profile (-1) and no --profile both read null before; the mask is the example
        # plugin's (its default when SLICETRACE_PROFILE_EVENT_MASK is unset); another plugin sets its own at init
        mask = event_mask(s) if has_example(",".join(active)) else None
        write_json("--json", a.json, {"settings": {f.name: json_value(getattr(s, f.name)) for f in fields(s)},
                                       "ranks": nranks, "bench": {k: mask if k == "profile" and v == -1 else v
                                                                  for k, v in vars(a).items()
                                                                  if k not in ("cmd", "func")},   # -a, -n, -w, ...
                                       "profiling": {"plugins": active, "event_mask": mask,
                                                     "unloaded_plugins": [p for p in plugins if p not in active],
                                                     "main_profiled": bool(active) and not opts["main_unprofiled"]},
                                       "env": provenance(s.backend, nranks, a.compare), "rows": rows,
                                       "summary": summary, **completeness(failed)})
    if dump is not None:
        try:
            say(trace_note(folder, traces_before, s.profiler_plugin, s.profile_event_mask, stem, what,
                           failed is not None))
        except SliceTraceError:
            if failed is None:
                raise                   # a failed run that wrote no trace: its own error says why
    if fr is not None and "flightrec" in active:        # (past init on every rank, or the run failed)
        fr_var = f"SLICETRACE_FLIGHTREC_FILE={fr!r}" + ("" if env_source("flightrec_file") else " (the default)")
        say(flightrec_note(fr, fr_before, nranks, s.flightrec_dump == "always", failed is not None, fr_var))
    if failed is not None:
        raise failed
    if bad_rows:
        print(f"# {len(bad_rows)} size(s) had wrong results", file=sys.stderr)
        return 1
    return 0


def _unwritten_files(s, plugins: list[str]) -> list[str]:
    """A note per file variable set for a plugin this run does not load: its files never come, which said nothing."""
    loaded = f"SLICETRACE_PROFILER_PLUGIN={s.profiler_plugin!r}" if s.profiler_plugin else \
        "no profiler plugin (SLICETRACE_PROFILER_PLUGIN unset)"
    notes = []
    for var, value, plugin, fix in (
            ("SLICETRACE_PROFILE_DUMP_FILE", s.profile_dump_file, "example",
             "add --trace DIR or --profile, or add example to SLICETRACE_PROFILER_PLUGIN"),
            ("SLICETRACE_LINKSTATS_FILE", s.linkstats_file, "linkstats",
             "add linkstats to SLICETRACE_PROFILER_PLUGIN"),
            ("SLICETRACE_FLIGHTREC_FILE", env_source("flightrec_file") and s.flightrec_file, "flightrec",
             "add flightrec to SLICETRACE_PROFILER_PLUGIN")):       # flightrec's: when set, not its default
        if value and plugin not in plugins:
            notes.append(f"# {var}={value!r} is set, but this run loads {loaded}, not the {plugin} plugin that "
                         f"writes its files, so none are written: {fix}")
    return notes


def run_config(a: argparse.Namespace) -> int:
    s = Settings.from_env()
    rows = describe(s)
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for var, kw, eff, raw, doc in rows:     # None: unset, the plugin's own default (the doc says which)
        print(f"{var:{w[0]}}  {kw + '=':{w[1] + 1}}  {eff:{w[2]}}  env={raw:{w[3]}}  {doc}")
    # a plugin that would not load is an error here too, not at the run
    load_plugins(s.profiler_plugin, s, value_source("profiler_plugin", s.profiler_plugin))
    return 0


def main(argv: list[str] | None = None) -> int:
    from .. import __version__
    parser = argparse.ArgumentParser(prog="slicetrace", description=__doc__)
    parser.add_argument("--version", action="version", version=f"slicetrace {__version__}")
    sub = parser.add_subparsers(dest="cmd")
    _bench_parser(sub)
    sub.add_parser("config", help="every SLICETRACE_* variable: effective value, raw value, meaning")
    rp = sub.add_parser("report", help="per-link bandwidth, waits and stragglers from trace files")
    rp.add_argument("traces", nargs="+", help="trace files, their folder, a glob, or the dump prefix")
    rp.add_argument("--top", type=int, default=10,
                    help="slowest slices (and most skewed collectives) to list, default 10")
    rp.add_argument("--json", metavar="FILE", help="write the report as JSON ('-': standard output, the text then "
                    "goes to stderr)")
    rp.add_argument("--partial", action="store_true",
                    help="analyse the ranks present when the run's other ranks' files are not given")
    rp.add_argument("--csv", metavar="FILE", help="write every KernelStep as a CSV row (rank, channel, is_send, peer, "
                    "step, size, wait_ns, ready_ns, done_ns, seq_number, op, wait_us, transfer_us, gbps), for pandas "
                    "or a spreadsheet ('-': standard output, the text then goes to stderr)")
    cp = sub.add_parser("convert", help="trace files -> one Perfetto protobuf trace, with send -> receive flows")
    cp.add_argument("traces", nargs="+", help="trace files, their folder, a glob, or the dump prefix")
    cp.add_argument("-o", "--output", required=True, metavar="FILE", help="the .pftrace file to write ('-': "
                    "standard output)")
    cp.add_argument("--partial", action="store_true",
                    help="convert the ranks present when the run's other ranks' files are not given (or empty)")
    add_all_comms(rp, "report")
    add_all_comms(cp, "convert")
    diff_parser(sub)
    a = parser.parse_args(argv)
    if a.cmd is None:               # argparse's own word was "required: cmd": show the commands instead
        parser.print_help(sys.stderr)
        return 2
    # report's and convert's files are written through a temporary file: SIGTERM (timeout(1), Slurm) killed the
    # process outright and left it beside the output; as SystemExit(143) the write's cleanup removes it
    term = _terminate_as_exit() if a.cmd in ("report", "convert", "diff") else None
    try:
        rc = {"bench": run_bench, "config": run_config, "report": run_report, "convert": run_convert,
              "diff": run_diff}[a.cmd](a)
        sys.stdout.flush()          # a closed pipe shows here, not as a traceback at the interpreter's exit
        return rc
    except SliceTraceError as e:
        hint = timeout_hint(a, e) if a.cmd == "bench" else ""
        print(f"slicetrace: error: {_brief(e)}{hint}", file=sys.stderr)
        return _exit_code(a, e)
    except KeyboardInterrupt:
        print("slicetrace: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:         # our SIGTERM handlers' (timeout(1), Slurm): said, as Ctrl-C is
        if e.code == 128 + signal.SIGTERM:
            print("slicetrace: terminated (SIGTERM)", file=sys.stderr)
        raise
    except BrokenPipeError:         # `slicetrace config | head`: the reader is gone, which is not an error
        _stdout_to_devnull()
        return 0
    except OSError as e:            # `> /dev/full`: one line, not a traceback (the files' own errors name a flag)
        if e.filename is None:      # a write to stdout; the exit's flush would fail again
            _stdout_to_devnull()
        what = f"{e.filename!r}: {e.strerror or e}" if e.filename else f"cannot write the output ({e.strerror or e})"
        print(f"slicetrace: error: {what}", file=sys.stderr)
        return 2
    finally:
        if term is not None:
            signal.signal(signal.SIGTERM, term)


def _stdout_to_devnull() -> None:
    """The interpreter flushes stdout at exit: let that land nowhere, not fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
