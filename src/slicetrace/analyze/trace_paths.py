"""The trace files a path names, as the user gives it to report, convert or the loaders: a file, a folder of dump
files, a dump prefix or a glob (trace_files)."""
from __future__ import annotations

import glob
import os
import re
import stat
from typing import Iterable

from ..errors import TraceFormatError

_DIR_NAME = re.compile(r".*_\d+_\d+\.json")       # a folder's dump files: <prefix>_<commHash>_<rank>.json
_RUN_NAME = re.compile(r"\d+_\d+\.json")         # after <prefix>_
_RANK_NAME = re.compile(r"\d+\.json")             # after <prefix>_<commHash>_


def trace_files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """A file, a folder (the dump files in it: `bench --trace DIR`), a dump prefix (`<prefix>_<commHash>_<rank>.json`
    files) or a glob pattern, or a list of these -> the files. Names are taken literally first (a folder may be
    called x[1]); only the sinks' file names count in a folder or under a prefix (not a report's JSON beside them)."""
    if not isinstance(paths, (str, os.PathLike)):
        return [f for p in paths for f in trace_files(p)]
    p = os.fspath(paths)
    if os.path.isfile(p):                          # a file first: its name may hold '[' or '*'
        files = [p]
    elif os.path.isdir(p):
        files = _named(os.path.join(p, ""), _DIR_NAME)
    else:                                          # a dump prefix, or one run's: <prefix>_<commHash>
        files = _named(p + "_", _RUN_NAME) or _named(p + "_", _RANK_NAME)
        if not files and p.endswith("_"):          # a shell's completion stops at the shared '_': trace_<commHash>_
            files = _named(p, _RUN_NAME) or _named(p, _RANK_NAME)
        if not files and any(c in p for c in "*?["):
            files = sorted(glob.glob(p))
    if not files:
        takes = "a file, a folder of <prefix>_<commHash>_<rank>.json files, a glob, or a dump prefix"
        what = _not_a_trace(p)
        raise TraceFormatError(f"{p!r} is {what}; give {takes}" if what else
                               f"no trace files match {p!r} ({takes})")
    return files


def _not_a_trace(p: str) -> str | None:
    """What a path that is there is, when it is neither a file nor a folder (report /dev/null said "no trace files
    match", as for a path that is not there); None when nothing is there, or a folder (its files did not match)."""
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return f"a symbolic link to {os.readlink(p)!r}, which is not there" if os.path.islink(p) else None
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        return None
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "something") + ", not a trace file or a folder"


def _named(head: str, tail: re.Pattern) -> list[str]:
    """The files `head` + a name matching `tail` (head taken literally, not as a glob)."""
    n = len(head)
    return sorted(f for f in glob.glob(glob.escape(head) + "*.json") if tail.fullmatch(f[n:]))
