"""The linkstats plugin's Prometheus text file: format, escaping, periodic rewrites, a file that cannot be written."""
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from slicetrace.config import Settings
from slicetrace.errors import ConfigError
from slicetrace.events.abi import KERNEL_STEP_DTYPE, ActivationMask, CommInfo
from slicetrace.sinks.linkstats import LinkStatsPlugin, prometheus_text


def _recs(rows):
    r = np.zeros(len(rows), KERNEL_STEP_DTYPE)
    for i, (ch, snd, peer, size, wait, ready, done) in enumerate(rows):
        r[i]["channel"], r[i]["is_send"], r[i]["peer"], r[i]["size"] = ch, snd, peer, size
        r[i]["wait_ns"], r[i]["ready_ns"], r[i]["done_ns"] = wait, ready, done
    return r


def _plugin(tmp_path, interval_s=10.0, name='job "a"\nb'):
    s = Settings(linkstats_file=str(tmp_path / "m"), linkstats_interval_s=interval_s)
    p = LinkStatsPlugin(s)
    return p, p.init(CommInfo(42, name, 1, 2, 1), ActivationMask())


def test_text_carries_every_link_with_seconds_and_escaped_labels(tmp_path):
    p, ctx = _plugin(tmp_path)
    p.kernel_step_batch(ctx, None, _recs([(0, 1, 0, 1000, 0, 500, 2500), (0, 1, 0, 3000, 10, 10, 1010),
                                          (1, 0, 0, 64, 0, 0, 7)]))
    text = prometheus_text(ctx.comm, ctx.table, {"overrun": 2, "clock_offset_ns": 1500})
    base = 'comm="42",comm_name="job \\"a\\"\\nb",rank="1"'
    assert f'slicetrace_link_bytes_total{{{base},channel="0",direction="send",peer="0"}} 4000' in text
    assert f'slicetrace_link_slices_total{{{base},channel="1",direction="recv",peer="0"}} 1' in text
    assert f'slicetrace_link_wait_seconds_total{{{base},channel="0",direction="send",peer="0"}} 0.000000500' in text
    assert f'slicetrace_link_transfer_seconds_total{{{base},channel="0",direction="send",peer="0"}} 0.000003000' \
        in text
    assert f'slicetrace_profiler_accounting_total{{{base},counter="overrun"}} 2' in text
    assert f"slicetrace_clock_offset_seconds{{{base}}} 0.000001500" in text
    assert "# TYPE slicetrace_link_bytes_total counter" in text and text.endswith("\n")


def test_the_file_is_rewritten_each_interval_and_at_finalize_with_the_counters(tmp_path, monkeypatch):
    import slicetrace.sinks.linkstats as ls
    now = [100.0]
    monkeypatch.setattr(ls.time, "monotonic", lambda: now[0])
    p, ctx = _plugin(tmp_path, interval_s=5.0, name="c")
    path = tmp_path / "m_42_1.prom"
    p.kernel_step_batch(ctx, None, _recs([(0, 1, 0, 100, 0, 0, 10)]))
    assert "slicetrace_link_bytes_total{" not in path.read_text()   # the init's empty table: no interval yet
    now[0] += 6
    p.kernel_step_batch(ctx, None, _recs([(0, 1, 0, 100, 0, 0, 10)]))
    assert ctx.writer.idle(30) and 'direction="send",peer="0"} 200' in path.read_text()
    p.kernel_step_batch(ctx, None, _recs([(0, 1, 0, 100, 0, 0, 10)]))
    assert ctx.writer.idle(30) and 'peer="0"} 200' in path.read_text()       # not yet again
    p.report_counters(ctx, {"overrun": 0, "no_parent": 3})
    p.finalize(ctx)
    text = path.read_text()
    assert 'peer="0"} 300' in text and 'counter="no_parent"} 3' in text
    assert [f.name for f in tmp_path.iterdir()] == ["m_42_1.prom"]      # no temporary file left


