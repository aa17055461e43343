"""What one trace record may hold: the single check that report, convert and check_trace apply to every record.

Fields are those the example plugin writes (sinks/chrome.py, chrome_text.py): KernelStep "X" records with the
device clocks WaitGpuClk (wait began) <= StartGpuClk (ready) <= StopGpuClk (done); KernelCh "b" records with the
channel program's StartGpuClk <= StopGpuClk; Coll/P2p "b" records with the op's args. Each problem names the field,
its value and what is accepted, so the loader can add the file and the record's index.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any, NamedTuple

from ..errors import TraceFormatError

log = logging.getLogger("slicetrace")

MAX_CHANNELS = 64           # config_rules.MAXCHANNELS (analyze may not import it): channels are 0..63
_I32, _I64, _U64 = (1 << 31) - 1, (1 << 63) - 1, (1 << 64) - 1     # the analysis tables' column types
# ts and dur are µs; the analyses hold them as int64 ns. Less 1 µs: past 2**53 a float µs is 2 µs coarse, and
# the bound itself (9223372036854775) read as a float and * 1000 rounded to 2**63
_MAX_US = _I64 // 1000 - 1

REQUIRED_ARGS: dict[tuple[str, str | None], tuple[str, ...]] = {
    ("COLL", None): ("SeqNum", "CommHash", "Rank", "Count", "Datatype", "Algorithm", "Protocol", "nChannels"),
    ("P2P", None): ("CommHash", "Rank", "Peer", "Count", "Datatype", "nChannels"),
    ("GPU", "KernelCh"): ("Channel", "StartGpuClk", "StopGpuClk"),
    ("GPU", "KernelStep"): ("Channel", "IsSend", "Peer", "Step", "Size", "WaitGpuClk", "StartGpuClk", "StopGpuClk"),
}
STEP_ARGS = REQUIRED_ARGS[("GPU", "KernelStep")]
FAILURE_CAT = "ERROR"       # an instant where an op failed: args Error, Message (strings), Op, SeqNum where known
# integer args -> (lowest, highest, what the range is); Peer and Rank also stop below the run's rank count
_BOUNDS: dict[str, tuple[int, int, str]] = {
    "Channel": (0, MAX_CHANNELS - 1, "a channel"),
    "IsSend": (0, 1, "1 for a send, 0 for a receive"),
    "Peer": (0, _I32, "a rank"),
    "Rank": (0, _I32, "a rank"),
    "Step": (0, _I64, "a FIFO step"),
    "Size": (0, _I64, "bytes"),
    "Count": (0, _I64, "elements"),
    "WaitGpuClk": (0, _I64, "a clock in ns"),
    "StartGpuClk": (0, _I64, "a clock in ns"),
    "StopGpuClk": (0, _I64, "a clock in ns"),
    "SeqNum": (-1, _I64, "the op's sequence number, -1 for none"),
    "nChannels": (0, MAX_CHANNELS, "a channel count"),
    "CommHash": (0, _U64, "a 64-bit hash"),
}
_TIMED = ("b", "e", "X", "i")


class Ranks(NamedTuple):
    """A run's rank count and where it was learnt (for the error message)."""
    n: int
    source: str


def _number(v: Any) -> bool:
    return (type(v) is float and math.isfinite(v)) or type(v) is int      # type(): a bool is no number here


def _kind(r: dict) -> tuple[str, str | None] | None:
    """The REQUIRED_ARGS key of a record that carries args the analyses read (op and KernelCh "b", KernelStep)."""
    ph, cat, name = r.get("ph"), r.get("cat"), r.get("name")
    if ph == "X" and name == "KernelStep":
        return "GPU", "KernelStep"
    if ph == "b" and cat in ("COLL", "P2P"):
        return cat, None
    if ph == "b" and cat == "GPU" and name == "KernelCh":
        return "GPU", "KernelCh"
    return None


