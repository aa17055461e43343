"""Output files of the CLI: checked by really opening them before the work runs (nothing is lost at the end), and
--trace's files named from what the run wrote."""
from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import re
import sys
import tempfile
import time
from typing import Iterator

from ..analyze.atomic import STDOUT, atomic_open
from ..config import temp_dir, unwritable
from ..errors import SliceTraceError, UsageError
from ..events.abi import EventType


def writable_file(flag: str, path: str, stdout_ok: bool = False) -> None:
    """Fail before the work, not after it: open the file for appending (os.access says yes to root everywhere,
    /proc included), and remove it again if this made it. stdout_ok: '-' is standard output (the command's own
    text then goes to stderr); else '-' is refused, not made a file of that name."""
    if names_stdout(path):
        if stdout_ok:
            return
        raise UsageError(f"{flag} {path!r}: this command prints its table on standard output, so that cannot be "
                         f"the file too; give a file name" + (" (./- for a file named '-')" if path == STDOUT else ""))
    if not path:                            # open('') fails with a bare errno; name the flag instead
        raise UsageError(f"{flag} {path!r}: an empty path names no file; give a file name")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path!r} is a folder; give a file name")
    existed = os.path.lexists(path)
    try:
        with open(path, "a"):               # "a": an existing file keeps its content until the real write
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path!r}: cannot write a file there ({e.strerror or e})") from None
    if not existed:
        try:
            os.remove(path)
        except OSError:
            pass


def names_stdout(path: str) -> bool:
    """'-', or a path to the file standard output writes to (/dev/stdout, /proc/self/fd/1, the file it is
    redirected to): written to as a file, the command's text would land in it too, or a rename replace it."""
    if path == STDOUT:
        return True
    try:
        a, b = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):       # not there; stdout closed, or not a real file (pytest's)
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def output_errors(flag: str, path: str) -> Iterator[None]:
    """A write of flag's file that fails is a UsageError naming it; standard output's errors (a reader gone,
    `| head`, also through /dev/stdout) are main's to end, quietly for a pipe."""
    try:
        yield
    except OSError as e:
        if path == STDOUT or isinstance(e, BrokenPipeError):
            raise
        raise UsageError(f"{flag} {path!r}: cannot write the file ({e.strerror or e})") from None


def writable_folder(flag: str, path: str) -> None:
    if not path:
        raise UsageError(f"{flag} {path!r}: an empty path names no folder; give a folder name (. for this one)")
    if os.path.exists(path) and not os.path.isdir(path):    # makedirs' own word for it is 'File exists'
        raise UsageError(f"{flag} {path!r} is a file, not a folder; give a folder name")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path!r}: cannot create the folder ({e.strerror or e})") from None
    why = unwritable(path)                  # a real file, as for writable_file
    if why is not None:
        raise UsageError(f"{flag} {path!r}: cannot write files in the folder ({why[1]})")


def _finite(obj):
    """NaN and infinities as null: JSON has no such numbers (Python writes NaN, strict parsers refuse the file)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(flag: str, path: str, obj) -> None:
    with output_errors(flag, path), atomic_open(path, "w", encoding="utf-8") as f:    # no half-written file
        json.dump(_finite(obj), f, indent=1, allow_nan=False)


def rows_log(json_path: str | None) -> str | None:
    """A temporary file rank 0 appends each bench row to (one JSON line), so that --json still gets the rows measured
    before a failure or an interrupt; None without --json."""
    if json_path is None:
        return None
    fd, path = tempfile.mkstemp(prefix="slicetrace_rows_", suffix=".jsonl", dir=temp_dir())
    os.close(fd)
    return path


def log_row(path: str | None, row: dict) -> None:
    if path is not None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(_finite(row)) + "\n")


def logged_rows(path: str) -> list[dict]:
    """The rows rank 0 logged; a last line cut short (the rank killed mid-write) is left out."""
    rows = []
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
    return rows


def dump_files(folder: str, stem: str = "trace") -> dict[str, tuple[int, int]]:
    """The dump files <folder>/<stem>_<commHash>_<rank>.json, with what tells a rewritten one (mtime, size)."""
    out = {}
    for f in glob.glob(os.path.join(glob.escape(folder), glob.escape(stem) + "_*_*.json")):
        try:
            st = os.stat(f)
        except OSError:
            continue
        out[f] = (st.st_mtime_ns, st.st_size)
    return out


def _complete(path: str) -> bool:
    """Whether a dump file ends with its closing ']': a plugin whose write failed (a full disk), or a rank killed
    while writing, leaves the array open."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64))
            return f.read().rstrip().endswith(b"]")
    except OSError:
        return False


def _settled_broken(broken: list[str], seen: dict[str, tuple[int, int]], quiet_s: float = 0.5,
                    limit_s: float = 3.0) -> list[str]:
    """The files of `broken` that stay unfinished and unchanged for quiet_s. One finished meanwhile was a rank's
    last write landing late (a loaded host); one still changing at limit_s is another run's, being written."""
    seen = {f: seen[f] for f in broken}
    changed = dict.fromkeys(broken, time.monotonic())       # file -> when it last changed (or was first seen)
    end = time.monotonic() + limit_s
    while changed and any(time.monotonic() - t < quiet_s for t in changed.values()):
        if time.monotonic() >= end:
            return [f for f, t in changed.items() if time.monotonic() - t >= quiet_s]
        time.sleep(0.05)
        for f in list(changed):
            try:
                st = os.stat(f)
            except OSError:
                continue
            if (st.st_mtime_ns, st.st_size) != seen[f]:
                seen[f] = (st.st_mtime_ns, st.st_size)
                if _complete(f):
                    del changed[f]
                else:
                    changed[f] = time.monotonic()
    return list(changed)


