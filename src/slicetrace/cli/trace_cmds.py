"""`slicetrace report` and `slicetrace convert`: the trace readers' commands (main.py parses their flags)."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..analyze.atomic import STDOUT
from ..errors import SliceTraceError, UsageError
from ..events.abi import EventType
from .outputs import names_stdout, output_errors, writable_file, write_json


def run_report(a: argparse.Namespace) -> int:
    from ..analyze.report import _console, render
    from ..analyze.runtables import comm_tables, run_tables
    from ..analyze.steps_csv import write_steps_csv
    from ..analyze.trace import trace_files
    if a.top < 0:
        raise UsageError(f"--top {a.top} must be >= 0")
    # /dev/stdout and the like are '-': the text then goes to stderr, not into the JSON or CSV
    a.json, a.csv = (STDOUT if p is not None and names_stdout(p) else p for p in (a.json, a.csv))
    outs = [(flag, path) for flag, path in (("--json", a.json), ("--csv", a.csv)) if path is not None]
    for flag, path in outs:             # '' too: writable_file refuses it, rather than writing nothing
        writable_file(flag, path, stdout_ok=True)
    _not_an_input(outs, trace_files(a.traces))
    text = sys.stderr if STDOUT in (a.json, a.csv) else sys.stdout     # '-': stdout carries that file alone
    if a.json == a.csv == STDOUT:
        raise UsageError("--json '-' and --csv '-': standard output can carry one of them; give the other a file")
    if len(outs) == 2 and (a.json == a.csv or _same_file(a.json, a.csv)):
        raise UsageError(f"--json {a.json!r} and --csv {a.csv!r} are one file: the CSV would replace the JSON; "
                         f"give each its own file")
    where = ' '.join(a.traces)
    if a.all_comms:
        runs = comm_tables(a.traces, skip_empty=a.partial)
    else:
        runs = [(None, run_tables(a.traces, skip_empty=a.partial))]      # one file's records at a time
    if len(runs) > 1:
        return _report_comms(a, runs, where, text)
    notes = _notes(a, runs[0][1], where)
    rep, ks = _analysed(a, runs[0][1], where)
    for line in notes:
        print(line, file=text)
    if a.json is not None:      # the files first: a reader that stops early (`| head`) does not lose them
        write_json("--json", a.json, rep.to_dict())
    if a.csv is not None:
        with output_errors("--csv", a.csv):
            n = write_steps_csv(ks, a.csv)
    render(rep, _console(text))
    if a.csv is not None:
        print(f"# {n} KernelStep rows: {'standard output' if a.csv == STDOUT else a.csv}", file=text)
    return 0


def _notes(a: argparse.Namespace, run: Any, where: str) -> list[str]:
    """What to say before a communicator's report (its RunTables): ranks --partial left out, ranks without events;
    TraceFormatError for a rank left out without --partial. where: its files, for the messages."""
    from ..analyze.runranks import every_rank
    notes = []
    present = run.present           # below ranks.n: load_files' checks
    left_out = every_rank(where, run.ranks, set(present), a.partial)
    if left_out:
        notes.append(f"# --partial: {left_out}; stragglers, waits and links are among the ranks present only")
    if run.flight:                      # evicted before a window is not missing: said once, here
        from ..analyze.flightwindow import window_note
        notes.append(window_note(run.flight))
    bare = [r for r in present if r not in run.evented]
    if bare and run.evented:            # present by their header only: the tables would just lack them
        notes.append(f"# rank(s) {', '.join(map(str, bare))}: the file holds no events (cut short before its "
                     f"first write?); the tables and verdicts have nothing of it")
    return notes


def _analysed(a: argparse.Namespace, run: Any, where: str) -> tuple[Any, Any]:
    """A communicator's report (its RunTables) and KernelStep table; SliceTraceError where it has nothing to
    analyse, saying why."""
    from ..analyze.report import build
    present = run.present
    ks, chs = run.steps()
    if not len(ks) and not len(chs) and run.one_rank:
        raise SliceTraceError(f"{where}: a 1-rank run moves no data between ranks, so it has no slices "
                              f"to analyse; run 2 or more ranks (--ranks 2; on one GPU they share it)")
    counts = run.counters()
    if not len(ks) and not len(chs):
        left = [f"{n:,} {k} ({why})" for k, why in (
                    ("ops_below_min_bytes", "SLICETRACE_PROFILE_MIN_BYTES"),
                    ("ops_sampled_out", "SLICETRACE_PROFILE_OP_SAMPLE_RATE"),
                    ("ops_masked_kernel_step", "a comm.profiling(True, mask=...) block's mask without KernelStep"))
                if (n := sum(c[k] for c in counts.values() if type(c.get(k)) is int))]
        if left:                # left unprofiled on purpose, not lost: the trace's mask may be right
            raise SliceTraceError(f"{where}: no KernelStep or KernelCh events to analyse "
                                  f"({run.records} events in all): ops were left out on purpose (not lost), "
                                  f"{', '.join(left)}; record with SLICETRACE_PROFILE_MIN_BYTES below the ops' sizes "
                                  f"(default 0), SLICETRACE_PROFILE_OP_SAMPLE_RATE=1 (every op) and KernelStep in "
                                  f"the masks of comm.profiling() blocks" + (
                                      f"; the {run.ops} op(s) profiled have none either: put KernelStep and KernelCh "
                                      f"in the mask (SLICETRACE_PROFILE_EVENT_MASK=65606)" if run.ops else ""))
        both = EventType.KERNEL_STEP | EventType.KERNEL_CH
        if run.masks and all(m & both == both for m in run.masks):    # the mask was not it: told so, users set it
            masks = ', '.join(map(str, sorted(run.masks)))
            blind = _ops_unrecorded(run.masks)
            raise SliceTraceError(f"{where}: no KernelStep or KernelCh events to analyse "
                                  f"({run.records} events in all)" + (
                                      f": the files hold no op (Coll or P2p event), and the trace's event mask had "
                                      f"both but not every op type ({blind}), so those ops leave no record: ops may "
                                      f"have run inside comm.profiling(True, mask=...) with a block mask without "
                                      f"KernelStep and KernelCh (a block's mask is not in the trace); record with Coll "
                                      f"and P2p in the mask too (SLICETRACE_PROFILE_EVENT_MASK=65606) to see which "
                                      f"ops ran, and keep KernelStep|KernelCh in a block's mask"
                                      if blind and not run.ops else
                                      f": the files hold no op (Coll or P2p event), though the trace's event mask had "
                                      f"both (EventMask {masks}): no op ran with profiling on, or the ranks were "
                                      f"stopped before their profiler's first write" if not run.ops else
                                      f", though the trace's event mask had both (EventMask {masks}): its {run.ops} "
                                      f"op(s) moved no data between ranks (a count of 0 runs no channel program, and "
                                      f"a send/recv to the rank itself is a local copy), or ran inside "
                                      f"comm.profiling(True, mask=...) with a mask without them (a block's mask is not "
                                      f"in the trace)"))
        if run.masks and all(m & EventType.KERNEL_STEP for m in run.masks):   # KernelStep alone is enough
            raise SliceTraceError(f"{where}: no KernelStep events to analyse ({run.records} events in "
                                  f"all), though the trace's event mask had KernelStep (EventMask "
                                  f"{', '.join(map(str, sorted(run.masks)))}): no op moved data between ranks with "
                                  f"profiling on (a count of 0 runs no channel program; ops inside "
                                  f"comm.profiling(True, mask=...) without KernelStep leave none), or the ranks were "
                                  f"stopped before their profiler's first write")
        if run.masks and all(m & EventType.KERNEL_CH and not m & EventType.COLL for m in run.masks):
            raise SliceTraceError(f"{where}: no KernelStep events to analyse ({run.records} events in "
                                  f"all), and KernelCh events count only under their Coll (its SeqNum matches a "
                                  f"channel across ranks), which the trace's event mask left out (EventMask "
                                  f"{', '.join(map(str, sorted(run.masks)))}); record with Coll, KernelCh and "
                                  f"KernelStep in the mask, e.g. SLICETRACE_PROFILE_EVENT_MASK=65606")
        raise SliceTraceError(f"{where}: no KernelStep or KernelCh events to analyse "
                              f"({run.records} events in all)" + (
                                  "" if run.masks else ", and no slicetrace_comm record, which slicetrace's example "
                                  "plugin writes first in each file: a trace of another tool? report reads the "
                                  "example plugin's per-rank files") +
                              "; record with both in the mask, e.g. `slicetrace bench --trace DIR` or "
                              "SLICETRACE_PROFILE_EVENT_MASK=65606")
    rep = build(ks, counts, top=a.top, chs=chs, ranks=present, starts=run.starts(), spans=run.spans(),
                names=run.names(), failures=run.failures(), sym=run.sym())
    return rep, ks


def _report_comms(a: argparse.Namespace, runs: list, where: str, text: Any) -> int:
    """`report --all-comms` over several communicators: each one's report, in their order (first op first), under a
    heading with its hash, name and ranks; --json a dict keyed by commHash (README). One with nothing to analyse (a
    1-rank communicator) says why in its place; an error when none has anything."""
    from ..analyze.report import _console, render
    from ..analyze.steps_csv import write_steps_csv
    done = []                           # (facts, run, notes, report or None, KernelSteps, why not)
    for facts, run in runs:
        at = f"{where} (commHash {facts.comm})"
        notes = _notes(a, run, at)      # a rank left out is an error, not a communicator without slices
        try:
            done.append((facts, run, notes, *_analysed(a, run, at), None))
        except SliceTraceError as e:
            done.append((facts, run, notes, None, None, e))
    if all(d[3] is None for d in done):
        raise done[0][5]
    if a.json is not None:      # the files first, as for one communicator
        write_json("--json", a.json, {f.comm: {"name": f.name, "ranks": run.present, **(
            {"report": rep.to_dict()} if rep is not None else {"error": str(e)})} for f, run, _, rep, _, e in done})
    if a.csv is not None:
        with output_errors("--csv", a.csv):
            ks, comms = _pooled([(f.comm, ks) for f, _, _, _, ks, _ in done if ks is not None])
            n = write_steps_csv(ks, a.csv, comms)
    con = _console(text)
    for f, run, notes, rep, _, e in done:
        print(f"## commHash {f.comm}" + (f" ({f.name})" if f.name else "") + f": ranks "
              f"{', '.join(map(str, run.present))}" + (f" of {run.ranks.n}" if run.ranks else ""), file=text)
        for line in notes + ([f"# nothing to report: {e}"] if rep is None else []):
            print(line, file=text)
        if rep is not None:
            render(rep, con)
    if a.csv is not None:
        print(f"# {n} KernelStep rows of {len(runs)} communicators (column comm): "
              f"{'standard output' if a.csv == STDOUT else a.csv}", file=text)
    return 0


def _pooled(tables: list[tuple[str, Any]]) -> tuple[Any, Any]:
    """Communicators' KernelStep tables as one, with each row's commHash (the CSV's comm column)."""
    import numpy as np
    ks = np.concatenate([t for _, t in tables])
    return ks, np.concatenate([np.full(len(t), int(c), np.uint64) for c, t in tables])


def _ops_unrecorded(masks: set) -> str:
    """Which of the trace's event masks lack Coll or P2p, and which ('' for none): ops of a type left out leave no
    record, so files without ops say nothing of whether any ran."""
    kinds = ((EventType.COLL, "Coll (1<<1)"), (EventType.P2P, "P2p (1<<2)"))
    return "; ".join(f"EventMask {m} lacks {' and '.join(n for bit, n in kinds if not m & bit)}"
                     for m in sorted(masks) if any(not m & bit for bit, _ in kinds))


def run_convert(a: argparse.Namespace) -> int:
    from ..analyze.perfetto import convert
    from ..analyze.trace import trace_files
    a.output = STDOUT if names_stdout(a.output) else a.output       # /dev/stdout: the summary line to stderr
    writable_file("-o", a.output, stdout_ok=True)
    if a.output == STDOUT and sys.stdout.isatty():      # binary protobuf would garble the terminal (gzip refuses too)
        raise UsageError("-o '-': standard output is a terminal and the Perfetto trace is binary; redirect it "
                         "(-o - > run.pftrace, or into a pipe) or give a file name")
    files = trace_files(a.traces)
    _not_an_input([("-o", a.output)], files)
    with output_errors("-o", a.output):      # reading is TraceFormatError: an OSError here is the write
        got = convert(files, a.output, partial=a.partial, all_comms=a.all_comms)
    if got["left_out"]:
        print(f"# --partial: {got['left_out']}; the trace shows the ranks present only",
              file=sys.stderr if a.output == STDOUT else sys.stdout)
    failed = f", {got['failures']} failure instant(s) (where an op raised)" if got["failures"] else ""
    each = got.get("comms", [])        # --all-comms: per communicator, where there are several
    comms = "".join(f"; commHash {c['comm']}" + (f" ({c['name']})" if c["name"] else "") + f": {c['files']} rank "
                    f"file(s), {c['slices']} slices, {c['flows']} flows" for c in each) if len(each) > 1 else ""
    print(f"# {'standard output' if a.output == STDOUT else a.output}: {got['files']} rank file(s), {got['slices']} "
          f"slices on {got['tracks']} tracks, {got['flows']} send -> receive flows{failed}"
          + (f", {len(got['comms'])} communicators{comms}" if comms else "") + " (open in https://ui.perfetto.dev)",
          file=sys.stderr if a.output == STDOUT else sys.stdout)
    return 0


def add_all_comms(p: argparse.ArgumentParser, command: str) -> None:
    """report's and convert's --all-comms (registered here: main.py stays short)."""
    p.add_argument("--all-comms", action="store_true", help=(
        "the files may be of several communicators of one job (data-, tensor-parallel, ...): " + (
            "one process per communicator and rank in one trace, flows within each communicator"
            if command == "convert" else "one report per communicator, in the order of their first op; --json a "
            "dict keyed by commHash, --csv with a comm column")
        + "; without it, files of two communicators are refused (two runs in one folder)"))


_EXAMPLE = {"--json": "report.json", "--csv": "steps.csv", "-o": "run.pftrace"}     # an output of each flag's kind


def _not_an_input(outs: list[tuple[str, str]], files: list[str]) -> None:
    """Refuse an output path that is one of the trace files read: writing it would destroy that rank's trace."""
    for flag, path in outs:
        same = next((f for f in files if _same_file(f, path)), None)
        if same is not None:
            raise UsageError(f"{flag} {path!r} is one of the input trace files ({same!r}); give another file, "
                             f"e.g. {_EXAMPLE[flag]}")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)       # links too
    except OSError:                         # b not there yet: not an input
        return False