def record_problem(r: dict, need_args: bool = True) -> str | None:
    """The first field of one record that the analyzers cannot use (named, with its value and what is accepted),
    or None. need_args: the args the analyses read must be there (check_trace lists missing ones its own way).
    Ranks are checked against the run's rank count apart (rank_problem): it is known once all its files are read."""
    ph = r.get("ph")
    for k in ("ph", "name", "cat"):
        if k in r and type(r[k]) is not str:
            return f"{k!r} must be a string, not {r[k]!r}"
    if "pid" in r:
        if type(r["pid"]) is not int:
            return f"'pid' must be an integer (the rank), not {r['pid']!r}"
        if not 0 <= r["pid"] <= _I32:
            return _out_of_range("pid", r["pid"], 0, _I32, "the rank", None)
    for k in ("tid", "id"):
        if k in r and type(r[k]) not in (int, str):
            return f"{k!r} must be an integer or a string, not {r[k]!r}"
    if "ts" in r or ph in _TIMED:
        if "ts" not in r:
            return "has no 'ts'"
        if not _number(r["ts"]):
            return f"'ts' must be a finite number, not {r['ts']!r}"
        if not -_MAX_US <= r["ts"] <= _MAX_US:
            return f"'ts' is {r['ts']!r}: accepted -{_MAX_US}..{_MAX_US} µs (its ns must fit in int64)"
    if "dur" in r and not (_number(r["dur"]) and r["dur"] >= 0):
        return f"'dur' must be a finite number >= 0 (the slice ends after it begins), not {r['dur']!r}"
    if "dur" in r and not max(r.get("ts", 0), 0) + r["dur"] <= _MAX_US:     # its end too is held in ns
        return f"'dur' is {r['dur']!r}: accepted ts + dur <= {_MAX_US} µs (the slice's end in ns must fit in int64)"
    a = r.get("args")
    if a is None:
        a = {}
    elif type(a) is not dict:
        return f"'args' must be an object, not {a!r}"
    kind = _kind(r)
    if need_args and kind is not None:
        missing = [k for k in REQUIRED_ARGS[kind] if k not in a]
        if missing:
            what = kind[1] or f"{kind[0]} 'b'"
            return f"'args' lacks {missing}, which every {what} record carries"
    for k, v in a.items():
        b = _BOUNDS.get(k)
        if b is None:
            continue
        if type(v) is not int:
            return f"'args.{k}' must be an integer, not {v!r}"
        if not b[0] <= v <= b[1]:
            return _out_of_range(f"args.{k}", v, *b, None)
    if a.get("ParentId") is not None and (type(a["ParentId"]) is not int or not -1 <= a["ParentId"] <= _I64):
        return f"'args.ParentId' must be an integer in -1..{_I64} (-1: no parent) or null, not {a['ParentId']!r}"
    if ph == "M" and r.get("name") == "thread_name" and type(a.get("name", "")) is not str:
        return f"'args.name' must be a string, not {a['name']!r}"
    if ph == "i" and r.get("cat") == FAILURE_CAT:       # report quotes them
        bad = next((k for k in ("Error", "Message", "Op") if type(a.get(k, "")) is not str), None)
        if bad is not None:
            return f"'args.{bad}' must be a string (an op's failure: its error class, message and op), not {a[bad]!r}"
    if r.get("name") == "slicetrace_counters":          # report sums and formats them as integers
        bad = next((k for k, v in a.items() if type(v) is not int), None)
        if bad is not None:
            return f"'args.{bad}' must be an integer (a counter), not {a[bad]!r}"
        # counts are never negative (report printed "overrun -3" as a loss); the clock offset may be
        bad = next((k for k, v in a.items() if v < 0 and k != "clock_offset_ns"), None)
        if bad is not None:
            return f"'args.{bad}' is {a[bad]}: accepted >= 0 (a count; only clock_offset_ns may be negative)"
    if kind == ("COLL", None) and a.get("SeqNum", 0) < 0:        # stragglers match collectives by SeqNum
        return f"'args.SeqNum' is {a['SeqNum']}: accepted 0..{_I64}, the collective's sequence number"
    if kind is not None and kind[0] == "GPU":            # (a missing clock is need_args's to name)
        step = kind[1] == "KernelStep"
        start, stop = a.get("StartGpuClk"), a.get("StopGpuClk")
        wait = a.get("WaitGpuClk", start) if step else start
        if start is not None and stop is not None and not wait <= start <= stop:
            return _clock_order(a, step)
    return None


