"""`convert --all-comms` and `report --all-comms` on a real 2-rank job with two traced communicators (data- and
tensor-parallel, the second with a pipeline's send/recv pair): one trace with a process per (communicator, rank)
and flows only within a communicator, each as many as that communicator's own convert draws; one report per
communicator, each the report of that communicator alone. Without the flag both refuse and name it; two separate
runs in one folder are named by the guard."""
from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.perfetto import convert, wire_fields
from slicetrace.analyze.trace import trace_files
from slicetrace.cli.main import main

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _job(comm, prefix):
    kw = dict(backend="cpu", rank=comm.rank, world_size=2, store=comm._session.store, profiler_plugin="example",
              profile_dump_file=prefix, buffsize=1 << 16, nchannels=2, timeout_s=30)
    dp = slicetrace.init(job=f"{comm._session.job}-dp", name="dp", **kw)
    tp = slicetrace.init(job=f"{comm._session.job}-tp", name="tp", **kw)
    x, y = np.ones(100_000, np.float32), np.zeros(100_000, np.float32)
    for _ in range(3):                          # interleaved, as a training step's gradients and activations
        dp.all_reduce(x, x)
        tp.all_reduce(x, x)
    with tp.group():                            # a pipeline stage's send/recv pair
        tp.send(x, 1 - comm.rank)
        tp.recv(y, 1 - comm.rank)
    tp.broadcast(x, root=1)
    dp.close()
    tp.close()
    return dp.comm_hash, tp.comm_hash


def _solo(comm):
    comm.all_reduce(np.ones(50_000, np.float32))
    return comm.comm_hash


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """(folder, prefix, {name: commHash}) of one run of _job."""
    folder = tmp_path_factory.mktemp("job")
    prefix = str(folder / "t")
    hashes = slicetrace.launch(_job, 2, prefix, join_timeout_s=120)
    assert hashes[0] == hashes[1]
    return str(folder), prefix, dict(zip(("dp", "tp"), map(str, hashes[0])))


def _tracks(path: str) -> tuple[dict, dict, list]:
    """A .pftrace's process names by track uuid, each track's parent, and (track, flow ids, terminating flow ids)
    of every event."""
    names, parent, events = {}, {}, []
    for _, pkt in wire_fields(open(path, "rb").read()):
        for f, v in wire_fields(pkt):
            if f == 60:                         # TrackDescriptor: uuid 1, parent_uuid 5, process 3 (name 6)
                d = dict(wire_fields(v))
                parent[d[1]] = d.get(5)
                if 3 in d:
                    names[d[1]] = dict(wire_fields(d[3]))[6].decode()
            elif f == 11:                       # TrackEvent: track 11, flow_ids 47, terminating_flow_ids 48
                e = wire_fields(v)
                events.append((dict(e).get(11), [x for k, x in e if k == 47], [x for k, x in e if k == 48]))
    return names, parent, events


def _process(track: int, names: dict, parent: dict) -> str:
    while track not in names:
        track = parent[track]
    return names[track]