def test_a_missing_folder_is_made_and_a_file_that_cannot_be_written_at_init_is_refused(tmp_path):
    LinkStatsPlugin(Settings(linkstats_file=str(tmp_path / "new" / "sub" / "m"))).init(CommInfo(7, "c", 1, 2, 0),
                                                                                       ActivationMask())
    assert (tmp_path / "new" / "sub" / "m_7_0.prom").read_text().startswith("#")   # as the example plugin does
    (tmp_path / "file").write_text("")
    s = Settings(linkstats_file=str(tmp_path / "file" / "m"))                        # a folder that is a file
    with pytest.raises(ConfigError, match=r"linkstats_file \(SLICETRACE_LINKSTATS_FILE\)=.*file/m_7_0.prom: "):
        LinkStatsPlugin(s).init(CommInfo(7, "c", 1, 2, 0), ActivationMask())


def test_a_file_that_cannot_be_written_later_is_logged_once_and_written_again_when_it_can(tmp_path, caplog):
    """Before, one failed write turned the metrics file off for good, close included (a folder removed and made
    again, a moment of ENOSPC, ended a live view meant to last days)."""
    (tmp_path / "d").mkdir()
    s = Settings(linkstats_file=str(tmp_path / "d" / "m"), linkstats_interval_s=1e-9)
    p = LinkStatsPlugin(s)
    ctx = p.init(CommInfo(7, "c", 1, 2, 0), ActivationMask())
    prom = tmp_path / "d" / "m_7_0.prom"
    assert prom.read_text().startswith("# HELP")     # written at init, empty table
    prom.unlink()
    (tmp_path / "d").rmdir()
    (tmp_path / "d").write_text("")                 # the folder gone, a file in its way: writes fail
    with caplog.at_level(logging.ERROR, logger="slicetrace"):
        for _ in range(2):
            assert p.kernel_step_batch(ctx, None, _recs([(0, 1, 1, 8, 0, 0, 1)])) == 1
            assert ctx.writer.idle(30)
    assert len([r for r in caplog.records if "trying again" in r.getMessage()]) == 1
    (tmp_path / "d").unlink()                       # the way clear again: the next write makes the folder
    old_umask = os.umask(0o077)
    try:
        p.finalize(ctx)
    finally:
        os.umask(old_umask)
    assert 'slicetrace_link_bytes_total{comm="7"' in prom.read_text() and p.snapshot(ctx)[0]["bytes"] == 16
    assert oct(prom.stat().st_mode & 0o777) == "0o644"          # readable by a collector of another user


def test_interval_must_be_positive():
    with pytest.raises(ConfigError, match=r"linkstats_interval_s=0.0 must be > 0 seconds"):
        Settings(linkstats_interval_s=0.0)


def test_a_fused_slice_counts_as_moving_once_both_its_data_and_room_were_there(tmp_path):
    """Credit at 0, data at 900, done at 1000 (one primitive's send and receive): 100 ns of transfer each way,
    not 1000 for the send; the 900 ns show as the receive's wait."""
    p, ctx = _plugin(tmp_path)
    p.kernel_step_batch(ctx, None, _recs([(0, 1, 1, 64, 0, 0, 1000), (0, 0, 1, 64, 0, 900, 1000)]))
    rows = {r["is_send"]: r for r in p.snapshot(ctx)}
    assert rows[True]["transfer_us"] == pytest.approx(0.1) and rows[True]["wait_us"] == 0
    assert rows[False]["transfer_us"] == pytest.approx(0.1) and rows[False]["wait_us"] == pytest.approx(0.9)