def trace_note(folder: str, before: dict[str, tuple[int, int]], plugins: str | None, mask: int | None,
               stem: str = "trace", what: str | None = None, failed: bool = False) -> str:
    """The line naming the trace files this run wrote (those new or changed since `before`); none is an error,
    naming the effective plugins and event mask (SLICETRACE_PROFILER_PLUGIN, SLICETRACE_PROFILE_EVENT_MASK), and
    so is a file its plugin did not finish, unless the run failed (failed: its ranks may have been killed mid-write;
    the line names those files). what: where the files' prefix came from (default --trace's folder)."""
    what = what or f"--trace {folder!r}"
    written, broken = _written(folder, stem, before, what, failed, "trace")
    if not written:
        raise SliceTraceError(f"{what}: the run wrote no trace file there; was profiling off? "
                              f"(profiler plugins {plugins!r}, event mask {mask}: SLICETRACE_PROFILER_PLUGIN, "
                              f"SLICETRACE_PROFILE_EVENT_MASK)")
    runs = _runs(written)
    names = ", ".join(f"{r}_<rank>.json" for r in runs)
    sel = runs[0] if len(runs) == 1 else folder
    # the arrows need KernelSteps, report KernelSteps or KernelChs under their Coll: else it was sent to an error
    steps = mask is None or bool(mask & EventType.KERNEL_STEP)
    chs = mask is None or mask & (EventType.KERNEL_CH | EventType.COLL) == EventType.KERNEL_CH | EventType.COLL
    report = (f"links, waits and stragglers: slicetrace report {sel}" if steps or chs else
              f"slicetrace report needs KernelStep, or KernelCh with Coll, in the event mask ({mask})")
    cut = f", cut short when the run failed: {', '.join(broken)}" if broken else ""
    return (f"# traces: {names} ({len(written)} file(s){cut}; open in https://ui.perfetto.dev; all ranks in one"
            f"{', with send -> receive arrows' if steps else ''}: slicetrace convert {sel} -o run.pftrace; {report})")


def _written(folder: str, stem: str, before: dict[str, tuple[int, int]], what: str, failed: bool,
             kind: str) -> tuple[list[str], list[str]]:
    """(the dump files new or changed since `before`, those of them left incomplete); incomplete ones are an error
    unless the run failed (its ranks may have been killed mid-write)."""
    now = dump_files(folder, stem)
    written = sorted(f for f, st in now.items() if before.get(f) != st)
    broken = _settled_broken([f for f in written if not _complete(f)], now)
    if broken and not failed:
        raise SliceTraceError(f"{what}: {len(broken)} of the {len(written)} {kind} file(s) this run "
                              f"wrote are incomplete (no closing ']'): {', '.join(broken)}; their profiler plugin "
                              f"failed to finish them (a failed write, e.g. a full disk: see the error its rank "
                              f"logged); slicetrace report and convert read them up to their last whole record")
    return written, broken


def _runs(written: list[str]) -> list[str]:
    """The prefixes <prefix>_<commHash> of dump files, one per communicator."""
    return sorted({re.sub(r"_\d+\.json$", "", f) for f in written})


def flightrec_note(prefix: str, before: dict[str, tuple[int, int]], nranks: int, always: bool, failed: bool,
                   what: str) -> str:
    """The line naming the flight records (<prefix>_<commHash>_<rank>.json) this run wrote. None is normal: the
    recorder writes at a failure or an unfinished op, and at every close only with SLICETRACE_FLIGHTREC_DUMP=always,
    where none (every rank's write failed: they logged why) is an error unless the run failed. what: the prefix's
    setting, as the line names it."""
    folder, stem = os.path.dirname(prefix) or ".", os.path.basename(prefix)
    written, broken = _written(folder, stem, before, what, failed, "flight record")
    if not written:
        if always and not failed:
            raise SliceTraceError(f"{what} with SLICETRACE_FLIGHTREC_DUMP=always: the run wrote no flight record "
                                  f"there; each rank's flightrec plugin failed to write it (see the error its rank "
                                  f"logged)")
        why = ("the run failed outside any op its recorders saw (e.g. at start-up)" if failed else
               "no op failed or ended unfinished, as in a healthy run: SLICETRACE_FLIGHTREC_DUMP=always writes one "
               "at every close")
        return f"# flight records: none written ({what}; {why})"
    runs = _runs(written)
    sel = runs[0] if len(runs) == 1 else folder
    partial = " --partial" if len(written) < nranks * len(runs) else ""       # only the ranks that saw it fail
    cut = f", cut short when the run failed: {', '.join(broken)}" if broken else ""
    return (f"# flight records: {', '.join(f'{r}_<rank>.json' for r in runs)} ({len(written)} file(s){cut}): "
            f"slicetrace report {sel}{partial}")