def _out_of_range(field: str, v: int, lo: int, hi: int, what: str, ranks: Ranks | None) -> str | None:
    if ranks is not None:
        if lo <= v < ranks.n:
            return None
        return f"'{field}' is {v}: accepted {lo}..{ranks.n - 1}, the ranks of this run ({ranks.source})"
    if lo <= v <= hi:
        return None
    return f"'{field}' is {v}: accepted {lo}..{hi} ({what})"


def _clock_order(a: dict, step: bool) -> str:
    """Clocks out of the order they are read in: wait <= ready (Start) <= done (Stop)."""
    names = ("WaitGpuClk", "StartGpuClk", "StopGpuClk") if step else ("StartGpuClk", "StopGpuClk")
    got = ", ".join(f"{n} {a.get(n)}" for n in names)
    return f"clocks out of order ({got}): accepted {' <= '.join(names)}, the order they are read in"


def rank_problem(r: dict, ranks: Ranks) -> str | None:
    """record_problem's rank bounds alone (pid, args.Rank, args.Peer below the run's rank count), for a second
    pass once every file of the run is read and the count is known."""
    if type(r.get("pid")) is int:
        bad = _out_of_range("pid", r["pid"], 0, _I32, "the rank", ranks)
        if bad:
            return bad
    a = r.get("args")
    if type(a) is dict:
        for k in ("Rank", "Peer"):
            if type(a.get(k)) is int:
                bad = _out_of_range(f"args.{k}", a[k], 0, _I32, "a rank", ranks)
                if bad:
                    return bad
    return None


def read_records(path: str, empty_ok: bool = False, cut: list[str] | None = None) -> list[dict]:
    """One file's records (NCCL's trailing {} left out); TraceFormatError unless it is a JSON array of objects
    (an empty file: [] when empty_ok). An array cut short (a rank killed while writing; Chrome's trace format lets
    the closing ] go) is read up to its last whole record, with a warning, or with its message appended to `cut`
    when given (check_trace's problem). The sinks' one record per line is read a block of lines at a time (memory:
    the records, not the file's text too); other layouts whole. Pids become ranks where slicetrace_comm names its
    pid's Rank (the sinks' pid is per communicator)."""
    whole: list[int] = []            # the records read of a file cut short
    try:
        with open(path, encoding="utf-8") as f:
            data = _by_lines(f, whole)
            if data is None:
                f.seek(0)
                whole.clear()
                data = _whole(f.read(), path, empty_ok, whole)
    except TraceFormatError:
        raise
    except (OSError, ValueError) as e:      # ValueError: not utf-8
        raise TraceFormatError(f"trace file {path!r} cannot be read: {e}") from e
    for n in whole:
        said = (f"trace file {path!r} was cut short (its rank was stopped, or its profiler's write failed, while "
                f"writing): read its {n} whole records")
        if cut is None:
            log.warning("slicetrace: %s", said)
        else:
            cut.append(said)
    return _ranks_as_pids([r for r in data if r])      # NCCL's example plugin ends with an empty object


