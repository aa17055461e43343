"""analyze.runtables with flight records: the window cut (flightwindow.evicted) reads each file's KernelCh table as
it is, so report's steps() joins the run's KernelCh table once, with the same tables as before."""
from __future__ import annotations

import numpy as np
import pytest

from slicetrace.analyze import KERNEL_CH_TABLE
from slicetrace.analyze.flightwindow import chs_in_window, evicted, spans_in_window
from slicetrace.analyze.records import read_records
from slicetrace.analyze.runtables import run_tables
from slicetrace.analyze.trace import coll_spans, kernel_chs
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks.flightrec import FlightRecPlugin


def _flight_records(tmp_path, keeps=(8, 5)):
    """Each rank's DUMP=always flight record of 10 synthetic all-reduces: rank r keeps its last keeps[r] ops, so
    the collectives before the shortest window are evicted there."""
    paths = []
    for rank, keep in enumerate(keeps):
        comm = abi.CommInfo(81, "t", 1, len(keeps), rank)
        s = Settings(flightrec_file=str(tmp_path / "rec"), flightrec_ops=keep, flightrec_dump="always")
        host = EventHost([LoadedPlugin(FlightRecPlugin(s))], comm)
        for op in SyntheticSource(nranks=len(keeps), rank=rank, nchannels=2, seed=rank).ops(10, host.op_mask()):
            host.begin_op(op.info)
            deliver(host, op)
        host.close()
        paths.append(str(tmp_path / f"rec_81_{rank}.json"))
    return paths


@pytest.mark.parametrize("spans_first", [False, True])
def test_the_kernel_ch_table_is_joined_once_with_the_same_window_cut(tmp_path, monkeypatch, spans_first):
    paths = _flight_records(tmp_path)
    joined = []
    concatenate = np.concatenate

    def counted(arrays, *a, **kw):
        arrays = list(arrays)
        if arrays and getattr(arrays[0], "dtype", None) == KERNEL_CH_TABLE:
            joined.append(len(arrays))
        return concatenate(arrays, *a, **kw)

    run = run_tables(paths)
    monkeypatch.setattr(np, "concatenate", counted)
    spans = run.spans() if spans_first else None
    ks, chs = run.steps()
    spans = run.spans() if spans is None else spans
    monkeypatch.undo()
    assert joined == [2]                                    # the two files' tables, once
    files = [read_records(p) for p in paths]
    parts = [kernel_chs(recs) for recs in files]
    whole, every_span = np.concatenate(parts), [s for recs in files for s in coll_spans(recs)]
    gone = evicted(run.flight, whole, every_span)
    assert gone == evicted(run.flight, parts, every_span) == {("AllReduce", s) for s in (2, 3, 4)}   # 0, 1: both
    assert np.array_equal(chs, chs_in_window(whole, gone)) and spans == spans_in_window(every_span, gone)
    assert sorted(set(chs["seq_number"].tolist())) == [5, 6, 7, 8, 9] and len(ks)
