"""`slicetrace report`'s verdicts name the rank that was slowed, and nothing in a healthy run.

Real runs: one launch runs every scenario, each on a communicator of its own with its own dump file; a rank is
slowed by sleeping before each op (a straggler) or by a sleep in each of its worker's copies (a slow data path, as
a slow GPU or a busy core would be). Synthetic records pin the rules: start-up skew apart, the noise floor, the
chain of waits, a slow link that must be slow in most ops.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import time
import uuid

import numpy as np
import pytest
from rich.console import Console

import slicetrace
from slicetrace.analyze.report import build, render, stragglers
from slicetrace.analyze.trace import KERNEL_CH_TABLE, KERNEL_STEP_TABLE
from slicetrace.cli.main import main
from slicetrace.rendezvous import DictStore

SCENARIOS = ("ok", "late", "copy", "bcast")
SUB = dict(profiler_plugin="example", buffsize=1 << 16, nchannels=1, timeout_s=30.0)


def _slow_copies(us: float):
    """This rank's cpu worker sleeps `us` before each np.copyto; returns the undo."""
    import slicetrace.backend.cpu.worker as w
    real = w.np

    class Slow:
        def __getattr__(self, k):
            return getattr(real, k)

        @staticmethod
        def copyto(*a, **k):
            time.sleep(us / 1e6)
            return real.copyto(*a, **k)

    w.np = Slow()
    return lambda: setattr(w, "np", real)


def _scenarios(comm, mapping, folder: str, job: str) -> int:
    r = comm.rank
    for name in SCENARIOS:
        undo = _slow_copies(300) if r == 2 and name in ("copy", "bcast") else None
        try:
            with slicetrace.init(rank=r, world_size=comm.world_size, store=DictStore(mapping), job=job + name,
                                 profile_dump_file=f"{folder}/{name}/run", **SUB) as sub:
                x = np.ones(1 << 16, np.float32)
                for _ in range({"bcast": 12}.get(name, 8)):     # 7 judged: enough to name a straggler or 1 of 3 links
                    # (and a rank most waited on in all 7; bcast's 11: in 9)
                    if name == "late" and r == 1:
                        time.sleep(0.03)            # rank 1 arrives 30 ms late at every op
                    if name == "bcast":
                        sub.broadcast(x, root=0)    # chain 0 -> 1 -> 2: rank 2 is the slow receiver
                    else:
                        sub.all_reduce(x)
                sub.flush_profiler()
        finally:
            if undo:
                undo()
    return r


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verdicts")
    with multiprocessing.Manager() as mgr:       # the scenarios' rendezvous, shared by the spawned ranks
        slicetrace.launch(_scenarios, 3, mgr.dict(), str(folder), uuid.uuid4().hex[:8], timeout_s=30.0,
                          join_timeout_s=120)
    return folder


def _report(runs, name: str, capsys) -> tuple[str, dict]:
    out = runs / f"{name}.json"
    assert main(["report", str(runs / name), "--json", str(out)]) == 0
    return " ".join(capsys.readouterr().out.split()), json.loads(out.read_text())


def test_a_healthy_run_names_no_straggler(runs, capsys):
    """Before: every run showed a stragglers table, its first row the rank that started the first op last."""
    text, doc = _report(runs, "ok", capsys)
    assert "stragglers: no consistent straggler in 7 collectives after the first" in text
    # the who-started-last table is shown whenever collectives were judged (bc22c8d); its header passed a
    # "not in text" check only while rich split it over 80 columns
    assert "straggler: rank" not in text and "who started last" in text
    assert "slow links: none among the 3 links" in text and "most waited on: " in text    # judged, nothing found
    assert not any(r["consistent"] for r in doc["stragglers"])
    assert doc["startup_skew"]["seq"] == 0 and doc["straggler_rule"]["collectives"] == 7