def test_a_polls_runs_sum_like_their_batches_contiguous_or_not(tmp_path):
    """kernel_step_runs (one call per drain poll) keeps the table kernel_step_batch (one call per op) would: with
    the runs back to back and with rows between them that belong to no run."""
    rows = [(c % 3, c % 2, 1, 100 + c, 10 * c, 10 * c + 3, 10 * c + 9) for c in range(12)]
    recs = _recs(rows)
    runs = [(0, 4), (4, 9), (9, 12)]
    p1, c1 = _plugin(tmp_path)
    for a, b in runs:
        p1.kernel_step_batch(c1, None, recs[a:b])
    for starts, stops in (([0, 4, 9], [4, 9, 12]), ([0, 5, 9], [4, 8, 12])):
        p2, c2 = _plugin(tmp_path)
        n = p2.kernel_step_runs(c2, [None] * 3, recs, starts, stops)
        assert n == sum(b - a for a, b in zip(starts, stops))
        if starts == [0, 4, 9]:
            assert p2.snapshot(c2) == p1.snapshot(c1)
        else:
            p3, c3 = _plugin(tmp_path)
            for a, b in zip(starts, stops):
                p3.kernel_step_batch(c3, None, recs[a:b])
            assert p2.snapshot(c2) == p3.snapshot(c3) and sum(r["slices"] for r in p2.snapshot(c2)) == 10


def test_records_of_two_ops_in_one_poll_are_never_paired_as_one_fused_slice(tmp_path):
    """A send of one op and a receive of the next on one channel with one done clock are two slices, not one
    primitive's two halves: the send moves from its own ready (0), not the receive's (900)."""
    recs = _recs([(0, 1, 1, 64, 0, 0, 1000), (0, 0, 1, 64, 0, 900, 1000)])
    p, ctx = _plugin(tmp_path)
    assert p.kernel_step_runs(ctx, [None, None], recs, [0, 1], [1, 2]) == 2
    rows = {r["is_send"]: r for r in p.snapshot(ctx)}
    assert rows[True]["transfer_us"] == 1.0 and rows[True]["wait_us"] == 0
    assert rows[False]["transfer_us"] == 0.1 and rows[False]["wait_us"] == 0.9


def test_clock_counters_are_gauges_in_seconds_not_accounting_counters(tmp_path):
    """The *_ns counters are the device clock's offset and uncertainty, not records lost: only their gauges."""
    p, ctx = _plugin(tmp_path, name="c")
    text = prometheus_text(ctx.comm, ctx.table, {"overrun": 2, "clock_offset_ns": 1500,
                                                 "clock_uncertainty_ns": 20})
    base = 'comm="42",comm_name="c",rank="1"'
    acct = [ln for ln in text.splitlines() if ln.startswith("slicetrace_profiler_accounting_total{")]
    assert acct == [f'slicetrace_profiler_accounting_total{{{base},counter="overrun"}} 2']
    assert f"slicetrace_clock_offset_seconds{{{base}}} 0.000001500" in text
    assert f"slicetrace_clock_uncertainty_seconds{{{base}}} 0.000000020" in text
    only_clock = prometheus_text(ctx.comm, ctx.table, {"clock_offset_ns": 1500})
    assert "slicetrace_profiler_accounting_total" not in only_clock     # not even its HELP and TYPE


def test_the_file_is_utf8_whatever_the_locale_and_a_failed_write_leaves_no_temporary_file(tmp_path):
    """open() without an encoding took the locale's: under LC_ALL=C a communicator name with an accent raised
    UnicodeEncodeError, which (not an OSError) also left the temporary file behind."""
    import os
    import subprocess
    import sys
    code = ("import sys, numpy as np\n"
            "from slicetrace.config import Settings\n"
            "from slicetrace.events.abi import KERNEL_STEP_DTYPE, ActivationMask, CommInfo\n"
            "from slicetrace.sinks.linkstats import LinkStatsPlugin\n"
            "p = LinkStatsPlugin(Settings(linkstats_file=sys.argv[1]))\n"
            "ctx = p.init(CommInfo(42, 'j\\u00f6b', 1, 2, 1), ActivationMask())\n"
            "p.kernel_step_batch(ctx, None, np.zeros(1, KERNEL_STEP_DTYPE))\n"
            "p.finalize(ctx)\n")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert [f.name for f in tmp_path.iterdir()] == ["m_42_1.prom"]
    assert 'comm_name="j\u00f6b"' in (tmp_path / "m_42_1.prom").read_text(encoding="utf-8")


