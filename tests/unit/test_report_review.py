"""report's link verdicts and tables, from a user trial: one op named a 'slow link' in 3 of 4 healthy runs, the
slowest slices were latency-bound ones of no named op, the links table and the verdict disagreed, an unknown wait
read 0.0, and an aside followed the wrong rank."""
import json

import numpy as np
from rich.console import Console

from slicetrace.analyze.report import Report, build, render
from slicetrace.analyze.trace import KERNEL_STEP_TABLE
from slicetrace.analyze.waited import most_waited


def _text(rep) -> str:
    con = Console(record=True, width=300)
    render(rep, console=con)
    return " ".join(con.export_text().split())


def _ring(nops, slow=(2, 3), size=1 << 20, stalled=None):
    """4-rank ring, one channel, nops ops of 4 slices a link (op key and SeqNum = op): 25 us a slice, 100 on link
    `slow`; `stalled` (op, link): that op's first slice on that link takes 5 ms."""
    rows, step = [], 0
    for op in range(nops):
        t = op * 100_000_000
        for src in range(4):
            link = (src, (src + 1) % 4)
            for k in range(4):
                dur = 100_000 if link == slow else 25_000
                dur = 5_000_000 if stalled == (op, link) and k == 0 else dur
                rows.append((src, 0, 1, link[1], step, size, t, t, t + dur, op, op))
                rows.append((link[1], 0, 0, src, step, size, t, t, t + dur + 7, op, op))      # not fused
                step += 1
                t += 10_000_000
    return np.array(rows, KERNEL_STEP_TABLE)


def test_one_op_is_too_few_to_name_a_slow_link():
    """The README's example (4 ranks, 1 all_reduce): the link verdict judged the start-up op alone, and '1 of 1 ops'
    passed its 'more than half' rule. The start-up op is left out now, a link must be slow in more ops than chance
    explains (the stragglers' rule), and too few ops is said; the table's slow link is mentioned with the reason."""
    rep = build(_ring(1))
    assert rep.slow_links == [] and rep.link_rule["ops"] == 0 and rep.link_rule["needed"] == 5
    text = _text(rep)
    assert "slow links: not judged, too few ops to judge links: 0 op(s) after the first (start-up, left out)" in text
    assert "so it takes 5 (the stragglers' rule: odds of at most 0.01 over the 4 links)" in text
    assert "link 2->3 moves 10.49 GB/s in the links table, 75 % below the median link's 41.94, but is not named " \
        "slow: too few ops to judge links" in text and "slow link:" not in text
    few = build(_ring(5))                           # 4 ops after the first: a link slow in all 4 could be chance
    assert few.slow_links == [] and "too few ops to judge links: 4 op(s)" in _text(few)
    enough = build(_ring(6))
    assert [(ln["src"], ln["dst"], ln["ops_slow"], ln["ops"]) for ln in enough.slow_links] == [(2, 3, 5, 5)]
    assert enough.slow_links[0]["chance"] == (1 / 4) ** 5
    assert "in 5 of 5 ops after the first, odds of so many by chance 0.00098" in _text(enough)
    assert build(_ring(6, slow=None)).slow_links == []


def test_a_link_slow_in_the_start_up_op_only_is_not_named():
    ks = _ring(8, slow=None)
    ks["done_ns"][(ks["op"] == 0) & (ks["rank"] == 1)] += 200_000         # start-up: 1->2 is 9x slower
    rep = build(ks)
    assert rep.slow_links == []
    assert [(r["src"], r["dst"], r["failed"]) for r in rep.links_below_unnamed] == [(1, 2, "typical")]
    assert "(the verdict judges typical slices after the first op: a few stalled slices, or the start-up, pull the " \
        "table's figure down)" in _text(rep)


def test_a_link_far_below_in_the_table_says_why_the_verdict_does_not_name_it():
    """Link 1->2 at a fraction of the others' GB/s in the links table (one stalled slice) beside 'slow links: none':
    the verdict judges typical slices. It says so now, for that link."""
    rep = build(_ring(8, slow=None, stalled=(3, (1, 2))))
    assert rep.slow_links == []
    (row,) = rep.to_dict()["links_below_unnamed"]
    assert (row["src"], row["dst"], row["failed"]) == (1, 2, "typical") and row["gbps"] < 0.5 * row["median_gbps"]
    text = _text(rep)
    assert f"link 1->2 moves {row['gbps']:.2f} GB/s in the links table, {row['below_pct']:.0f} % below the median " \
        f"link's {row['median_gbps']:.2f}, but is not named slow: its typical slice moves 41.94 GB/s, within 25 % of " \
        f"the median link's 41.94" in text


def test_the_slowest_slices_skip_latency_bound_ones_and_name_their_op(tmp_path):
    """4-byte slices topped the table (the slow-link check ignores them: latency), and no row said which op."""
    big = _ring(2)
    tiny = _ring(2, size=4)
    tiny["op"] += 5000
    ks = np.concatenate([big, tiny])
    names = {(r, o): "AllReduce" for r in range(4) for o in (0, 1, 1000, 1001)}
    rep = build(ks, names=names, top=3)
    assert [(s["bytes"], s["func"], s["seq"]) for s in rep.slowest] == [(1 << 20, "AllReduce", 0)] * 3
    text = _text(rep)
    assert "the 3 slowest slices of 4096 B or more (by transfer GB/s)" in text and "AllReduce #0" in text
    out = tmp_path / "r.json"
    out.write_text(json.dumps(rep.to_dict()))
    assert json.loads(out.read_text())["slowest"][0]["func"] == "AllReduce"
    assert build(ks, top=3).slowest[0]["func"] is None                     # no Coll/P2p records: unknown


def test_a_receive_wait_of_a_rank_without_records_is_unknown_not_zero():
    ks = _ring(2)
    rep = build(ks[~((ks["rank"] == 3) & (ks["is_send"] == 0))])          # rank 3's receives: its file is empty
    by = {(ln["src"], ln["dst"]): ln for ln in rep.links}
    assert by[(2, 3)]["recv_data_wait_us"] is None and by[(1, 2)]["recv_data_wait_us"] == 0.0
    assert json.loads(json.dumps(rep.to_dict()))["links"][2]["recv_data_wait_us"] is None
    text = _text(rep)
    assert "│ 2->3 │" in text and "│ - │" in text.split("2->3")[1].split("3->0")[0]
    assert "data wait us -: no receive of that link recorded" in text


def test_the_aside_on_the_most_waited_on_rank_comes_before_the_next_rank():
    rep = Report([], [], [], [], {}, [], [], [], held_up=[{"rank": 0, "wait_us": 100.0, "data_us": 100.0,
                                                             "credit_us": 0.0},
                                                            {"rank": 2, "wait_us": 10.0, "data_us": 10.0,
                                                             "credit_us": 0.0}])
    rep.straggler_rule = dict(rep.straggler_rule, collectives=5)
    rep.waited_rule = most_waited({(r, 0, op): 1e3 * (10 if r == 0 else 1) for op in range(10) for r in (0, 2)},
                                  10, 3, 0.0)               # the waits lead to rank 0 in every op
    text = _text(rep)
    assert "(not named a straggler above: that verdict counts the collectives a rank started more than its noise " \
        "floor after every other rank, this one the ops in which the others waited on it, late to start or slow to " \
        "move data); next rank 2, 10.0 us" in text, text