def test_convert_all_comms_draws_each_communicators_processes_and_its_own_flows(job, tmp_path, capsys, caplog):
    folder, prefix, h = job
    out = str(tmp_path / "all.pftrace")
    assert main(["convert", folder, "-o", out]) == 2
    err = capsys.readouterr().err
    assert "2 communicators (runs), which one convert does not pool" in err and "pass --all-comms" in err
    assert not os.path.exists(out)
    alone = {n: convert(trace_files(f"{prefix}_{c}"), str(tmp_path / f"{n}.pftrace")) for n, c in h.items()}
    with caplog.at_level(logging.WARNING, "slicetrace"):
        got = convert(trace_files(folder), out, all_comms=True)
    assert "never overlap" not in caplog.text           # one job's communicators: no guard
    assert got["comms"] == [{"comm": h[n], "name": n, "files": 2, "slices": alone[n]["slices"],
                             "flows": alone[n]["flows"]} for n in ("dp", "tp")]     # dp's first op came first
    assert all(alone[n]["flows"] > 0 for n in h) and alone["tp"]["flows"] > alone["dp"]["flows"]    # + send/recv
    assert (got["slices"], got["flows"], got["tracks"]) == tuple(sum(a[k] for a in alone.values())
                                                                 for k in ("slices", "flows", "tracks"))
    names, parent, events = _tracks(out)
    assert sorted(names.values()) == sorted(f"rank {r} (comm {c})" for c in h.values() for r in (0, 1))
    ends: dict = defaultdict(lambda: [set(), set()])         # flow id -> the processes of its start, its end
    for track, starts, stops in events:
        for i, ids in enumerate((starts, stops)):
            for fid in ids:
                ends[fid][i].add(_process(track, names, parent))
    per_comm: dict = defaultdict(int)
    for fid, (a, b) in ends.items():
        assert len(a) == len(b) == 1, fid
        (pa,), (pb,) = a, b
        assert pa.split("(comm ")[1] == pb.split("(comm ")[1] and pa != pb, (pa, pb)    # within one communicator
        per_comm[pa.split("(comm ")[1].rstrip(")")] += 1
    assert per_comm == {h[n]: alone[n]["flows"] for n in h}
    assert main(["convert", folder, "-o", out, "--all-comms"]) == 0
    line = capsys.readouterr().out
    assert (f"2 communicators; commHash {h['dp']} (dp): 2 rank file(s), {alone['dp']['slices']} slices, "
            f"{alone['dp']['flows']} flows; commHash {h['tp']} (tp)") in line, line
    env = {**os.environ, "PYTHONPATH": os.path.join(_ROOT, "src")}
    check = subprocess.run([sys.executable, os.path.join(_ROOT, "scripts", "convert_check.py"), folder,
                            str(tmp_path / "check.pftrace"), "--all-comms"], env=env, capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0 and check.stdout.strip().endswith("OK"), check.stdout + check.stderr
    assert f"flows {got['flows']} flow_ends {got['flows']}" in check.stdout


def _sections(text: str) -> dict[str, tuple[str, str]]:
    """report --all-comms' text: commHash -> (its heading, the lines under it)."""
    out, key = {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith("## commHash "):
            key = line.split()[2]
            out[key] = (line, "")
        elif key is not None:
            out[key] = (out[key][0], out[key][1] + line)
    return out


def test_report_all_comms_is_each_communicators_report_in_turn(job, tmp_path, capsys):
    folder, prefix, h = job
    assert main(["report", folder]) == 2
    err = capsys.readouterr().err
    assert "which one report does not pool" in err and "pass --all-comms to report each in turn" in err
    alone, alone_json = {}, {}
    for n, c in h.items():
        assert main(["report", f"{prefix}_{c}", "--json", str(tmp_path / f"{n}.json")]) == 0
        alone[n] = capsys.readouterr().out
        alone_json[n] = json.loads((tmp_path / f"{n}.json").read_text())
    js, cs = str(tmp_path / "all.json"), str(tmp_path / "all.csv")
    assert main(["report", folder, "--all-comms", "--json", js, "--csv", cs]) == 0
    text, note = capsys.readouterr().out.rsplit("# ", 1)          # the CSV's note ends it
    rows = list(csv.DictReader(open(cs)))
    assert note == f"{len(rows)} KernelStep rows of 2 communicators (column comm): {cs}\n"
    sections = _sections(text)
    assert list(sections) == [h["dp"], h["tp"]]                 # in the order of their first op
    for n, c in h.items():
        assert sections[c][0] == f"## commHash {c} ({n}): ranks 0, 1 of 2\n"
        assert sections[c][1] == alone[n]                   # the report of that communicator alone
        assert "AllReduce" in alone[n]
    got = json.loads(open(js).read())
    assert list(got) == [h["dp"], h["tp"]]
    assert got == {c: {"name": n, "ranks": [0, 1], "report": alone_json[n]} for n, c in h.items()}
    for n, c in h.items():
        mine = [r for r in rows if r["comm"] == c]
        assert len(mine) == sum(x["slices"] for x in alone_json[n]["ranks"]) > 0
    assert len(rows) == sum(r["comm"] in h.values() for r in rows)
    # one communicator with the flag: today's output, the JSON's shape too
    assert main(["report", f"{prefix}_{h['tp']}", "--all-comms", "--json", js]) == 0
    assert capsys.readouterr().out == alone["tp"] and json.loads(open(js).read()) == alone_json["tp"]


def test_two_separate_runs_in_one_folder_are_named_by_the_guard(job, tmp_path, capsys, caplog):
    """A second run's files copied beside the job's: their times never overlap, which --all-comms says, naming the
    communicators of each side and how to take each alone."""
    folder, prefix, h = job
    mixed = tmp_path / "mixed"
    shutil.copytree(folder, mixed)
    solo = str(slicetrace.launch(_solo, 2, profiler_plugin="example", profile_dump_file=str(mixed / "s"),
                                 join_timeout_s=120)[0])
    with caplog.at_level(logging.WARNING, "slicetrace"):
        got = convert(trace_files(str(mixed)), str(tmp_path / "x.pftrace"), all_comms=True)
    assert [c["comm"] for c in got["comms"]] == [h["dp"], h["tp"], solo]
    warned = [r.getMessage() for r in caplog.records if "never overlap" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert "fall into 2 groups that never overlap" in warned[0]
    assert f"commHash {h['dp']} (dp), commHash {h['tp']} (tp) at 0.000000.." in warned[0]
    assert f"; commHash {solo} (slicetrace-" in warned[0]
    job_prefix = os.path.relpath(str(mixed / "t"))           # the command that takes each run alone
    assert (f"take each alone: slicetrace convert {job_prefix}_{h['dp']} {job_prefix}_{h['tp']} --all-comms "
            f"-o run_{h['dp']}.pftrace; slicetrace convert {os.path.relpath(str(mixed / 's'))}_{solo} "
            f"-o run_{solo}.pftrace") in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "slicetrace"):
        assert main(["report", str(mixed), "--all-comms"]) == 0
    assert sum("never overlap" in r.getMessage() for r in caplog.records) == 1
    assert list(_sections(capsys.readouterr().out)) == [h["dp"], h["tp"], solo]