def test_sampling_is_stated_and_a_comm_name_of_any_bytes_is_written(tmp_path):
    """The counters count kept slices of profiled ops, and nothing said so; a comm name from bytes that are not UTF-8
    (lone surrogates) made every write raise UnicodeEncodeError."""
    import os
    s = Settings(linkstats_file=str(tmp_path / "m"), linkstats_interval_s=1e-9, sample_rate=4, op_sample_rate=10)
    p = LinkStatsPlugin(s)
    ctx = p.init(CommInfo(7, os.fsdecode(b"train-\xe9"), 1, 2, 0), ActivationMask())
    assert p.kernel_step_batch(ctx, None, _recs([(0, 1, 1, 8, 0, 0, 1)])) == 1
    p.finalize(ctx)
    text = (tmp_path / "m_7_0.prom").read_text()
    assert 'setting="kernel_step_sample_rate"} 4' in text and 'setting="op_sample_rate"} 10' in text
    assert 'comm_name="train-\\\\udce9"' in text and "slicetrace_link_bytes_total{" in text


_NEVER_CLOSED = """
import numpy as np, slicetrace
from slicetrace.rendezvous import DictStore
c = slicetrace.init(backend="null", rank=0, world_size=2, store=DictStore({{}}), profiler_plugin="linkstats",
                    linkstats_file={path!r}, linkstats_interval_s=3600)
{before}
c.all_reduce(np.ones(1 << 16, np.float32))     # KernelSteps on the null backend's links; never closed
{after}
"""