def _whole(text: str, path: str, empty_ok: bool, whole: list[int]) -> list:
    if not text.strip():
        if empty_ok:
            return []
        raise TraceFormatError(f"trace file {path!r} is empty: its rank ended before its profiler wrote anything "
                               f"(killed, or stopped without closing its communicator); --partial (report, convert) "
                               f"goes on with the other ranks")
    try:
        data = json.loads(text)
    except RecursionError:                  # no trace nests that deep; the parser gives up
        raise TraceFormatError(f"trace file {path!r} cannot be read as JSON: nested too deeply (a trace is an "
                               f"array of flat records)") from None
    except ValueError as e:
        data = _cut_short(text)
        if data is None:
            raise TraceFormatError(f"trace file {path!r} cannot be read as JSON: {e}") from e
        whole.append(len(data))
    if isinstance(data, dict) and "traceEvents" in data:
        data = data["traceEvents"]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise TraceFormatError(f"trace file {path!r} is not a JSON array of objects")
    return data


_BLOCK = 1 << 22        # characters of lines parsed at once: json's key memo is shared within one loads


def _by_lines(f: Any, whole: list[int]) -> list | None:
    """The records of a file laid out as the sinks write it ("[", then a record per line, then "]"), or None
    for anything else (read whole then, which also words its errors) except a cut last line (read as cut short:
    how many records it had is appended to `whole`)."""
    first = f.readline()
    if first.strip() != "[":
        return None
    out: list = []
    block: list[str] = []
    size, closed, comma = 0, False, None      # comma: whether the last record line ended with one
    while True:
        line = f.readline()
        eof = not line
        s = line.strip()
        if s == "]":
            if comma:                   # [..., x,] is no JSON: read whole, and refused
                return None
            closed = True
        elif s:
            if comma is False:          # two records without a comma between them: likewise
                return None
            comma = s.endswith(",")
            block.append(s[:-1] if comma else s)
            size += len(s)
        if block and (eof or closed or size >= _BLOCK):
            got = _parse_block(block, eof)
            if got is None:
                return None
            out += got
            if len(got) < len(block):       # its cut last line
                whole.append(len(out))
                return out
            block, size = [], 0
        if closed:
            return out if not f.read().strip() else None      # text after the end: read whole (and refused)
        if eof:
            whole.append(len(out))
            return out


def _parse_block(block: list[str], eof: bool) -> list | None:
    """A block of record lines as objects; at the end of a file cut short its partial last line is left out."""
    try:
        got = json.loads("[" + ",".join(block) + "]")
    except (ValueError, RecursionError):
        if not eof or block[-1].endswith("]"):       # not cut: the end is there (read whole, and refused)
            return None
        try:
            got = json.loads("[" + ",".join(block[:-1]) + "]")
        except (ValueError, RecursionError):
            return None
    if len(got) > len(block) or not all(isinstance(r, dict) for r in got):   # a line of several values
        return None
    return got


def _ranks_as_pids(recs: list[dict]) -> list[dict]:
    """The analyses key ranks by pid: where a slicetrace_comm record names its pid's Rank, that pid's records take
    the rank as pid (files of earlier versions have pid = rank already)."""
    ranks = {r["pid"]: r["args"]["Rank"] for r in recs if r.get("name") == "slicetrace_comm"
             and type(r.get("pid")) is int and type(r.get("args")) is dict and type(r["args"].get("Rank")) is int}
    if any(p != k for p, k in ranks.items()):
        for r in recs:
            p = r.get("pid")
            if type(p) is int and p in ranks:
                r["pid"] = ranks[p]
    return recs


def _cut_short(text: str) -> list | None:
    """The records of a JSON array whose end is missing (one record per line, as the sinks write), else None."""
    if not text.lstrip().startswith("[") or text.rstrip().endswith("]"):    # whole, but damaged: refused
        return None
    end = len(text)
    for _ in range(3):                       # the last line or two may be partial
        end = text.rfind("\n", 0, end)
        if end < 0:
            return None
        try:
            data = json.loads(text[:end].rstrip().rstrip(",") + "]")
        except ValueError:
            continue
        return data if isinstance(data, list) else None
    return None
