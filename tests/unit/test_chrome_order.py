"""sinks.chrome: where a run's ranks and a rank's tracks appear when its per-rank files are opened together.
Perfetto (v53+, JSON import: process_sort_index) and chrome://tracing order processes by sort index first, never
by pid; a process's tracks by tid (Perfetto) or by sort index, then name (chrome://tracing)."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from slicetrace.analyze.perfetto_tracks import _track_order
from slicetrace.sinks.chrome_text import thread_meta
from tests.unit.test_sink_comms import _write


def _meta(path):
    return [r for r in json.load(open(path)) if r and r.get("ph") == "M"]


def test_a_4_rank_runs_processes_sort_by_rank_and_its_tracks_as_convert_orders_them(tmp_path):
    # Ranks were said to come out in an arbitrary order: the sort index is the rank in every file, the pids (a
    # hash, per communicator) stay distinct, and each rank's tracks carry the order convert gives them.
    files = [_write(tmp_path, 111, r, nranks=4) for r in (2, 0, 3, 1)]
    procs = []
    for f in files:
        meta = _meta(f)
        pid = {r["pid"] for r in meta}
        assert len(pid) == 1
        rank = next(r["args"]["Rank"] for r in meta if r["name"] == "slicetrace_comm")
        order = [r["args"]["sort_index"] for r in meta if r["name"] == "process_sort_index"]
        name = next(r["args"]["name"] for r in meta if r["name"] == "process_name")
        assert order == [rank]
        procs.append((order[0], name, pid.pop()))
        names = {r["tid"]: r["args"]["name"] for r in meta if r["name"] == "thread_name"}
        place = [(r["args"]["sort_index"], r["tid"]) for r in meta if r["name"] == "thread_sort_index"]
        assert sorted(t for _, t in place) == sorted(names)         # every named track placed, once
        assert all(i == t for i, t in place)                        # by its tid: Perfetto's order is the same
        tracks = [names[t] for _, t in sorted(place)]
        assert tracks[:2] == ["ops", "proxy"] and len(tracks) > 2
        assert tracks[2:] == sorted(tracks[2:], key=_track_order)
    assert [n for _, n, _ in sorted(procs)] == [f"rank {r} (comm 111)" for r in range(4)]
    pids = [p for _, _, p in procs]
    assert len(set(pids)) == 4 and all(0 < p < 2 ** 31 for p in pids)


@given(st.sets(st.tuples(st.integers(0, 63), st.integers(0, 1), st.integers(0, 65535)), min_size=1, max_size=40))
def test_kernel_step_tracks_sort_as_converts_tracks_do(tids):
    """One order for a rank's KernelStep tracks in both views: the JSON's sort index (= tid) and convert's
    (_track_order: by channel as a number, receives before sends, by peer)."""
    meta = [json.loads(line.rstrip(",")) for line in thread_meta(7, tids).splitlines()]
    names = {r["tid"]: r["args"]["name"] for r in meta if r["name"] == "thread_name"}
    place = {r["tid"]: r["args"]["sort_index"] for r in meta if r["name"] == "thread_sort_index"}
    assert len(names) == len(place) == len(tids) and len(set(place.values())) == len(tids)
    by_index = [names[t] for t in sorted(place, key=place.get)]
    assert by_index == sorted(names.values(), key=_track_order)