def _never_closed(tmp_path, before: str = "", after: str = "") -> str:
    """Run a process whose linkstats communicator stays open to its exit; the .prom file it left (once a child
    whose pid it printed has ended too)."""
    import subprocess
    import sys
    import time
    code = _NEVER_CLOSED.format(path=str(tmp_path / "m"), before=before, after=after)
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True,
                         cwd=str(Path(__file__).parents[2])).stdout.split()
    end = time.monotonic() + 30
    while out and time.monotonic() < end:           # the child outlives its parent: wait for its exit
        try:
            if open(f"/proc/{out[-1]}/stat").read().split(")")[-1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    (prom,) = tmp_path.glob("m_*_0.prom")
    return prom.read_text()


def test_a_communicator_never_closed_gets_its_last_write_at_exit(tmp_path):
    """Only finalize wrote the last table: a run kept to the process's end left the empty table of init."""
    assert "slicetrace_link_bytes_total{" in _never_closed(tmp_path)


def test_a_forked_child_exiting_does_not_rewrite_the_parents_file(tmp_path):
    """The exit hook ran in a forked child too: its exit rewrote the .prom with the table as it was at the fork."""
    before = "import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(1.0)\n    sys.exit(0)"
    assert "slicetrace_link_bytes_total{" in _never_closed(tmp_path, before, "print(pid, flush=True)")


def test_a_prefix_that_names_a_folder_puts_the_file_inside_it(tmp_path, monkeypatch):
    """os.path.abspath dropped the trailing '/': SLICETRACE_LINKSTATS_FILE=textfile/ wrote textfile_<hash>_<rank>.prom
    beside the folder, where node_exporter's textfile collector does not look (the example plugin writes inside)."""
    monkeypatch.chdir(tmp_path)
    for prefix in (str(tmp_path / "abs") + os.sep, "rel" + os.sep):
        ctx = LinkStatsPlugin(Settings(linkstats_file=prefix)).init(CommInfo(7, "c", 1, 2, 0), ActivationMask())
        assert ctx.path == str(tmp_path / prefix / "_7_0.prom")
        assert (tmp_path / prefix / "_7_0.prom").read_text().startswith("# HELP")
    monkeypatch.chdir(tmp_path / "rel")         # a later chdir still does not move it
    assert os.path.isabs(ctx.path)


def test_the_summary_at_finalize_shows_plain_numbers(tmp_path, caplog):
    """wait_us and transfer_us were numpy floats: under numpy 2 each summary line read
    'wait_us': np.float64(0.5), not 'wait_us': 0.5."""
    p, ctx = _plugin(tmp_path, name="c")
    p.kernel_step_batch(ctx, None, _recs([(0, 1, 0, 1000, 0, 500, 2500)]))
    assert all(type(v) in (int, float, bool) for row in p.snapshot(ctx) for v in row.values())
    with caplog.at_level(logging.INFO, logger="slicetrace"):
        p.finalize(ctx)
    (line,) = [r.getMessage() for r in caplog.records if "linkstats rank" in r.getMessage()]
    assert "'wait_us': 0.5, 'transfer_us': 2.0, 'gbps': 0.5}" in line and "np." not in line


@pytest.mark.parametrize("failing_before", [False, True])
def test_a_write_that_fails_at_close_says_the_final_table_is_lost(tmp_path, caplog, failing_before):
    """At close the error promised 'trying again every 10 s and at close' (no write follows), and after an earlier
    failure the last write failed without a word: the final table, with the host's counters, lost silently."""
    (tmp_path / "d").mkdir()
    p = LinkStatsPlugin(Settings(linkstats_file=str(tmp_path / "d" / "m"),
                                 linkstats_interval_s=1e-9 if failing_before else 10.0))
    ctx = p.init(CommInfo(7, "c", 1, 2, 0), ActivationMask())
    (tmp_path / "d" / "m_7_0.prom").unlink()
    (tmp_path / "d").rmdir()
    (tmp_path / "d").write_text("")                 # a file where the folder was: every write fails
    with caplog.at_level(logging.ERROR, logger="slicetrace"):
        p.kernel_step_batch(ctx, None, _recs([(0, 1, 1, 8, 0, 0, 1)]))
        p.finalize(ctx)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 + failing_before and "at close; its final table is lost" in msgs[-1]
    assert "trying again" not in msgs[-1]


def test_a_nul_byte_in_the_prefix_is_a_config_error_naming_it():
    """os.makedirs raised ValueError in init: the host logged a traceback and ran on without the plugin."""
    import slicetrace
    from slicetrace.rendezvous import DictStore
    want = r"^linkstats_file='m\\x00n' must be a path prefix without a NUL byte$"
    with pytest.raises(ConfigError, match=want):
        Settings(linkstats_file="m\0n")
    with pytest.raises(ConfigError, match=want):
        slicetrace.init(backend="null", rank=0, world_size=2, store=DictStore({}), profiler_plugin="linkstats",
                        linkstats_file="m\0n")


@pytest.mark.parametrize("text, problem", [
    ("# HELP a_total x\n# TYPE a_total counter\na_total 1", "does not end with a newline"),
    ("# HELP a_total x\n# TYPE a_total counter\n\na_total 1\n", "blank line"),
    ("# TYPE a_total counter\na_total 1\n", "no HELP and TYPE"),
    ("# HELP a_total x\n# HELP a_total y\n# TYPE a_total counter\na_total 1\n", "second HELP"),
    ("# HELP a_total x\n# TYPE a_total counter\na_total 1\n# TYPE a_total counter\n", "after the samples"),
    ("# HELP a_total x\n# TYPE a_total counter\na_total{k=\"1\"} 1\n# HELP b x\n# TYPE b gauge\nb 1\n"
     "a_total{k=\"2\"} 1\n", "not together"),
    ("# HELP a_total x\n# TYPE a_total counter\na_total{k=\"1\"} 1\na_total{k=\"1\"} 2\n", "duplicate series"),
    ("# HELP a_total x\n# TYPE a_total counter\na_total{k=\"1\",k=\"2\"} 1\n", "a label given twice"),
    ("# HELP a_total x\n# TYPE a_total counter\na_total{k=\"a\\tb\"} 1\n", "invalid escape"),
    ("# HELP a_total x\n# TYPE a_total counter\na_total{k=\"a\"b\"} 1\n", "expected ','"),
    ("# HELP a_total x\n# TYPE a_total counter\na_total 1 1700000000\n", "no timestamp"),
    ("# HELP a_total x\n# TYPE a_total counter\na_total -1\n", "counter value"),
    ("# HELP a x\n# TYPE a counter\na 1\n", "end in _total"),
    ("# HELP a_total x\n# TYPE a_total gauge\na_total 1\n", "end in _total"),
    ("# HELP a_ms x\n# TYPE a_ms gauge\na_ms 1\n", "not a base unit"),
    ("# HELP 1a x\n# TYPE 1a gauge\n1a 1\n", "bad metric name"),
    ("# HELP a x\n# TYPE a gauge\na{__k=\"1\"} 1\n", "bad label name"),
    ("# HELP a x\n# TYPE a gauge\na 1,5\n", "bad value"),
])
def test_the_strict_reader_refuses_what_the_exposition_format_forbids(text, problem):
    """The tests below trust tests/helpers/prom.parse: each rule it checks, broken once."""
    from tests.helpers.prom import PromError, parse
    with pytest.raises(PromError, match=problem):
        parse(text)
    assert parse("# HELP a_total x \\\\ \\n y\n# TYPE a_total counter\na_total{k=\"q\\\"\\\\\\n\"} 1.5e3\n") == \
        {"a_total": {"help": "x \\ \n y", "type": "counter", "samples": {(("k", 'q"\\\n'),): 1500.0}}}


def test_every_state_of_the_file_is_strict_exposition_text_with_one_unit_per_family(tmp_path):
    """At init (no links yet), mid-run and at close with counters, clocks, sampling and a name that needs escapes,
    the file parses strictly. profile_min_bytes (bytes) was a series of the unit-less slicetrace_sampling gauge,
    beside two '1 in k' factors: a sum or avg over that family mixed units; it is slicetrace_profile_min_bytes."""
    from tests.helpers.prom import parse, series
    s = Settings(linkstats_file=str(tmp_path / "m"), linkstats_interval_s=1e-9, sample_rate=4, op_sample_rate=10,
                 profile_min_bytes=65536)
    p = LinkStatsPlugin(s)
    ctx = p.init(CommInfo(42, 'j "a"\n\\b', 1, 3, 1), ActivationMask())
    path = tmp_path / "m_42_1.prom"
    states = [parse(path.read_text(encoding="utf-8"))]
    p.kernel_step_batch(ctx, None, _recs([(0, 1, 2, 1000, 0, 500, 2500), (1, 0, 0, 64, 0, 0, 7)]))
    assert ctx.writer.idle(30)
    states.append(parse(path.read_text(encoding="utf-8")))
    p.report_counters(ctx, {"overrun": 2, "clock_offset_ns": -1500, "clock_uncertainty_ns": 20})
    p.finalize(ctx)
    states.append(parse(path.read_text(encoding="utf-8")))
    for m in states:
        assert series(m, "slicetrace_sampling", "setting") == {("kernel_step_sample_rate",): 4,
                                                               ("op_sample_rate",): 10}
        assert series(m, "slicetrace_profile_min_bytes", "comm_name") == {('j "a"\n\\b',): 65536}
    assert states[0]["slicetrace_link_bytes_total"]["samples"] == {}
    assert series(states[1], "slicetrace_link_bytes_total", "channel", "direction", "peer") == \
        {("0", "send", "2"): 1000, ("1", "recv", "0"): 64}
    assert series(states[2], "slicetrace_clock_offset_seconds", "rank") == {("1",): -1.5e-6}
    assert series(states[2], "slicetrace_profiler_accounting_total", "counter") == {("overrun",): 2}


def test_the_help_of_the_time_counters_says_what_is_summed(tmp_path):
    """The HELP said 'time spent moving data, summed over channels' (each series is one channel) and not that a
    fused slice's two directions move from the later of their ready clocks: sums of done - ready over a trace then
    disagreed with it on every fused receive, and nothing in the file said why."""
    from tests.helpers.prom import parse
    p, ctx = _plugin(tmp_path, name="c")
    m = parse(prometheus_text(ctx.comm, ctx.table, {}, ctx.sampling))
    assert "ready - wait" in m["slicetrace_link_wait_seconds_total"]["help"]
    help_ = m["slicetrace_link_transfer_seconds_total"]["help"]
    assert "done - ready" in help_ and "later of their ready clocks" in help_ and "summed over channels" not in help_
