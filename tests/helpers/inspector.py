"""Reading NCCL Inspector's JSON lines in tests: the keys and types of its format, and its exporter's flattening."""
from __future__ import annotations

import glob
import json
import os

HEADER = {"id": str, "rank": int, "n_ranks": int, "nnodes": int}
METADATA = {"inspector_output_format_version": str, "git_rev": str, "rec_mechanism": str, "dump_timestamp_us": int,
            "hostname": str, "pid": int}
PERF = {"coll": str, "coll_sn": int, "coll_msg_size_bytes": int, "coll_exec_time_us": int, "coll_timing_source": str,
        "coll_algobw_gbs": float, "coll_busbw_gbs": float}


def read_log(path) -> list[dict]:
    """A .log file's lines, each checked to be one whole JSON object."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n") or not text, path
    return [json.loads(line) for line in text.splitlines()]


def read_lines(folder) -> list[dict]:
    """Every line of the folder's .log files."""
    return [ln for path in sorted(glob.glob(os.path.join(str(folder), "*.log"))) for ln in read_log(path)]


def check_keys(line: dict, verbose: bool = False) -> None:
    """header, metadata and coll_perf with exactly Inspector's keys and types (and the verbose ones when asked)."""
    assert list(line) == ["header", "metadata", "coll_perf"]
    extra = {"event_trace_sn": dict, "event_trace_ts": dict} if verbose else {}
    for part, want in (("header", HEADER), ("metadata", METADATA), ("coll_perf", {**PERF, **extra})):
        assert list(line[part]) == list(want), part
        for k, t in want.items():
            assert type(line[part][k]) is t, (part, k, line[part][k])
    assert line["header"]["id"] == hex(int(line["header"]["id"], 16))       # 0x, lowercase, no padding
    assert line["metadata"]["inspector_output_format_version"] == "v4.0"
    assert line["metadata"]["rec_mechanism"] == "nccl_profiler_interface"
    assert line["coll_perf"]["coll_timing_source"] in ("kernel_gpu", "kernel_cpu", "collective_cpu")


def flatten(folder) -> list[dict]:
    """NCCL's perf_summary_exporter's flattening, with dicts: every *.log/*.jsonl under the folder, lines without the
    three parts skipped, dict(**header, comm_type, **coll_perf, **metadata)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(str(folder), "**", "*.log"), recursive=True)
                       + glob.glob(os.path.join(str(folder), "**", "*.jsonl"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            for text in f:
                rec = json.loads(text)
                if not all(k in rec for k in ("header", "metadata", "coll_perf")):
                    continue
                h = rec["header"]
                comm_type = ("single-rank" if h["n_ranks"] == 1 else "nvlink-only" if h["nnodes"] == 1 else
                             "hca-only" if h["n_ranks"] == h["nnodes"] else "mixed")
                rows.append(dict(**h, comm_type=comm_type, **rec["coll_perf"], **rec["metadata"]))
    return rows