def test_a_clock_offset_between_ranks_is_told_before_the_verdicts_that_compare_clocks(runs, capsys, tmp_path):
    """Rank 2's clock 20 ms ahead (GPU timers mapped to the host clock with an error) was reported as a near-certain
    straggler, without a word; convert warned on the same files. Matched receives ready before their sends had
    moved say so now; one host's CLOCK_MONOTONIC never shows one."""
    text, doc = _report(runs, "ok", capsys)
    assert doc["clocks"]["matched"] > 0 and doc["clocks"]["early"] == 0 and "clocks:" not in text
    shifted = tmp_path / "shifted"
    shifted.mkdir()
    for f in sorted((runs / "ok").iterdir()):
        if not f.name.endswith(".json"):
            continue
        recs = json.loads(f.read_text())
        for r in recs if _rank_of(recs) == 2 else ():
            if "ts" in r:
                r["ts"] = round(r["ts"] + 20_000, 3)            # us
        (shifted / f.name).write_text(json.dumps(recs))
    assert main(["report", str(shifted), "--json", str(tmp_path / "s.json")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    ck = json.loads((tmp_path / "s.json").read_text())["clocks"]
    assert ck["early"] > 0 and ck["link"][0] == 2 and ck["worst_us"] > 19_000   # its sends seem to land early
    assert f"clocks: {ck['early']:,} of {ck['matched']:,} matched receives had their data before the send moved " \
           f"it" in text and "may name an offset, not a late rank" in text


def _rank_of(recs) -> int:
    return next(r["args"]["Rank"] for r in recs if r.get("name") == "slicetrace_comm")


def test_a_rank_arriving_late_is_the_straggler_and_the_most_waited_on(runs, capsys):
    """Before: the most waited on line named the sender next to the longest wait (rank 0 waiting on rank 2, which
    was itself waiting on rank 1)."""
    text, doc = _report(runs, "late", capsys)
    assert "straggler: rank 1 started last in" in text and _most_waited_on(text) == 1
    assert text.index("straggler: rank 1") < text.index("most waited on") and "by chance" in text
    assert [r["rank"] for r in doc["stragglers"] if r["consistent"]] == [1]
    assert doc["stragglers"][0]["times_late"] >= 3 and doc["held_up"][0]["rank"] == 1


def test_a_slow_data_path_is_named_as_the_rank_or_its_link(runs, capsys):
    """Rank 2's copies are slow: on one host that cannot be told from a slow link 2->0, so both are named."""
    text, doc = _report(runs, "copy", capsys)
    assert "slow link: rank 2's data path or link 2->0 moves" in text and "of 1 channels" not in text
    assert _most_waited_on(text) == 2
    assert [(ln["src"], ln["dst"], ln["sender_outlier"]) for ln in doc["slow_links"]] == [(2, 0, True)]
    assert doc["held_up"][0]["rank"] == 2


def test_a_slow_receiver_is_most_waited_on_through_credit(runs, capsys):
    """Broadcast 0 -> 1 -> 2 with rank 2 slow: ranks 0 and 1 wait for room (credit), rank 0 on rank 1 while rank 1
    waits on rank 2. Before: only data waits counted, and the line named rank 2 waiting for rank 1."""
    text, doc = _report(runs, "bcast", capsys)
    assert _most_waited_on(text) == 2
    top = doc["held_up"][0]
    assert top["rank"] == 2 and top["credit_us"] > top["data_us"]


def _most_waited_on(text: str) -> int | None:
    """The rank the 'most waited on' line names as the one waited on (before: 'rank R waited ... from rank P')."""
    m = re.search(r"most waited on: rank (\d+),", text) or re.search(r"most waited on: rank \d+ waited [\d.]+ us for "
                                                                      r"data from rank (\d+)", text)
    return int(m.group(1)) if m else None


def _chs(rows):
    return np.array(rows, dtype=KERNEL_CH_TABLE)


def _text(rep) -> str:
    con = Console(record=True, width=400)
    render(rep, console=con)
    return " ".join(con.export_text().split())


def _starts(func: str, seq: int, t0: int, late: dict[int, int], span: int = 2_000_000):
    """One collective's KernelCh rows for ranks 0-2: rank r starts late[r] ns after t0, each runs `span` ns."""
    return [(r, 0, seq, func, t0 + late[r], t0 + late[r] + span) for r in range(3)]


def test_start_up_skew_is_apart_and_the_consistent_straggler_comes_first():
    """As the reviewer's mixed run: rank 0 starts the first op 80 ms late (start-up) and one AllReduce 20 ms late;
    rank 2 starts every AllGather 11 ms late. Before: rank 0 led the table by total lateness, and 'largest skew'
    named the first op."""
    rows = _starts("AllReduce", 0, 0, {0: 80_000_000, 1: 0, 2: 300_000})
    for i in range(7):                      # 7 of 7 AllGathers: odds 1/2187 by chance, 9 tests
        t = 100_000_000 + 40_000_000 * i
        rows += _starts("AllGather", i, t, {0: 0, 1: 500_000, 2: 11_000_000})
        rows += _starts("AllReduce", i + 1, t + 20_000_000,
                        {0: 20_000_000 if i == 1 else 300_000 * (i % 3), 1: 300_000 * ((i + 1) % 3),
                         2: 300_000 * ((i + 2) % 3)})
    rep = build(np.zeros(0, KERNEL_STEP_TABLE), chs=_chs(rows), ranks=[0, 1, 2])
    text = _text(rep)
    assert "largest skew: AllReduce #0" not in text
    assert "start-up skew: AllReduce #0, the first collective, rank 0 started 80000.0 us after the first of 3 " \
        "ranks" in text
    assert "straggler: rank 2 started last in" in text and "straggler: rank 0" not in text
    assert rep.stragglers[0]["rank"] == 2 and rep.stragglers[0]["consistent"]
    assert not any(r["consistent"] for r in rep.stragglers if r["rank"] != 2)
    assert rep.startup == {"func": "AllReduce", "seq": 0, "rank": 0, "late_us": 80_000.0, "ranks": 3}
    assert rep.straggler_rule["collectives"] == 14


def test_a_rank_last_by_less_than_the_noise_floor_is_no_straggler():
    """Rank 1 starts every op last, by 50 us, in a run whose ops take 2 ms: noise, not a straggler. Before: a
    stragglers table named it."""
    rows = []
    for seq in range(6):
        rows += _starts("AllReduce", seq, 10_000_000 * seq, {0: 0, 1: 50_000, 2: 20_000})
    rep = build(np.zeros(0, KERNEL_STEP_TABLE), chs=_chs(rows))
    text = _text(rep)
    assert "straggler: rank" not in text and "who started last" in text       # shown, not named
    assert ("stragglers: no consistent straggler in 5 collectives after the first (no rank started more than the "
            "noise floor after every other rank in any of them;") in text
    assert rep.stragglers[0]["rank"] == 1 and rep.stragglers[0]["times_last"] == 5
    assert rep.stragglers[0]["times_late"] == 0 and not rep.stragglers[0]["consistent"]
    assert rep.straggler_rule["floor_us"] == pytest.approx(1000.0)        # half the 2 ms op; spread 20 us


def test_stragglers_name_the_rank_that_starts_collectives_last():
    # three ranks, two channels each; rank 2 starts AllReduce #0 and #1 late, rank 0 starts AllGather #0 late;
    # AllReduce #0, every rank's first collective, is start-up skew and judged apart
    rows = []
    for seq, late_rank, late in ((0, 2, 50_000), (1, 2, 20_000)):
        for r in range(3):
            for ch in range(2):
                t = seq * 1_000_000 + (late if r == late_rank else 100 * r) + 10 * ch
                rows.append((r, ch, seq, "AllReduce", t, t + 5_000))
    for r in range(3):
        rows.append((r, 0, 0, "AllGather", 5_000_000 + (30_000 if r == 0 else 0), 5_100_000))
    rows.append((1, 0, 7, "Broadcast", 9_000_000, 9_100_000))          # one rank only: left out, and said so
    sk = stragglers(_chs(rows))
    assert sk.left_out == {"collectives": 1, "lacking": [{"rank": 0, "collectives": 1}, {"rank": 2, "collectives": 1}]}
    assert sk.startup == {"func": "AllReduce", "seq": 0, "rank": 2, "late_us": 50.0, "ranks": 3}
    assert [(r["rank"], r["times_last"], r["times_late"], r["consistent"]) for r in sk.ranks] == \
        [(0, 1, 1, False), (2, 1, 1, False)]          # once each: no consistent straggler
    assert sk.ranks[1]["late_us"] == pytest.approx(20.0) and sk.ranks[1]["worst_us"] == pytest.approx(20.0)
    assert [(o["func"], o["seq"], o["rank"]) for o in sk.ops] == [("AllGather", 0, 0), ("AllReduce", 1, 2)]
    rep = build(np.array([(0, 0, 1, 1, 0, 8, 0, 1, 2, 0, 0)], KERNEL_STEP_TABLE), chs=_chs(rows))
    assert rep.stragglers == sk.ranks and rep.to_dict()["late_ops"] == sk.ops
    assert rep.to_dict()["startup_skew"] == sk.startup and rep.to_dict()["straggler_rule"]["collectives"] == 2
    empty = stragglers(_chs([]))
    assert (empty.ranks, empty.ops, empty.left_out, empty.startup) == ([], [], {"collectives": 0, "lacking": []}, None)


def test_without_kernel_ch_the_straggler_is_judged_from_the_coll_events():
    """A mask without KernelCh ('Coll|KernelStep'): before, the report said 'none to name' and the JSON's empty
    stragglers read as judged; rank 1, 20 ms late at every op, went unnamed. Coll begins (the op's call) judge it."""
    late = {0: 0, 1: 20_000_000, 2: 300}
    spans = [(r, "AllReduce", seq, seq * 50_000_000 + late[r], seq * 50_000_000 + 21_000_000)
             for seq in range(12) for r in range(3)]
    ks = np.array([(0, 0, 1, 1, 0, 8, 0, 1, 2, 0, 0), (1, 0, 1, 2, 0, 8, 0, 1, 2, 0, 0)], KERNEL_STEP_TABLE)
    rep = build(ks, chs=None, spans=spans, ranks=[0, 1, 2])
    assert [r["rank"] for r in rep.stragglers if r["consistent"]] == [1]
    assert rep.straggler_rule["judged_from"] == "Coll" and rep.straggler_rule["collectives"] == 11
    text = _text(rep)
    assert "straggler: rank 1 started last in 11 of 11" in text and "Coll event began" in text
    assert rep.unfinished == []                                     # every Coll ended on every rank
    bare = build(ks, chs=None, spans=[], ranks=[0, 1, 2])           # neither KernelCh nor Coll: not judged
    assert bare.straggler_rule["judged_from"] is None
    assert "stragglers: not judged, no collective recorded on every rank" in _text(bare)


def test_stragglers_count_a_collective_only_when_every_rank_has_it():
    rows = [(r, 0, seq, "AllReduce", 1_000 * seq + (500 if r == 2 else 10 * r), 1_000 * seq + 900)
            for seq in range(3) for r in range(3) if (r, seq) != (2, 1)]
    sk = stragglers(_chs(rows), ranks=[0, 1, 2])
    assert [(o["seq"], o["rank"]) for o in sk.ops] == [(2, 2)] and sk.startup["seq"] == 0
    assert sk.left_out == {"collectives": 1, "lacking": [{"rank": 2, "collectives": 1}]}
    sk = stragglers(_chs([r for r in rows if r[0] != 2]), ranks=[0, 1, 2])     # none on rank 2
    assert sk.ranks == sk.ops == [] and sk.startup is None
    assert sk.left_out == {"collectives": 3, "lacking": [{"rank": 2, "collectives": 3}]}
    sk = stragglers(_chs([r for r in rows if r[0] != 2]), ranks=[0, 1])       # --partial
    assert [(r["rank"], r["times_last"]) for r in sk.ranks] == [(1, 2)] and sk.left_out["collectives"] == 0


def test_a_tie_in_start_times_names_the_higher_rank_as_the_straggler():
    """Equal first starts: the key is (start, rank), so the highest rank among the latest is last, whatever the
    order of the rows."""
    for order in ((0, 1, 2), (2, 1, 0)):
        rows = [(r, 0, seq, "AllReduce", seq * 10_000 + (1_000 if r == 0 else 4_000), seq * 10_000 + 9_000)
                for seq in range(2) for r in order]
        sk = stragglers(_chs(rows))
        assert [(o["rank"], o["late_us"], o["ranks"]) for o in sk.ops] == [(2, 3.0, 3)], order
        assert [(r["rank"], r["times_last"]) for r in sk.ranks] == [(2, 1)] and sk.startup["rank"] == 2


def _ks(rows):
    """rows: (rank, channel, is_send, peer, wait_ns, ready_ns, op); one 8-byte slice each, done 10 ns after ready."""
    return np.array([(r, c, s, p, i, 8, w, rd, rd + 10, op, op) for i, (r, c, s, p, w, rd, op) in enumerate(rows)],
                    dtype=KERNEL_STEP_TABLE)


FIRST_OPS = [(r, 0, 0, (r - 1) % 3, 0, 50_000, 0) for r in range(3)]        # each rank's first op: start-up waits


def _each_op(ks, n):
    """ks's records (of one op) as _ks rows, repeated in ops 1..n, 10 ms apart."""
    return [(int(k["rank"]), int(k["channel"]), int(k["is_send"]), int(k["peer"]), int(k["wait_ns"]) + 10_000_000 * i,
             int(k["ready_ns"]) + 10_000_000 * i, 1 + i) for i in range(n) for k in ks]


def test_a_data_wait_passes_up_the_ring_to_the_rank_not_itself_waiting():
    """Ring 0 -> 1 -> 2 -> 0, rank 1 late: rank 2 waits for its data over [0, 1000] us, and rank 0 for rank 2's over
    [100, 1100] us, 900 us of it while rank 2 was itself waiting. Before: the line named rank 0 waiting on rank 2."""
    ks = _ks(FIRST_OPS + [(2, 0, 0, 1, 1_000_000, 2_000_000, 1), (0, 0, 0, 2, 1_100_000, 2_100_000, 1)])
    rep = build(ks)
    assert "the 2000.0 us the ranks waited after their first op lead to rank 1 1900.0 us, rank 2 100.0 us" in \
        _text(rep)                      # one op: too few to name a rank (test_a_rank_the_waits_lead_to_in_every_op_...)
    assert rep.held_up == [{"rank": 1, "wait_us": 1900.0, "data_us": 1900.0, "credit_us": 0.0},
                           {"rank": 2, "wait_us": 100.0, "data_us": 100.0, "credit_us": 0.0}]
    assert rep.waited_on[0] == {"rank": 0, "peer": 2, "wait_us": pytest.approx(1000.0 + 50.0)}   # direct, as before
    many = build(_ks(FIRST_OPS + _each_op(ks[3:], 8)))
    assert "most waited on: rank 1, 15200.0 of the 16000.0 us" in _text(many), _text(many)


def test_a_credit_wait_counts_against_the_receiver_and_passes_down_the_chain():
    """Broadcast 0 -> 1 -> 2 with rank 2 slow: rank 1 waits for room at rank 2, rank 0 for room at rank 1 while rank
    1 waits; and two ranks waiting on each other never pass a wait back to the rank that waited."""
    ks = _ks(FIRST_OPS + [(1, 0, 1, 2, 1_000_000, 2_000_000, 1), (0, 0, 1, 1, 1_000_000, 2_000_000, 1)])
    assert "waited after their first op lead to rank 2 2000.0 us" in _text(build(ks))
    assert build(ks).held_up == [{"rank": 2, "wait_us": 2000.0, "data_us": 0.0, "credit_us": 2000.0}]
    assert "most waited on: rank 2, 16000.0 of the 16000.0 us" in _text(build(_ks(FIRST_OPS + _each_op(ks[3:], 8))))
    both = _ks(FIRST_OPS + [(0, 1, 0, 1, 1_000_000, 2_000_000, 1), (1, 1, 0, 0, 1_000_000, 2_000_000, 1)])
    assert build(both).held_up == [{"rank": 0, "wait_us": 1000.0, "data_us": 1000.0, "credit_us": 0.0},
                                   {"rank": 1, "wait_us": 1000.0, "data_us": 1000.0, "credit_us": 0.0}]
    text = _text(build(_ks(FIRST_OPS + _each_op(both[3:], 8))))
    assert "most waited on: no rank stands out: the largest share was 0 % of ops (in none of the 8 ops after the " \
        "first were one rank's waits the most" in text, text                   # a tie is no rank's
    assert "33 % expected by chance (7 needed at 1 % odds over 3 ranks)" in text


def test_the_waits_of_channels_that_wait_at_once_count_once():
    """The ring of test_a_data_wait_passes_up_the_ring_..., on 4 channels that wait at once: each rank's waits
    were summed over them, 4 x the rank time (7600 of 8000 us, past the run's length) against a per-op floor."""
    rows = list(FIRST_OPS)
    for ch in range(4):
        rows += [(2, ch, 0, 1, 1_000_000, 2_000_000, 1), (0, ch, 0, 2, 1_100_000, 2_100_000, 1)]
    rep = build(_ks(rows))
    assert rep.held_up == [{"rank": 1, "wait_us": 1900.0, "data_us": 1900.0, "credit_us": 0.0},
                           {"rank": 2, "wait_us": 100.0, "data_us": 100.0, "credit_us": 0.0}]
    assert "lead to rank 1 1900.0 us, rank 2 100.0 us" in _text(rep)
    bare = [r[:6] + (-1,) if r not in FIRST_OPS else r for r in rows]        # KernelSteps without their ops
    assert build(_ks(bare)).held_up == rep.held_up                           # (C x before: 7600 us for rank 1)


def _ring_ops(slow_ops, slow_link=(0, 1), nops=9):
    """3-rank ring, one channel, `nops` ops of 3 slices of 1 MB per link: 25 us a slice (40 GB/s), 100 us on
    slow_link in the ops of slow_ops."""
    rows, step = [], 0
    for op in range(nops):
        for src in range(3):
            for k in range(3):
                dur = 100_000 if (src, (src + 1) % 3) == slow_link and op in slow_ops else 25_000
                t = op * 10_000_000 + step * 1_000
                rows.append((src, 0, 1, (src + 1) % 3, step, 1_000_000, t, t, t + dur, op, op))
                step += 1
    return build(np.array(rows, dtype=KERNEL_STEP_TABLE))


def test_a_link_slow_in_half_the_ops_only_is_not_named():
    """Link 0->1 4x slower in 4 of the 8 ops after the first: its pooled median is 37 % under the median link, which
    named it before (a healthy run's slower rank did the same). Slow in 7 of 8 ops it is named, with its sender: rank
    0 also moves data longest; one channel, so no 'of 1 channels'. Op 0, start-up, is not judged."""
    assert _ring_ops({0, 1, 2, 3, 4}).slow_links == []
    rep = _ring_ops(set(range(8)))
    assert [(ln["src"], ln["ops"], ln["ops_slow"], ln["sender_outlier"]) for ln in rep.slow_links] == [(0, 8, 7, True)]
    text = _text(rep)
    assert "slow link: rank 0's data path or link 0->1 moves 10.00 GB/s (typical slice), 75 % below the median " \
        "link (40.00), in 7 of 8 ops after the first, odds of so many by chance 0.0011; rank 0 also moves data " \
        "longest (2475.0 us of copies, the median rank 675.0 us)" in text
    assert "channels" not in text.split("slow link:")[1]


def _ks_rows(rows):
    return np.array([r + (0, 0) for r in rows], dtype=KERNEL_STEP_TABLE)


def test_latency_bound_and_empty_slices_do_not_judge_links():
    """4-byte slices (a 1-element all_reduce) named a 'slow link' on pure latency, and 0-byte slices divided by
    zero; neither says anything of a link's bandwidth."""
    for size in (4, 0):
        rows, step = [], 0
        for op in range(6):                 # 5 after the first: enough to name one of 4 links
            for src in range(4):
                for ch in range(2):
                    t = op * 100_000
                    rows.append((src, ch, 1, (src + 1) % 4, step, size, t, t, t + (4_000 if src == 2 else 1_000),
                                 op, op))
                    step += 1
        rep = build(np.array(rows, KERNEL_STEP_TABLE))
        assert rep.slow_links == [], (size, rep.slow_links)
    big = build(np.array([r[:5] + (1_000_000,) + r[6:] for r in rows], KERNEL_STEP_TABLE))   # on 1 MB slices
    assert [(ln["src"], ln["dst"]) for ln in big.slow_links] == [(2, 3)]


def _waited_report(tops: list[int], n_ranks: int = 4, us: float = 100.0, floor_us: float = 20.0):
    """A Report whose op k's waits lead to rank tops[k] (us) and 1 us to each other rank, judged by most_waited."""
    from slicetrace.analyze.report import Report
    from slicetrace.analyze.verdicts import held_up_totals
    from slicetrace.analyze.waited import most_waited
    blame = {(r, 0, op): 1e3 * (us if r == top else 1.0) for op, top in enumerate(tops) for r in range(n_ranks)}
    return Report(links=[], ranks=[], waited_on=[], slowest=[], stragglers=[], counters={},
                  held_up=held_up_totals(blame), waited_rule=most_waited(blame, len(tops), n_ranks, floor_us))


def test_most_waited_on_names_a_rank_only_in_more_ops_than_chance_explains():
    """A healthy 4-rank run on 2 cores: whoever the scheduler delays differs from op to op, and a few long delays
    made one rank's total twice the next: before, that rank was named. Now a rank must hold the others up in
    more ops than a rank picked at random per op would."""
    rng = np.random.default_rng(5)
    tops = rng.integers(0, 4, 40).tolist()
    rep = _waited_report(tops)
    best = max(range(4), key=tops.count)
    assert not any(r["consistent"] for r in rep.waited_rule["ranks"]) and rep.waited_rule["needed"] == 19
    text = _text(rep)
    assert f"most waited on: no rank stands out: the largest share was {100 * tops.count(best) / 40:.0f} % of ops " \
           f"(rank {best}: the waits led to it, more than the floor 20.0 us, in {tops.count(best)} of 40 ops after " \
           f"the first), 25 % expected by chance (19 needed at 1 % odds over 4 ranks)" in text, text
    rep = _waited_report([2] * 19 + tops[:21])                 # 19 + its share of the rest
    assert [r["rank"] for r in rep.waited_rule["ranks"] if r["consistent"]] == [2]
    assert re.search(r"most waited on: rank 2, [\d.]+ of the [\d.]+ us .* the waits led to it, more than the floor "
                     r"20.0 us, in \d+ of 40 ops after the first \(25 % expected by chance; odds of so many ",
                     _text(rep))
    under = _waited_report([2] * 40, us=15.0)                  # every op, but never past the floor
    assert under.waited_rule["ranks"] == [] and "the largest share was 0 % of ops" in _text(under)


def test_two_ranks_late_by_turns_name_no_straggler():
    """With 2 ranks every collective has a last rank: a real 2-rank trace was late 49 / 40 times of 89 by rank,
    and both were named stragglers (the old rule: half or more of one function's). Chance explains both."""
    rows = []
    late_ranks = [0] * 49 + [1] * 40
    np.random.default_rng(1).shuffle(late_ranks)
    for seq, late in enumerate([1] + late_ranks):
        for r in range(2):
            t = 10_000_000 * seq + (30_000 if r == late else 0)
            rows.append((r, 0, seq, "AllReduce", t, t + 40_000))
    sk = stragglers(_chs(rows))
    assert sorted((r["rank"], r["times_late"]) for r in sk.ranks) == [(0, 49), (1, 40)]
    assert not any(r["consistent"] for r in sk.ranks)
    assert sk.ranks[0]["chance"] == pytest.approx(sum(math.comb(89, i) for i in range(49, 90)) / 2 ** 89)
    rows = [(r, 0, seq, "AllReduce", 10_000_000 * seq + (30_000 if r == 1 and seq else 0),
             10_000_000 * seq + 40_000 + (30_000 if r == 1 and seq else 0)) for seq in range(10) for r in range(2)]
    sk = stragglers(_chs(rows))             # but 9 late of 9 is no chance: odds 1/512, over 4 tests
    assert [(r["rank"], r["times_late"], r["consistent"]) for r in sk.ranks] == [(1, 9, True)]


def _ring_and_one_p2p_slice(op_keys: bool):
    """4 ring collectives over 3 links at ~4 GB/s, then one 64 KiB send/recv 1 -> 0 at ~2.6 GB/s."""
    rows, t, size = [], 0, 1 << 16
    for op in range(4):
        for k in range(8):
            for src in range(3):
                dst, xfer = (src + 1) % 3, 16_000 + 100 * ((k + src) % 3)
                rows.append((src, 0, 1, dst, op * 8 + k, size, t, t, t + xfer, op, 100 + op if op_keys else -1))
                rows.append((dst, 0, 0, src, op * 8 + k, size, t, t + xfer, t + xfer + 1, op,
                             200 + op if op_keys else -1))
                t += 20_000
    rows.append((1, 0, 1, 0, 0, size, t, t, t + 25_000, -1, 300 if op_keys else -1))
    rows.append((0, 0, 0, 1, 0, size, t, t + 25_000, t + 25_001, -1, 301 if op_keys else -1))
    return np.array(rows, KERNEL_STEP_TABLE)


def test_a_link_in_no_judged_op_is_not_named_slow():
    """Before: a link that moved in no op where 3 links moved (one p2p slice, or the links of a rank whose file was
    cut short) was named slow from the pooled median alone."""
    rep = build(_ring_and_one_p2p_slice(True), {})
    assert any((ln["src"], ln["dst"]) == (1, 0) for ln in rep.links) and rep.slow_links == []
    rep = build(_ring_and_one_p2p_slice(False), {})          # no op keys: the p2p slice is like the ring's
    assert [(d["src"], d["dst"], d["ops"]) for d in rep.slow_links] == [(1, 0, 0)]


def _all_to_all_twice(comm):
    x = np.arange(3 * 5000, dtype=np.float32)
    for _ in range(2):
        comm.all_to_all(x)
    comm.flush_profiler()


def test_the_waits_left_out_are_the_whole_first_p2p_group(tmp_path):
    """Every part of a group (one peer and direction) has an op key of its own: before, only the part whose record
    came first was left out (often one without waits), so the start-up waits of the rest counted."""
    from slicetrace.analyze.trace import kernel_steps, load_run, op_starts
    from slicetrace.analyze.verdicts import first_ops, held_up, op_index
    slicetrace.launch(_all_to_all_twice, 3, profile_dump_file=str(tmp_path / "a2a"), **SUB)
    recs = load_run(str(tmp_path / "a2a"))
    ks = kernel_steps(recs)
    group = {(r["pid"], r["id"]): r["ts"] for r in recs if r.get("ph") == "b" and r.get("cat") == "P2P"}
    starts = np.array([group[(int(p), int(o))] for p, o in zip(ks["rank"], ks["op"])])
    pid_first = {p: min(t for (q, _), t in group.items() if q == p) for p, _ in group}
    want = np.array([t == pid_first[int(p)] for p, t in zip(ks["rank"], starts)])
    assert 0 < want.sum() < len(ks) and len(set(ks["op"][want].tolist())) > 3     # parts of the three first groups
    assert (first_ops(ks, op_index(ks), op_starts(recs)) == want).all()
    wait = ks["ready_ns"] - ks["wait_ns"]
    total = sum(h["wait_us"] for h in held_up(ks, None, op_starts(recs)))
    assert total == pytest.approx(wait[~want].sum() / 1e3)           # every wait but the first groups' counts
    assert wait[want].sum() > 0


def _steps(rows):
    """(rank, op, wait ns) -> KernelStep rows, 1 us each, a send to the next rank."""
    return np.array([(r, 0, 1, 1 - r, i, 4096, t, t + 500, t + 1000, -1, op) for i, (r, op, t) in enumerate(rows)],
                    KERNEL_STEP_TABLE)


def test_the_first_group_is_found_when_a_later_op_lost_its_begin():
    """A file cut short loses its last op's P2p begin (written at op end) but keeps its KernelSteps: before, one
    missing begin made the whole rank fall back to the first part alone."""
    from slicetrace.analyze.verdicts import first_ops, op_index
    ks = _steps([(0, 1, 0), (0, 2, 2_000), (0, 3, 10_000), (0, 4, 20_000), (1, 9, 0)])
    starts = {(0, 1): 100, (0, 2): 100, (0, 3): 9_000, (1, 9): 0}           # op 4's begin is lost
    assert first_ops(ks, op_index(ks), starts).tolist() == [True, True, False, False, True]


def test_an_unkeyed_start_up_leaves_the_ranks_first_keyed_op_in():
    """A rank whose first op's KernelSteps have no parent (its Coll declined), then keyed ops: before, its second
    op was left out as start-up and the start-up waits counted."""
    from slicetrace.analyze.verdicts import first_ops, op_index
    ks = _steps([(0, -1, 0), (0, -1, 1_000), (0, 11, 10_000_000), (1, 7, 6_000), (1, 8, 10_000_000)])
    assert first_ops(ks, op_index(ks), {(0, 11): 9_000_000, (1, 7): 5_000, (1, 8): 9_000_000}).tolist() == \
        [True, True, False, True, False]


def test_links_of_small_slices_are_not_judged_and_the_report_says_so():
    """Three links of 336-byte slices: slow_links judged none (under 4 KiB is latency) and the report said 'none
    among the 3 links', as if it had judged them."""
    rows = [(src, 0, 1, (src + 1) % 3, k, 336, 1000 * k, 1000 * k, 1000 * k + 500, 0, 7) for src in range(3)
            for k in range(4)]
    rep = build(np.array(rows, KERNEL_STEP_TABLE), {})
    text = _text(rep)
    assert "slow links: not judged, 0 of the 3 links moved slices of 4096 B or more" in text
    assert "none among" not in text and [ln["judged_slices"] for ln in rep.links] == [0, 0, 0]


def _lateness_rows(n_ranks, lateness):
    """KernelCh rows of collectives 0..len(lateness): the first on time; collective k's rank lateness[k-1][0] starts
    lateness[k-1][1] ns after the others (0: nobody late); every op 40 us."""
    rows = []
    for seq, (late, by) in enumerate([(0, 0)] + list(lateness)):
        for r in range(n_ranks):
            t = 10_000_000 * seq + (by if r == late else 0)
            rows.append((r, 0, seq, "AllReduce", t, t + 40_000))
    return _chs(rows)


def test_streaks_of_small_lateness_in_a_healthy_run_name_no_straggler():
    """A healthy 2-rank sweep (bench 4K-16M, 173 collectives): a ring's exit skew makes one rank start a block of
    ops last, just past the floor (2 ranks have no spread in it), in streaks: rank 0 late 55 times, rank 1 23.
    Counted out of the 78 late collectives only (tried: chance 2e-4) that named rank 0; out of all 173, no."""
    lateness = []
    for rank, n in [(0, 6), (1, 3)] * 6 + [(0, 19)] + [(1, 5)]:
        lateness += [(rank, 35_000)] * n + [(0, 0)] * 7       # a streak, then ops nobody is late in
    lateness = lateness[:173]                                   # the last gap cut short
    sk = stragglers(_lateness_rows(2, lateness))
    assert sk.rule["collectives"] == 173 and sk.rule["late_collectives"] == 78
    assert sorted((r["rank"], r["times_late"]) for r in sk.ranks) == [(0, 55), (1, 23)]
    assert not any(r["consistent"] for r in sk.ranks)


def test_random_lateness_names_a_straggler_in_about_one_run_in_a_hundred():
    """The rule's false alarms: 400 runs of 3 ranks x 60 collectives, each collective's late rank (or none) at
    random; ALPHA = 1 % over the tests made bounds the runs that name anyone."""
    rng = np.random.default_rng(11)
    named = 0
    for _ in range(400):
        lateness = [(int(rng.integers(3)), 50_000 if rng.random() < 0.3 else 0) for _ in range(60)]
        named += any(r["consistent"] for r in stragglers(_lateness_rows(3, lateness)).ranks)
    assert named <= 4, named            # at most 1 % (deterministic: the seed is fixed)


def test_most_waited_on_says_why_its_rank_is_not_a_straggler_too():
    """Two verdicts, two questions: 9 of 10 late collectives (2 ranks, op sampling) is within chance at 1 % over 4
    tests, while the waits lead to that rank in 20 ops of 20; the report said both without a word on why they
    differ."""
    lateness = [(1, 6_000_000)] * 9 + [(0, 400_000)]
    sk = stragglers(_lateness_rows(2, lateness))
    assert not any(r["consistent"] for r in sk.ranks) and sk.ranks[0]["times_late"] == 9
    rep = _waited_report([1] * 20, n_ranks=2)
    rep.stragglers, rep.late_ops, rep.startup, rep.straggler_rule = sk.ranks, sk.ops, sk.startup, sk.rule
    text = _text(rep)
    assert "most waited on: rank 1, 2000.0 of the 2020.0 us" in text
    assert "(not named a straggler above: that verdict counts the collectives a rank started more than its noise " \
           "floor after every other rank, this one the ops in which the others waited on it, late to start or slow " \
           "to move data)" in text


LATE_TIMEOUT_S = 3.0        # the failing op's timeout: past any scheduling delay of the ops before it


def _late_to_the_failing_op(comm, prefix: str, folder: str, job: str):
    """The launch's communicator (timeout_s=30) only lines the ranks up: set-up bounded by a short timeout_s raced
    the spawned ranks' import skew under load. The short timeout is the traced communicator's, made once every rank
    is past the barrier. Rank 1 comes to op #3 only once ranks 0 and 2 have failed in it (each leaves a file), so it
    begins it at least LATE_TIMEOUT_S after them, whatever the load."""
    comm.barrier()
    r = comm.rank
    with slicetrace.init(rank=r, world_size=comm.world_size, job=job, timeout_s=LATE_TIMEOUT_S,
                         profiler_plugin="example", profile_dump_file=prefix) as sub:
        for i in range(5):
            if i == 3 and r == 1:           # past the others' timeout: the op they wait in fails
                deadline = time.monotonic() + 25     # before the launcher's kill (timeout_s + 5 s)
                while not all(os.path.exists(f"{folder}/failed{p}") for p in (0, 2)):
                    assert time.monotonic() < deadline, "ranks 0 and 2 did not fail in op #3 within 25 s"
                    time.sleep(0.01)
            try:
                sub.all_reduce(np.ones(1 << 14, np.float32))
            except slicetrace.SliceTraceError:
                if i == 3 and r != 1:
                    open(f"{folder}/failed{r}", "w").close()
                raise


def test_the_op_a_failed_run_stopped_in_names_who_came_late(tmp_path, capsys):
    """A failed op has its Coll but no KernelCh, which the straggler verdict reads: the report showed the earlier,
    healthy collectives only, and not that rank 1 began the failing one seconds after the others."""
    prefix = str(tmp_path / "t")
    with pytest.raises(slicetrace.LaunchError, match=re.escape(f"waited {LATE_TIMEOUT_S}s")):
        slicetrace.launch(_late_to_the_failing_op, 3, prefix, str(tmp_path), uuid.uuid4().hex[:10], timeout_s=30,
                          join_timeout_s=60)
    assert main(["report", prefix]) == 0
    text = " ".join(capsys.readouterr().out.split())
    got = re.search(r"unfinished: AllReduce #3 has no channel records on rank\(s\) ([0-9, ]+): it failed \(a "
                    r"timeout, a peer's error\), the run stopped in it, or its records were lost \(see the loss "
                    r"counters\); stragglers cannot judge it; rank 1 began it ([0-9.]+) us after the first", text)
    assert got, text
    assert "0" in got.group(1) and "2" in got.group(1) and float(got.group(2)) > 1e6


def _with_empty_ops(comm):
    for n in (1000, 0, 1000):
        comm.all_reduce(np.ones(n, np.float32))
    comm.all_gather(np.ones(0, np.float32))
    comm.all_reduce(np.ones(1000, np.float32))


def test_empty_collectives_are_not_unfinished(tmp_path, capsys):
    """A Count of 0 runs no channel program, so it has no KernelCh: it was named 'unfinished' like a failed op."""
    prefix = str(tmp_path / "t")
    slicetrace.launch(_with_empty_ops, 2, profiler_plugin="example", profile_dump_file=prefix, join_timeout_s=60)
    assert main(["report", prefix]) == 0
    text = capsys.readouterr().out
    assert "unfinished" not in text and "loss counters: none" in text


def _ring_and_all_to_all(slow=(), rounds=4):
    """KernelSteps without op keys (a KernelStep-only mask), 4 ranks, 1 MB slices, rounds of a ring all_reduce (4
    fused steps per rank: its receive from r-1 and send to r+1 on one done clock, 100 us: 10 GB/s) then an
    all_to_all (a plain send and its receive per link, 25 us each: 40 GB/s); the links in slow take 4x on each."""
    rows, t = [], 0
    for _ in range(rounds):
        for step in range(4):
            for r in range(4):
                dur = 100_000 * (4 if (r, (r + 1) % 4) in slow else 1)
                rows.append((r, 0, 0, (r - 1) % 4, step, 1 << 20, t, t, t + dur, -1, -1))
                rows.append((r, 0, 1, (r + 1) % 4, step, 1 << 20, t, t, t + dur, -1, -1))
                t += 1_000_000
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    sent = t + 25_000 * (4 if (src, dst) in slow else 1)
                    rows.append((src, 0, 1, dst, 9, 1 << 20, t, t, sent, -1, -1))
                    rows.append((dst, 0, 0, src, 9, 1 << 20, t, sent, sent + 25_000, -1, -1))
                    t += 1_000_000
    return np.array(rows, KERNEL_STEP_TABLE)


def test_without_op_keys_links_are_judged_against_like_slices_not_pooled_over_mixed_ops():
    """A KernelStep-only trace has no ops to judge links by: pooled over the run, the ring links' fused sends (a
    reduce and forward, slower) were judged against the p2p-only links' plain sends, and all 4 healthy ring links
    were named slow (in 3 of 4 healthy 4-rank cpu runs). Like slices are judged together now, in each quarter of
    the run; a link slow all run long is still named, ring or p2p."""
    rep = build(_ring_and_all_to_all())
    assert rep.slow_links == [] and rep.slow_receive_sides == [] and rep.to_dict()["links_judged_by"] == "slices"
    assert "slow links: none among the 12 links (none more than 25 % below the median link in the groups of like " \
        "slices carrying most of its bytes (no op records))" in _text(rep).replace("\n", " ")
    for link, groups in (((1, 2), 8), ((0, 2), 4)):         # a ring link: fused and plain groups; p2p: plain only
        rep = build(_ring_and_all_to_all({link}))
        assert [(ln["src"], ln["dst"], ln["ops"], ln["slice_groups_slow"], ln["slice_groups"])
                for ln in rep.slow_links] == [(*link, 0, groups, groups)], rep.slow_links
    text = _text(rep)
    assert "slow link: link 0->2 moves 10.49 GB/s" in text and "judged without ops (the trace has no Coll/P2p " \
        "records) against the other links' slices of its size and kind (fused with a receive or not) in each " \
        "quarter of the run: that far below in 4 of its 4 such groups, which carry most of its bytes" in text, text
