"""The flightrec plugin on real 2-rank cpu runs: a rank that leaves mid-run makes its peer's op fail, and the
survivor's flight record holds the last ops' KernelSteps (as the example plugin's trace of the same run has them)
and the unfinished op, passes check_trace, and report names the failure; a healthy run writes nothing."""
from __future__ import annotations

import glob

import numpy as np
import pytest

from slicetrace.analyze import check_trace
from slicetrace.analyze.records import read_records
from slicetrace.cli.main import main
from tests.helpers.procs import RankPool

KW = dict(timeout_s=20.0, buffsize=1 << 16)


@pytest.fixture(scope="module")
def pool2():
    p = RankPool(2, timeout=120)
    yield p
    p.close()


def _comm(ctx, name, **kw):
    import slicetrace
    return slicetrace.init(rank=ctx["rank"], world_size=ctx["world"], store=ctx["store"],
                           job=f"{ctx['job']}-{name}", **{**KW, **kw})


def _leaves_after_6(ctx, prefix, trace):
    """Rank 1 closes its communicator after 6 all-reduces; rank 0's 7th fails. Rank 0 returns the error's class
    and the flight record files there were before its close (the dump is written at the failure)."""
    import slicetrace
    c = _comm(ctx, "leave", profiler_plugin="example,flightrec", profile_dump_file=trace, flightrec_file=prefix,
              flightrec_ops=4)
    x = np.ones(1 << 14, np.float32)
    if ctx["rank"] == 1:
        for _ in range(6):
            c.all_reduce(x)
        c.close()
        return None
    try:
        for _ in range(8):
            c.all_reduce(x)
    except slicetrace.PeerError as e:
        before = glob.glob(f"{prefix}_*_0.json")
        c.close()
        return type(e).__name__, before
    finally:
        c.close()
    return "no error", []


def _steps(recs, seqs):
    return sorted((r["args"]["SeqNum"], r["args"]["Channel"], r["args"]["IsSend"], r["args"]["Step"], r["ts"],
                   r["dur"]) for r in recs if r.get("name") == "KernelStep" and r["args"]["SeqNum"] in seqs)


def test_the_survivor_s_flight_record_holds_the_last_ops_and_the_failed_one(pool2, tmp_path, capsys):
    prefix, trace = str(tmp_path / "fr" / "rec"), str(tmp_path / "tr" / "trace")
    (err, before), _ = pool2.run(_leaves_after_6, prefix, trace)
    assert err == "PeerError" and len(before) == 1          # written at the failure, before close
    (path,) = glob.glob(f"{prefix}_*_0.json")
    assert glob.glob(f"{prefix}_*_1.json") == []            # the rank that left had no failure
    assert check_trace(path) == []
    recs = read_records(path)
    (w,) = [r["args"] for r in recs if r.get("name") == "slicetrace_flightrec"]
    assert (w["Trigger"], w["FirstSeqNum"], w["LastSeqNum"]) == ("failure", {"AllReduce": 2}, {"AllReduce": 6})
    assert w["OpsEvicted"] == 2 and w["OpsKept"] == 5
    (u,) = w["Unfinished"]
    assert (u["Op"], u["SeqNum"], u["InFlight"]) == ("AllReduce", 6, False)
    assert all(c["Peer"] == 1 and c["Channel"] == 0 for c in u["Connections"])
    (full,) = glob.glob(f"{trace}_*_0.json")                # the example plugin's trace of the same run
    kept = _steps(recs, {2, 3, 4, 5})
    assert kept and kept == _steps(read_records(full), {2, 3, 4, 5})
    (inst,) = [r for r in recs if r.get("cat") == "ERROR"]
    assert inst["args"]["Error"] == "PeerError" and inst["args"]["SeqNum"] == 6
    assert main(["report", path, "--partial"]) == 0
    out = capsys.readouterr().out
    assert "unfinished: AllReduce #6" in out and "raised PeerError" in out and "kept ops 3..7 of 7" in out


def _healthy(ctx, quiet, always):
    for name, prefix, dump in (("quiet", quiet, "failure"), ("always", always, "always")):
        c = _comm(ctx, name, profiler_plugin="linkstats,flightrec", flightrec_file=prefix, flightrec_dump=dump,
                  flightrec_ops=3)
        x = np.ones(1 << 12, np.float32)
        for _ in range(5):
            c.all_reduce(x)
        c.close()


def test_a_healthy_run_writes_nothing_unless_always(pool2, tmp_path, capsys):
    quiet, always = str(tmp_path / "quiet" / "rec"), str(tmp_path / "always" / "rec")
    pool2.run(_healthy, quiet, always)
    assert not (tmp_path / "quiet").exists()
    paths = sorted(glob.glob(f"{always}_*.json"))
    assert len(paths) == 2 and all(check_trace(p) == [] for p in paths)
    assert main(["report", str(tmp_path / "always")]) == 0
    out = capsys.readouterr().out
    assert "kept ops 3..5 of 5" in out and "unfinished" not in out and "missing" not in out
