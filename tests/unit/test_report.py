import re

import numpy as np
import pytest

from slicetrace.analyze.report import build
from slicetrace.analyze.trace import KERNEL_STEP_TABLE
from slicetrace.errors import TraceFormatError
from tests.helpers.held import one_file_at_a_time


def _rows(rows):
    return np.array([r + (0, 0) for r in rows], dtype=KERNEL_STEP_TABLE)


def _ops(ks, n):
    """ks (one op) run n times, op k's records (op key and SeqNum k) after op k-1's: the first is start-up, which
    the link verdicts leave out, and one op is too few to name a link by."""
    span = int(ks["done_ns"].max() - ks["wait_ns"].min()) + 1_000_000
    out = np.concatenate([ks] * n)
    k = np.repeat(np.arange(n), len(ks))
    out["op"], out["seq_number"] = k, k
    for c in ("wait_ns", "ready_ns", "done_ns"):
        out[c] += k * span
    return out


def test_slow_link_and_waited_on_peer_are_found():
    # rank 0 -> 1 moves 1 MB in 10 us (100 GB/s); rank 1 -> 0 moves 1 MB in 100 us; rank 0 waits for rank 1
    ks = _rows([
        (0, 0, 1, 1, 0, 1_000_000, 0, 10, 10_010),
        (1, 0, 0, 0, 0, 1_000_000, 5, 10_020, 10_030),
        (1, 0, 1, 0, 0, 1_000_000, 0, 0, 100_000),
        (0, 0, 0, 1, 0, 1_000_000, 0, 100_010, 100_020),
    ])
    rep = build(ks)
    by = {(ln["src"], ln["dst"]): ln for ln in rep.links}
    assert by[(0, 1)]["gbps"] == pytest.approx(100.0) and by[(1, 0)]["gbps"] == pytest.approx(10.0)
    assert rep.waited_on[0]["rank"] == 0 and rep.waited_on[0]["peer"] == 1
    assert rep.waited_on[0]["wait_us"] == pytest.approx(100.01)
    assert rep.slowest[0]["rank"] == 1 and rep.slowest[0]["is_send"]
    assert {r["rank"]: r["slices"] for r in rep.ranks} == {0: 2, 1: 2}


def test_wrong_input_is_refused():
    with pytest.raises(TraceFormatError, match=r"^ks: expected the KernelStep table of slicetrace\.analyze\.trace\."
                       r"kernel_steps\(\) \(fields \['rank', .*'op'\]\), got an array of dtype float64$"):
        build(np.zeros(3))


def _chs(rows):
    from slicetrace.analyze.trace import KERNEL_CH_TABLE
    return np.array(rows, dtype=KERNEL_CH_TABLE)


def test_a_fused_slice_moves_from_the_later_of_its_two_readies():
    """A GPU recvReduceCopySend waits for credit and data at once: here the credit is there at 0 and the data at
    90 ns, done at 100. Both directions moved for 10 ns; the send's 90 ns without data are the receive's wait."""
    from slicetrace.events.abi import moving_from
    rows = [(0, 3, 1, 1, 7, 8192, 0, 0, 100, 0, 5), (0, 3, 0, 1, 7, 8192, 0, 90, 100, 0, 5),   # fused pair
            (0, 3, 1, 1, 8, 8192, 100, 150, 300, 0, 5),                                     # a send alone
            (1, 0, 1, 0, 1, 8, 0, 10, 50, 0, 6), (1, 0, 0, 0, 1, 8, 0, 20, 50, 0, 6),
            (1, 0, 0, 0, 2, 8, 0, 40, 50, 0, 6)]                      # three records on one done clock: left as is
    ks = np.array(rows, dtype=KERNEL_STEP_TABLE)
    assert moving_from(ks, ks["rank"], ks["op"], ks["channel"]).tolist() == [90, 90, 150, 10, 20, 40]
    assert moving_from(ks[:3], ks[:3]["channel"]).tolist() == [90, 90, 150]     # one parent's batch
    assert moving_from(ks[3:], ks[3:]["channel"]).tolist() == [10, 20, 40]
    rep = build(ks)
    link = {(ln["src"], ln["dst"]): ln for ln in rep.links}[(0, 1)]
    assert link["send_transfer_us"] == pytest.approx((10 + 150) / 1e3)
    assert {r["rank"]: r["transfer_us"] for r in rep.ranks}[0] == pytest.approx((10 + 150) / 1e3)   # fused: once
    assert [(sl["is_send"], sl["step"]) for sl in rep.slowest if sl["rank"] == 0] == [(True, 8), (True, 7)]
    assert moving_from(ks[:1]).tolist() == [0]


def test_a_slow_link_into_the_rank_that_moves_data_longest_says_so():
    """4-rank ring: 1->2 is slow and rank 2 moves data longest (its receives). Before, the report named link 1->2
    as a culprit of its own beside rank 2; writes into a lagging rank's buffers are slowed too, and it now says so."""
    rows, step = [], 0
    for src in range(4):
        dst = (src + 1) % 4
        rows.append((src, 0, 1, dst, step, 1_000_000, 0, 0, 100_000 if src == 1 else 25_000))       # its send
        rows.append((dst, 0, 0, src, step, 1_000_000, 0, 0, 200_000 if dst == 2 else 25_000))       # dst's receive
        step += 1
    rep = build(_ops(_rows(rows), 6))            # 5 ops after the first: the fewest that can name one of 4 links
    assert [(ln["src"], ln["dst"], ln["sender_outlier"], ln["receiver_outlier"]) for ln in rep.slow_links] == \
        [(1, 2, False, True)]
    from rich.console import Console
    from slicetrace.analyze.report import render
    con = Console(record=True, width=200)
    render(rep, console=con)
    flat = " ".join(con.export_text().split())
    assert "slow link: link 1->2 moves 10.00 GB/s" in flat
    assert "it feeds rank 2, which moves data longest (1350.0 us of copies, the median rank 450.0 us): writes into a " \
        "lagging rank's buffers are slowed too, so this may be rank 2, not the link" in flat


def _all_to_all_rows(slow):
    """4 ranks, each sending 1 MB to each other rank: the links in slow take 100 us, the rest 25 us."""
    rows, step = [], 0
    for src in range(4):
        for dst in range(4):
            if src != dst:
                rows.append((src, 0, 1, dst, step, 1_000_000, 0, 0, 100_000 if (src, dst) in slow else 25_000))
                rows.append((dst, 0, 0, src, step, 1_000_000, 0, 0, 25_000))
                step += 1
    return _ops(_rows(rows), 7)         # 6 ops after the first: 3 of 12 links slow in each can be named


def test_a_slow_link_of_a_rank_whose_other_links_are_fine_is_the_link_not_its_copies():
    """all_to_all, 0->2 alone slow: rank 0 moves data longest, so the report said "rank 0's data path or link 0->2
    ... a slow rank's copies look like a slow link", though rank 0 sent to its two other peers at the usual rate.
    A rank slow on every link it sends on is still named."""
    from rich.console import Console
    from slicetrace.analyze.report import render
    one = build(_all_to_all_rows({(0, 2)}))
    assert [(ln["src"], ln["dst"], ln["sender_outlier"], ln["sender_other_links"], ln["sender_other_links_slow"])
            for ln in one.slow_links] == [(0, 2, True, 2, 0)]
    con = Console(record=True, width=200)
    render(one, console=con)
    flat = " ".join(con.export_text().split())
    assert "slow link: link 0->2 moves 10.00 GB/s" in flat and "but its 2 other link(s) move at the usual rate: the " \
        "link, not its copies" in flat and "rank 0's data path" not in flat
    every = build(_all_to_all_rows({(0, 1), (0, 2), (0, 3)}))
    assert [(ln["src"], ln["dst"], ln["sender_other_links_slow"]) for ln in every.slow_links] == \
        [(0, 1, 2), (0, 2, 2), (0, 3, 2)]
    con = Console(record=True, width=200)
    render(every, console=con)
    assert "slow link: rank 0's data path or link 0->1" in " ".join(con.export_text().split())


def test_slow_links_tell_a_slow_link_from_a_slow_channel():
    """4-rank ring, 4 channels, 1 MB per slice. 2->3 takes 4x longer on every channel (a degraded link); 0->1 only
    on channel 2 (one channel's program). Both are well below the median link; the channel counts say which."""
    rows, step = [], 0
    for src in range(4):
        dst = (src + 1) % 4
        for ch in range(4):
            dur = 100_000 if src == 2 or (src == 0 and ch == 2) else 25_000
            rows.append((src, ch, 1, dst, step, 1_000_000, 0, 0, dur))
            step += 1
    rep = build(_ops(_rows([r[:9] for r in rows]), 10))     # 2 of 4 links slow in each op: chance is 1/2
    got = [(ln["src"], ln["dst"], ln["channels_slow"], ln["channels"]) for ln in rep.slow_links]
    assert got == [(2, 3, 4, 4), (0, 1, 1, 4)]
    assert rep.slow_links[0]["gbps"] == pytest.approx(10.0)
    assert rep.slow_links[0]["median_gbps"] == pytest.approx((40 + 4e6 / 175e3) / 2)
    assert rep.to_dict()["slow_links"] == rep.slow_links
    from rich.console import Console
    from slicetrace.analyze.report import render
    con = Console(record=True, width=200)
    render(rep, console=con)
    text = con.export_text()
    # 4 x 1 MB in MiB, 4 slices, on 4 channels at once: 4 MB in 100 us (a channel alone moves 10 GB/s)
    assert re.search(r"2->3 │\s+38\.1 │\s+40 │\s+40\.00 │\s+1000\.0 │", text)       # 10 ops of it
    flat = " ".join(text.split())                       # rich wraps the long lines
    assert "slow link: rank 2's data path or link 2->3 moves 10.00 GB/s (typical slice), 68 % below the median " \
        "link (31.43), in 9 of 9 ops after the first, odds of so many by chance 0.002; that far below the other " \
        "links on 4 of 4 channels; rank 2 also moves data longest (4000.0 us of copies, the median rank 1375.0 us)" \
        in flat          # its sends are all rank 2 moves: the two look alike
    assert "slow link: link 0->1 moves" in flat
    even = build(_ops(_rows([r[:8] + (25_000,) for r in rows]), 6))        # all links alike: none is slow
    assert even.slow_links == []
    two = build(_ops(_rows([r[:9] for r in rows if r[0] < 2]), 6))         # fewer than 3 links: no median to judge
    assert two.slow_links == []


def test_ops_left_out_by_the_settings_are_not_called_losses():
    from rich.console import Console
    from slicetrace.analyze.report import render
    ks = _rows([(0, 0, 1, 1, 0, 1_000_000, 0, 10, 10_010), (1, 0, 0, 0, 0, 1_000_000, 5, 10_020, 10_030)])
    rep = build(ks, counters={0: {"overrun": 2, "ops_sampled_out": 9, "delivered_coll": 1}, 1: {"ops_below_min_bytes": 4}})
    con = Console(record=True, width=200)
    render(rep, console=con)
    text = con.export_text()
    assert "loss counters: rank 0: overrun 2; rank 1: none" in text
    assert "ops not profiled by the settings: rank 0: ops_sampled_out 9; rank 1: ops_below_min_bytes 4" in text


def test_records_outside_every_mask_are_not_called_losses():
    # a KernelStep-only mask: KernelCh is stamped (it ends each op) but no plugin takes it: counted masked_out
    from rich.console import Console
    from slicetrace.analyze.report import render
    ks = _rows([(0, 0, 1, 1, 0, 1_000_000, 0, 10, 10_010), (1, 0, 0, 0, 0, 1_000_000, 5, 10_020, 10_030)])
    rep = build(ks, counters={0: {"overrun": 0, "masked_out": 242}, 1: {"masked_out": 1200, "pool_full": 3}})
    con = Console(record=True, width=200)
    render(rep, console=con)
    text = con.export_text()
    assert "loss counters: rank 0: none; rank 1: pool_full 3" in text
    assert "records no plugin's mask asked for (masked_out, not lost): rank 0: 242; rank 1: 1,200" in text
    con = Console(record=True, width=200)
    render(build(ks, counters={0: {"masked_out": 5}, 1: {}}), console=con)
    assert "loss counters: none, every record delivered" in con.export_text()


def test_the_loss_line_names_the_units_of_counters_that_do_not_count_events():
    """overrun/unpaired/undrained count ring records (a KernelCh is two), pool_full KernelSteps a batch did not
    keep, the example plugin's PROXY_CTRL counters spans: the report said none of that, as if all were events."""
    import json
    from rich.console import Console
    from slicetrace.analyze.report import render
    ks = _rows([(0, 0, 1, 1, 0, 1_000_000, 0, 10, 10_010), (1, 0, 0, 0, 0, 1_000_000, 5, 10_020, 10_030)])
    rep = build(ks, counters={0: {"overrun": 2, "declined": 1, "delivered_coll": 1},
                              1: {"pool_full": 3, "plugin_overwritten_PROXY_CTRL": 4, "clock_offset_ns": -5}})
    con = Console(record=True, width=400)
    render(rep, console=con)
    text = con.export_text()
    assert ("loss counters: rank 0: overrun 2, declined 1; rank 1: pool_full 3, plugin_overwritten_PROXY_CTRL 4\n"
            "  (counted in events, except overrun: ring records, pool_full: KernelSteps a plugin's batch did not keep, "
            "plugin_overwritten_PROXY_CTRL: spans; a ring record is a KernelStep, or a KernelCh's start or stop)"
            ) in text
    units = json.loads(json.dumps(rep.to_dict()))["counter_units"]
    assert units == {"overrun": "ring records", "declined": "events", "delivered_coll": "events",
                     "pool_full": "KernelSteps a plugin's batch did not keep", "plugin_overwritten_PROXY_CTRL": "spans",
                     "clock_offset_ns": "ns"}
    con = Console(record=True, width=400)
    render(build(ks, counters={0: {"declined": 1}, 1: {}}), console=con)      # events only: no legend
    assert "loss counters: rank 0: declined 1; rank 1: none\n" in con.export_text()
    assert "counted in events" not in con.export_text()


def test_a_run_of_point_to_point_ops_only_says_all_to_all_is_one_of_them():
    """A `bench --op all_to_all` trace said "no collective recorded ... point-to-point ops carry none", as if the
    collective all_to_all had gone missing: NCCL's all_to_all is grouped sends and receives, with no SeqNum."""
    from rich.console import Console
    from slicetrace.analyze.report import render
    ks = _rows([(0, 0, 1, 1, 0, 1_000_000, 0, 10, 10_010), (1, 0, 0, 0, 0, 1_000_000, 5, 10_020, 10_030)])
    con = Console(record=True, width=400)
    render(build(ks), console=con)
    assert "no collective recorded on every rank (matched by SeqNum from KernelCh, else Coll events: point-to-point " \
        "ops, send/recv and all_to_all alike, carry none" in con.export_text()


def test_the_text_report_lists_the_slowest_slices_up_to_top():
    from rich.console import Console
    from slicetrace.analyze.report import render
    ks = _rows([(0, 0, 1, 1, 0, 1_000_000, 0, 10, 10_010),       # 100 GB/s
                (1, 0, 1, 0, 3, 1_000_000, 0, 0, 100_000),       # 10 GB/s: the slowest
                (0, 2, 0, 1, 5, 500_000, 0, 10, 25_010)])        # 20 GB/s
    con = Console(record=True, width=200)
    render(build(ks, top=2), console=con)
    text = con.export_text()
    assert "the 2 slowest slices of 4096 B or more (by transfer GB/s)" in text
    cell = r"│\s+([\w,.#-]+) "
    rows = re.findall(cell * 9 + "│", text[text.index("slowest slices"):])
    assert rows == [("#0", "1", "send", "0", "0", "3", "1,000,000", "100.0", "10"),        # no Coll record: SeqNum
                    ("#0", "0", "recv", "1", "2", "5", "500,000", "25.0", "20")]
    con = Console(record=True, width=200)
    render(build(ks, top=0), console=con)
    assert "slowest" not in con.export_text()


def test_top_0_prints_the_rest_of_the_report_and_writes_the_json(tmp_path, capsys):
    """--top 0 used to end in IndexError (render read the first of no late_ops) before --json was written."""
    import json
    from rich.console import Console
    from slicetrace.analyze.report import render
    from slicetrace.cli.main import main
    rows = [(r, 0, seq, "AllReduce", seq * 1000 + (500 if r == 1 else 0), seq * 1000 + 900)
            for seq in range(2) for r in range(2)]
    rep = build(_rows([(0, 0, 1, 1, 0, 8, 0, 1, 2), (1, 0, 0, 0, 0, 8, 0, 1, 2)]), top=0, chs=_chs(rows))
    assert rep.stragglers and rep.late_ops == [] and rep.slowest == []
    con = Console(record=True, width=200)
    render(rep, console=con)
    text = con.export_text()
    assert "stragglers" in text and "links" in text and "largest skew" not in text and "slowest" not in text
    for rank in range(2):                       # the same, end to end: a two-rank trace with KernelCh records
        recs = [{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": rank, "ts": 0.0,
                 "args": {"SeqNum": 0, "CommHash": 7, "Rank": rank, "Count": 2, "Datatype": "ncclFloat32",
                          "Algorithm": "RING", "Protocol": "SIMPLE", "nChannels": 1}},
                {"name": "KernelCh", "cat": "GPU", "ph": "b", "id": 2, "pid": rank, "ts": 1.0 + rank,
                 "args": {"Channel": 0, "StartGpuClk": 1000, "StopGpuClk": 5000, "ParentId": 1}},
                {"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": rank, "tid": 9, "ts": 3.0, "dur": 1.0,
                 "args": {"Channel": 0, "IsSend": rank, "Peer": 1 - rank, "Step": 0, "Size": 8, "WaitGpuClk": 0,
                          "StartGpuClk": 500, "StopGpuClk": 1000, "SeqNum": 0, "ParentId": 1}},
                {"name": "KernelCh", "cat": "GPU", "ph": "e", "id": 2, "pid": rank, "ts": 5.0},
                {"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 1, "pid": rank, "ts": 9.0}]
        (tmp_path / f"trace_7_{rank}.json").write_text(json.dumps(recs))
    out = tmp_path / "r.json"
    assert main(["report", str(tmp_path), "--top", "0", "--json", str(out)]) == 0
    assert "stragglers" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["late_ops"] == doc["slowest"] == [] and doc["startup_skew"]["rank"] == 1     # its only collective


def _ring(durs):
    """4-rank ring, one row per (src, channel, slice): durs(src, ch, k) -> transfer ns of a 1 MB slice."""
    rows, step = [], 0
    for src in range(4):
        for ch in range(2):
            for k in range(9):
                rows.append((src, ch, 1, (src + 1) % 4, step, 1_000_000, 0, 0, durs(src, ch, k)))
                step += 1
    return build(_ops(_rows(rows), 6))


def test_one_slow_slice_does_not_make_a_slow_link_but_a_slow_channel_does():
    """Before: a link's GB/s for the verdict was its bytes over its total time, so one descheduled slice (here
    2->3, slice 4 of channel 0, 100x) named the link; and a channel counted as slow when merely below the channel's
    median (1->2 on channel 1, 1 % slower, read as slow: "2 of 2 channels")."""
    outlier = _ring(lambda s, c, k: 2_500_000 if (s, c, k) == (2, 0, 4) else 25_000)
    assert outlier.slow_links == []
    assert {(ln["src"], ln["dst"]): ln for ln in outlier.links}[(2, 3)]["gbps"] < 10     # achieved: still shown
    one = _ring(lambda s, c, k: 250_000 if (s, c) == (1, 0) else 25_250 if (s, c) == (1, 1) else 25_000)
    assert [(ln["src"], ln["dst"], ln["channels_slow"], ln["channels"]) for ln in one.slow_links] == [(1, 2, 1, 2)]
    both = _ring(lambda s, c, k: 100_000 if s == 3 else 25_000)
    assert [(ln["src"], ln["dst"], ln["channels_slow"]) for ln in both.slow_links] == [(3, 0, 2)]


def test_a_link_without_transfer_time_is_null_in_json_and_n_a_in_text(tmp_path):
    """A coarse clock can give done == ready for every slice of a link: its GB/s was NaN, which json.dump writes
    as a bare NaN that strict parsers refuse."""
    import json
    from rich.console import Console
    from slicetrace.analyze.report import render
    from slicetrace.cli.outputs import write_json
    rep = build(_rows([(0, 0, 1, 1, 0, 8, 0, 5, 5), (1, 0, 0, 0, 0, 8, 0, 5, 5)]))
    assert rep.links[0]["gbps"] is None
    write_json("--json", str(tmp_path / "r.json"), rep.to_dict())
    assert json.loads((tmp_path / "r.json").read_text(), parse_constant=pytest.fail)["links"][0]["gbps"] is None
    con = Console(record=True, width=200)
    render(rep, console=con)
    text = con.export_text()
    assert re.search(r"0->1 │\s+0\.0 │\s+1 │\s+n/a │", text)
    assert "slow links: not judged, 1 link(s) in this trace" in text


def test_sampled_slices_are_said_and_not_called_losses():
    from rich.console import Console
    from slicetrace.analyze.report import render
    rep = build(_rows([(0, 0, 1, 1, 0, 8, 0, 1, 2)]), counters={0: {"sampled_out": 6, "overrun": 1}})
    con = Console(record=True, width=200)
    render(rep, console=con)
    text = con.export_text()
    assert "left slices out on purpose (6 records)" in text
    assert "loss counters: rank 0: overrun 1" in text


def _rank_file(folder, rank, nranks):
    """One rank's file of an nranks-rank run: its slicetrace_comm record and one send to the next rank."""
    import json
    recs = [{"name": "slicetrace_comm", "ph": "M", "pid": rank, "tid": 0,
             "args": {"nRanks": nranks, "CommHash": 7, "commName": ""}},
            {"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": rank, "tid": 9, "ts": 3.0, "dur": 1.0,
             "args": {"Channel": 0, "IsSend": 1, "Peer": (rank + 1) % nranks, "Step": 0, "Size": 8, "WaitGpuClk": 0,
                      "StartGpuClk": 500, "StopGpuClk": 1000, "SeqNum": 0, "ParentId": -1}}]
    path = folder / f"trace_7_{rank}.json"
    path.write_text(json.dumps(recs))
    return path


def test_a_rank_file_left_out_is_refused_unless_partial(tmp_path, capsys):
    """Before: report analysed the files it was given, so a straggler whose file was missing was never named and
    another rank took its place, with no word about the missing rank."""
    from slicetrace.cli.main import main
    for rank in range(3):
        _rank_file(tmp_path, rank, 3)
    two = [str(tmp_path / f"trace_7_{r}.json") for r in (0, 2)]
    assert main(["report", *two]) == 2
    err = capsys.readouterr().err
    assert "the run had 3 ranks" in err and "rank(s) [1]" in err and "--partial" in err
    assert main(["report", *two, "--partial"]) == 0
    assert "# --partial: rank(s) [1] of 3 absent" in capsys.readouterr().out
    assert main(["report", str(tmp_path)]) == 0


def test_wait_times_split_by_direction_per_link_and_per_rank():
    """Per link: the sender's credit waits and the receiver's data waits of that link; per rank: its receives'
    waits and its sends' waits. Every done clock differs, so no slice is fused."""
    ks = _rows([
        (0, 0, 1, 1, 0, 8, 0, 3_000, 5_000),              # 0->1 send: 3 us credit wait
        (0, 0, 1, 1, 1, 8, 10_000, 11_000, 20_000),       # 0->1 send: 1 us
        (1, 0, 0, 0, 0, 8, 0, 7_000, 7_500),              # 1 from 0: 7 us data wait
        (1, 0, 0, 0, 1, 8, 8_000, 10_000, 21_000),        # 1 from 0: 2 us
        (1, 0, 1, 0, 2, 8, 0, 500, 9_000),                # 1->0 send: 0.5 us credit wait
        (0, 0, 0, 1, 2, 8, 1_000, 12_000, 13_000),        # 0 from 1: 11 us data wait
    ])
    rep = build(ks)
    assert [(ln["src"], ln["dst"], ln["send_credit_wait_us"], ln["recv_data_wait_us"]) for ln in rep.links] == \
        [(0, 1, 4.0, 9.0), (1, 0, 0.5, 11.0)]
    assert [(r["rank"], r["recv_wait_us"], r["send_wait_us"]) for r in rep.ranks] == [(0, 11.0, 4.0), (1, 9.0, 0.5)]


def test_the_last_rank_file_left_out_is_named_too(tmp_path, capsys):
    """Every rank of the run is looked for, the highest one included."""
    from slicetrace.cli.main import main
    for rank in range(2):           # ranks 0 and 1 of a 3-rank run: rank 2's file is not there
        _rank_file(tmp_path, rank, 3)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "the run had 3 ranks" in err and "rank(s) [2]" in err and "--partial" in err
    assert main(["report", str(tmp_path), "--partial"]) == 0
    assert "# --partial: rank(s) [2] of 3 absent" in capsys.readouterr().out


def _coll_file(folder, rank, nranks, late_us=0.0, seqs=range(4), chs=True, counters=None):
    """One rank's file of an nranks-rank run: per collective (AllReduce, SeqNum seq) its Coll, one KernelCh starting
    late_us after the others' and one send to the next rank; without its KernelCh/Coll records if not chs (a file
    cut short before them); a slicetrace_counters record unless counters is None."""
    import json
    recs = [{"name": "slicetrace_comm", "ph": "M", "pid": rank, "tid": 0,
             "args": {"nRanks": nranks, "CommHash": 7, "commName": ""}}]
    for seq in seqs:
        t0 = 1000.0 * seq
        coll = [{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 100 + seq, "pid": rank, "ts": t0,
                 "args": {"SeqNum": seq, "CommHash": 7, "Rank": rank, "Count": 2, "Datatype": "ncclFloat32",
                          "Algorithm": "RING", "Protocol": "SIMPLE", "nChannels": 1}},
                {"name": "KernelCh", "cat": "GPU", "ph": "b", "id": 200 + seq, "pid": rank, "ts": t0 + 1 + late_us,
                 "args": {"Channel": 0, "StartGpuClk": 1000, "StopGpuClk": 5000, "ParentId": 100 + seq}},
                {"name": "KernelCh", "cat": "GPU", "ph": "e", "id": 200 + seq, "pid": rank, "ts": t0 + 900},
                {"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 100 + seq, "pid": rank, "ts": t0 + 950}]
        recs += coll if chs else []
        recs.append({"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": rank, "tid": 9, "ts": t0 + 800, "dur": 1.0,
                     "args": {"Channel": 0, "IsSend": 1, "Peer": (rank + 1) % nranks, "Step": seq, "Size": 8,
                              "WaitGpuClk": 0, "StartGpuClk": 500, "StopGpuClk": 1000, "SeqNum": seq,
                              "ParentId": 100 + seq}})
    if counters is not None:
        recs.append({"name": "slicetrace_counters", "ph": "M", "pid": rank, "tid": 0, "args": counters})
    (folder / f"trace_7_{rank}.json").write_text(json.dumps(recs))


def test_a_rank_without_kernel_ch_records_is_not_passed_over_for_straggler(tmp_path, capsys):
    """Rank 2 starts every collective 20 ms late, but its file was cut short before its KernelCh/Coll records (and
    its counters). Before: collectives seen on 2 ranks counted, so ranks 0 and 1 were named; now a collective counts
    only when every rank of the run has it, and the report says how many were left out and which rank lacked them.
    Its missing counters record was read as "none, every record delivered"."""
    import json
    from slicetrace.cli.main import main
    _coll_file(tmp_path, 0, 3, late_us=5.0, counters={"overrun": 0})
    _coll_file(tmp_path, 1, 3, late_us=0.0, counters={"overrun": 0})
    _coll_file(tmp_path, 2, 3, chs=False)
    out = tmp_path / "r.json"
    assert main(["report", str(tmp_path), "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())         # rich wraps lines at the terminal's width
    doc = json.loads(out.read_text())
    assert doc["stragglers"] == [] and doc["late_ops"] == []
    assert doc["stragglers_left_out"] == {"collectives": 4, "lacking": [{"rank": 2, "collectives": 4}]}
    assert "stragglers: 4 collective(s) left out, not recorded on every rank (rank 2 lacked 4;" in text
    assert "stragglers: none to name" not in text and "collectives started last" not in text
    assert "loss counters: rank 0: none; rank 1: none; rank 2: no counters record (file cut short?)" in text
    assert "every record delivered" not in text and doc["ranks_without_counters"] == [2]
    _coll_file(tmp_path, 2, 3, late_us=20_000.0, seqs=(0, 1))       # its plugin dropped collectives 2 and 3
    assert main(["report", str(tmp_path), "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    doc = json.loads(out.read_text())
    assert [(r["rank"], r["times_last"]) for r in doc["stragglers"]] == [(2, 1)]       # #0 is start-up skew
    assert doc["stragglers_left_out"]["lacking"] == [{"rank": 2, "collectives": 2}]
    assert "(rank 2 lacked 2;" in text and "so the verdict counts the other collectives only" in text
    (tmp_path / "trace_7_2.json").unlink()          # --partial: the absent rank is named; the others are compared
    assert main(["report", str(tmp_path), "--partial", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["rank"], r["times_last"]) for r in doc["stragglers"]] == [(0, 3)]
    assert doc["stragglers_left_out"]["collectives"] == 0 and doc["ranks_without_counters"] == []


def test_a_rank_without_a_counters_record_is_named_not_called_delivered():
    from rich.console import Console
    from slicetrace.analyze.report import render
    ks = _rows([(0, 0, 1, 1, 0, 8, 0, 1, 2), (1, 0, 1, 2, 0, 8, 0, 1, 2), (2, 0, 1, 0, 0, 8, 0, 1, 2)])
    rep = build(ks, counters={0: {"overrun": 0}, 1: {"overrun": 0}})
    con = Console(record=True, width=300)
    render(rep, console=con)
    text = con.export_text()
    assert "loss counters: rank 0: none; rank 1: none; rank 2: no counters record (file cut short?)" in text
    assert "every record delivered" not in text and rep.to_dict()["ranks_without_counters"] == [2]
    con = Console(record=True, width=300)
    render(build(ks, counters={r: {"overrun": 0} for r in range(3)}), console=con)
    assert "loss counters: none, every record delivered" in con.export_text()


def test_a_closed_stdout_still_gets_the_json_and_csv_written_and_exits_0(tmp_path, monkeypatch):
    """`report ... --json F --csv G | head -1`: the tables were printed first, rich exited 1 on the broken pipe,
    and neither file was written."""
    import io
    import json
    import os
    import sys
    from slicetrace.cli.main import main

    fd = os.open(tmp_path / "stdout", os.O_WRONLY | os.O_CREAT)    # what rich and main point at /dev/null

    class Closed(io.StringIO):          # a pipe whose reader has gone
        def fileno(self):
            return fd

        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    for rank in range(2):
        _coll_file(tmp_path, rank, 2, late_us=3.0 * rank, counters={})
    js, csv = tmp_path / "out" / "r.json", tmp_path / "out" / "s.csv"
    js.parent.mkdir()
    monkeypatch.setattr(sys, "stdout", Closed())
    try:
        assert main(["report", str(tmp_path), "--json", str(js), "--csv", str(csv)]) == 0
    finally:
        os.close(fd)
    assert json.loads(js.read_text())["stragglers"][0]["rank"] == 1
    assert len(csv.read_text().splitlines()) == 1 + 2 * 4         # header, one send per collective and rank


def test_ops_left_out_by_min_bytes_or_sampling_are_named_not_the_mask(tmp_path, capsys):
    """Every op under SLICETRACE_PROFILE_MIN_BYTES (or sampled out): the error told the user to fix the mask."""
    from slicetrace.cli.main import main
    for rank in range(2):
        _coll_file(tmp_path, rank, 2, seqs=(), counters={"ops_below_min_bytes": 3, "ops_sampled_out": rank})
    assert main(["report", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no KernelStep or KernelCh events to analyse" in err
    assert "6 ops_below_min_bytes (SLICETRACE_PROFILE_MIN_BYTES), 1 ops_sampled_out " \
        "(SLICETRACE_PROFILE_OP_SAMPLE_RATE)" in err and "65606" not in err
    for rank in range(2):
        _coll_file(tmp_path, rank, 2, seqs=(), counters={"ops_below_min_bytes": 0})
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "65606" in err and "MIN_BYTES" not in err


def test_ops_whose_kernel_step_a_profiling_mask_left_out_are_named_as_left_out_not_lost(tmp_path, capsys):
    """ops_masked_kernel_step was missing from the ops the error lists as left out on purpose."""
    from slicetrace.cli.main import main
    for rank in range(2):
        _coll_file(tmp_path, rank, 2, seqs=(), counters={"ops_masked_kernel_step": 2, "ops_sampled_out": 0})
    assert main(["report", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ops were left out on purpose (not lost), 4 ops_masked_kernel_step (a comm.profiling(True, mask=...) " \
        "block's mask without KernelStep);" in err and "ops_sampled_out" not in err
    assert "KernelStep in the masks of comm.profiling() blocks" in err


def _one_all_reduce_files(tmp_path, count):
    """Two ranks' files of one AllReduce of count elements (Coll events only), recorded with the mask 65606."""
    import json
    for rank in range(2):
        _coll_file(tmp_path, rank, 2, seqs=(), counters={})
        f = tmp_path / f"trace_7_{rank}.json"
        recs = json.loads(f.read_text())
        recs[0]["args"]["EventMask"] = 65606
        recs.append({"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": rank, "ts": 0.0,
                     "args": {"SeqNum": 0, "CommHash": 7, "Rank": rank, "Count": count, "Datatype": "ncclFloat32",
                              "Algorithm": "RING", "Protocol": "SIMPLE", "nChannels": 1}})
        recs.append({"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 1, "pid": rank, "ts": 5.0})
        f.write_text(json.dumps(recs))


def test_ops_that_moved_no_data_under_a_mask_with_both_are_not_blamed_on_the_mask(tmp_path, capsys):
    """Count-0 ops, or send/recv to the rank itself, recorded with KernelStep and KernelCh in the mask: the error
    told the user to put both in the mask (SLICETRACE_PROFILE_EVENT_MASK=65606), which the run had already."""
    from slicetrace.cli.main import main
    _one_all_reduce_files(tmp_path, count=0)
    assert main(["report", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no KernelStep or KernelCh events to analyse" in err and "the trace's event mask had both (EventMask " \
        "65606): its 2 op(s) moved no data between ranks" in err and "SLICETRACE_PROFILE_EVENT_MASK" not in err
    for rank in range(2):              # a mask without them: that is what to change
        f = tmp_path / f"trace_7_{rank}.json"
        f.write_text(f.read_text().replace('"EventMask": 65606', '"EventMask": 2'))
    assert main(["report", str(tmp_path)]) == 2
    assert "SLICETRACE_PROFILE_EVENT_MASK=65606" in capsys.readouterr().err


def test_files_without_ops_under_a_mask_with_both_are_not_said_to_hold_ops_that_moved_no_data(tmp_path, capsys):
    """Files that hold no op at all (the ranks stopped before their profiler's first write, or every op ran with
    profiling off), recorded with KernelStep and KernelCh in the mask: the error said "its 0 op(s) moved no data
    between ranks (a count of 0 runs no channel program, ...)", a cause no op of the run had."""
    from slicetrace.cli.main import main
    for rank in range(2):
        _coll_file(tmp_path, rank, 2, seqs=(), counters={})
        f = tmp_path / f"trace_7_{rank}.json"
        f.write_text(f.read_text().replace('"commName": ""', '"commName": "", "EventMask": 65606'))
    assert main(["report", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no KernelStep or KernelCh events to analyse" in err and "moved no data" not in err, err
    assert "the files hold no op (Coll or P2p event), though the trace's event mask had both (EventMask 65606)" \
        in err and "SLICETRACE_PROFILE_EVENT_MASK" not in err, err


def test_ops_recorded_under_a_profiling_block_mask_without_both_are_not_only_said_to_have_moved_no_data(tmp_path,
                                                                                                      capsys):
    """An all_reduce of 4096 floats inside comm.profiling(True, mask="Coll"), the plugin's mask 65606: the error
    said its ops "moved no data between ranks (a count of 0 ...)", though they did; the block's mask left the
    KernelStep and KernelCh out, and the trace does not record it."""
    from slicetrace.cli.main import main
    _one_all_reduce_files(tmp_path, count=4096)
    assert main(["report", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no KernelStep or KernelCh events to analyse" in err and "comm.profiling(True, mask=...)" in err, err


def test_kernel_ch_without_kernel_steps_says_why_the_link_tables_are_empty():
    from rich.console import Console
    from slicetrace.analyze.report import render
    rows = [(r, 0, 0, "AllReduce", 100 * r, 900) for r in range(2)]
    rep = build(_rows([]), chs=_chs(rows))
    con = Console(record=True, width=300)
    render(rep, console=con)
    text = con.export_text()
    assert "the trace has no KernelStep events (the event mask lacked KernelStep, 1<<16), so the link and rank " \
        "tables are empty" in text and "start-up skew: AllReduce #0, the first collective, rank 1" in text
    con = Console(record=True, width=300)
    render(build(_rows([(0, 0, 1, 1, 0, 8, 0, 1, 2)])), console=con)
    assert "no KernelStep events" not in con.export_text()



def test_channels_moving_at_once_are_not_added_up_in_link_rates_and_rank_times():
    """Link GB/s was bytes over the transfer times summed over channels, one channel's rate (1/C of the link's on
    C channels), and a rank's waiting and moving times were sums that could pass the run's length. 0->1 on 2
    channels at once, 1 MiB per slice in 1 ms, 10 steps: the link moved 20 MiB in 10 ms."""
    rows = []
    for step in range(10):
        t0 = step * 1_000_000
        for ch in range(2):
            rows.append((0, ch, 1, 1, step, 1 << 20, t0, t0, t0 + 1_000_000))
            rows.append((1, ch, 0, 0, step, 1 << 20, t0 - 500_000, t0, t0 + 1_000_000))   # waited 0.5 ms for it
    rep = build(_rows(rows))
    (ln,) = rep.links
    assert ln["busy_us"] == pytest.approx(10_000) and ln["gbps"] == pytest.approx(20 * 2**20 / 10e6)
    assert ln["send_transfer_us"] == pytest.approx(20_000)      # the channel-summed figure stays in the JSON
    r0, r1 = rep.ranks
    assert r0["transfer_us"] == pytest.approx(10_000) and r0["copy_us"] == pytest.approx(20_000)
    assert r1["recv_wait_us"] == pytest.approx(5_000)           # 0.5 ms before each step, both channels at once


def test_report_holds_one_rank_files_records_at_a_time(tmp_path, monkeypatch, capsys):
    """Memory: a file's records (dicts, ~5x its JSON) are dropped once its tables are taken, not all kept until the
    report is built (580 MB peak for 120 MB of JSON)."""
    from slicetrace.cli.main import main
    alive = one_file_at_a_time(monkeypatch)
    for rank in range(3):
        _coll_file(tmp_path, rank, 3, late_us=50.0 * (rank == 2))
    assert main(["report", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 0 and len(alive) == 3
    assert "AllReduce" in capsys.readouterr().out


def _p2p_rows(slow_recv=(), slow_send=()):
    """4 ranks, each sending 1 MB to each other rank, one link at a time: a send takes 25 us (100 in slow_send),
    its receive, from when the data was there, 25 us (100 in slow_recv)."""
    rows, step = [], 0
    for src in range(4):
        for dst in range(4):
            if src != dst:
                t0 = step * 1_000_000
                sent = t0 + (100_000 if (src, dst) in slow_send else 25_000)
                rows.append((src, 0, 1, dst, step, 1_000_000, t0, t0, sent))
                rows.append((dst, 0, 0, src, step, 1_000_000, t0, sent,
                             sent + (100_000 if (src, dst) in slow_recv else 25_000)))
                step += 1
    return _ops(_rows(rows), 7)         # 6 ops after the first: 3 of 12 receive sides slow in each can be named


def _text(rep):
    from rich.console import Console
    from slicetrace.analyze.report import render
    con = Console(record=True, width=200)
    render(rep, console=con)
    return " ".join(con.export_text().split())


def test_a_link_slow_on_its_receive_side_only_is_named():
    """all_to_all where rank 2's copies out of link 0->2 are slow: the link's sends move at the usual rate (a p2p
    send is done once its data is written), so links judged on their send side alone said 'slow links: none'
    (a cpu run: 0->2's receives at 1.33 GB/s, the other links' about 6). Now the receive side is judged too."""
    rep = build(_p2p_rows(slow_recv={(0, 2)}))
    assert rep.slow_links == []
    got = rep.to_dict()["slow_receive_sides"]
    assert [(r["src"], r["dst"], r["ops_slow"], r["ops"], r["receiver_other_links"], r["receiver_other_links_slow"])
            for r in got] == [(0, 2, 6, 6, 2, 0)]
    assert got[0]["gbps"] == pytest.approx(10.0) and got[0]["median_gbps"] == pytest.approx(40.0)
    assert got[0]["send_gbps"] == pytest.approx(40.0) and got[0]["below_pct"] == pytest.approx(75.0)
    flat = _text(rep)
    assert "slow receive side: link 0->2's receive side (rank 2's copies out of it) moves 10.00 GB/s (typical " \
        "slice), 75 % below the median link's receive side (40.00), in 6 of 6 ops after the first, odds of so many " \
        "by chance 3.3e-07; its send side moves at the usual rate (40.00 " \
        "GB/s, the median link's 40.00): the data was there, rank 2 was slow to take it; rank 2's receives from its " \
        "2 other peer(s) move at the usual rate: this link's receive, not all of rank 2's copies" in flat
    assert "slow links: none among the 12 links by their send side (none more than 25 % below" in flat
    every = build(_p2p_rows(slow_recv={(0, 2), (1, 2), (3, 2)}))        # rank 2 slow to take every peer's data
    assert [(r["src"], r["receiver_other_links_slow"]) for r in every.slow_receive_sides] == [(0, 2), (1, 2), (3, 2)]
    assert "rank 2's receives from 2 of its 2 other peer(s) are that slow too: rank 2's copies" in _text(every)


def test_a_receive_side_is_not_named_where_the_send_side_is_slow_or_nothing_is():
    """A link slow on both sides is slow_links' (the send's slowness makes its receive late, not slow here, but a
    receiver that also lags is the same link); healthy links name nothing and print as before."""
    both = build(_p2p_rows(slow_recv={(0, 2)}, slow_send={(0, 2)}))
    assert [(ln["src"], ln["dst"]) for ln in both.slow_links] == [(0, 2)] and both.slow_receive_sides == []
    assert "slow receive side" not in _text(both)
    even = build(_p2p_rows())
    assert even.slow_links == [] and even.to_dict()["slow_receive_sides"] == [] and even.links_judged_by == "ops"
    flat = _text(even)
    assert "slow links: none among the 12 links (none more than 25 % below the median link in most of its ops, " \
        "more often than chance explains)" in flat
    assert "slow receive side" not in flat


def test_a_fused_receive_is_timed_as_its_send_not_judged_as_a_receive_side():
    """4-rank ring of fused slices (each rank's receive and send on one done clock): 1->2's send is slow, so rank
    1's fused receive from 0 ends as late; it is the send's time (listed once, by the send), not link 0->1's
    receive side. Rank 2's last, unfused receive from 1 is slow: link 1->2's receive side, its send side slow too."""
    rows, t = [], 0
    for step in range(4):
        for r in range(4):
            dur = 100_000 if r == 1 else 25_000
            rows.append((r, 0, 0, (r - 1) % 4, step, 1_000_000, t, t, t + dur))        # fused: one done clock
            rows.append((r, 0, 1, (r + 1) % 4, step, 1_000_000, t, t, t + dur))
            t += 1_000_000
    rep = build(_ops(_rows(rows), 6))
    assert [(ln["src"], ln["dst"]) for ln in rep.slow_links] == [(1, 2)]
    assert rep.slow_receive_sides == []
    for r in range(4):                  # a last receive of its own, at the usual rate: 4 links' receive sides
        rows.append((r, 0, 0, (r - 1) % 4, 9, 1_000_000, t, t, t + 25_000))
        t += 1_000_000
    assert build(_ops(_rows(rows), 6)).slow_receive_sides == []


def _p2p_ops(slow_send_ops, slow_recv_ops, nops=5):
    """_p2p_rows over nops ops (op keys): link 0->2's sends take 100 us in slow_send_ops, its receives 100 us in
    slow_recv_ops; everything else 25 us a slice."""
    rows, step = [], 0
    for op in range(nops):
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    t0 = step * 1_000_000
                    link = (src, dst) == (0, 2)
                    sent = t0 + (100_000 if link and op in slow_send_ops else 25_000)
                    done = sent + (100_000 if link and op in slow_recv_ops else 25_000)
                    rows.append((src, 0, 1, dst, step, 1_000_000, t0, t0, sent, op, op))
                    rows.append((dst, 0, 0, src, step, 1_000_000, t0, sent, done, op, op))
                    step += 1
    return np.array(rows, KERNEL_STEP_TABLE)


def test_a_receive_side_slow_in_most_ops_is_named_where_the_send_side_is_slow_pooled_only():
    """0->2's sends 4x slower in 2 of 4 ops (37 % below the median link pooled, so not 'at the usual rate', but not
    in most ops: slow_links leaves it), its receives in every op: the link was on neither list. It is slow_receive
    _sides' now, and the line does not say its send side moves at the usual rate."""
    rep = build(_p2p_ops({1, 2}, {0, 1, 2, 3, 4}))          # op 0, start-up, is not judged
    assert rep.slow_links == []
    assert [(r["src"], r["dst"], r["ops_slow"], r["ops"]) for r in rep.slow_receive_sides] == [(0, 2, 4, 4)]
    assert rep.slow_receive_sides[0]["send_gbps"] < 0.75 * rep.slow_receive_sides[0]["send_median_gbps"]
    flat = _text(rep)
    assert "slow receive side: link 0->2's receive side" in flat and "its send side is that far below only " \
        "pooled, not in most of its ops (25.00 GB/s, the median link's 40.00): the data was there, rank 2 was slow " \
        "to take it" in flat and "usual rate (25.00" not in flat, flat
    both = build(_p2p_ops({1, 2, 3, 4}, {0, 1, 2, 3, 4}))          # its send side slow in most ops: slow_links' alone
    assert [(ln["src"], ln["dst"]) for ln in both.slow_links] == [(0, 2)] and both.slow_receive_sides == []


def test_a_send_side_slow_pooled_only_without_op_records_is_not_said_to_be_judged_in_ops():
    """The same link in a trace without op records: its receive side's line said it was judged without ops, then
    that its send side was slow 'not in most of its ops'. It names the groups of like slices the sends were judged
    in."""
    ks = _p2p_ops({1, 2}, {0, 1, 2, 3, 4})
    ks["op"] = ks["seq_number"] = -1
    rep = build(ks)
    assert rep.links_judged_by == "slices" and rep.slow_links == []
    assert [(r["src"], r["dst"], r["slice_groups_slow"], r["slice_groups"]) for r in rep.slow_receive_sides] == \
        [(0, 2, 4, 4)]
    flat = _text(rep)
    assert "its send side is that far below only pooled, not in the groups of like slices carrying most of its " \
        "bytes (25.00 GB/s, the median link's 40.00)" in flat and "ops (25.00" not in flat, flat


def _no_op_files(folder, mask: int) -> None:
    """Two ranks' files of a run that recorded no op, written under event mask `mask`."""
    for rank in range(2):
        _coll_file(folder, rank, 2, seqs=(), counters={})
        f = folder / f"trace_7_{rank}.json"
        f.write_text(f.read_text().replace('"commName": ""', f'"commName": "", "EventMask": {mask}'))


def test_files_without_ops_under_a_mask_without_coll_or_p2p_name_the_mask_and_the_profiling_block(tmp_path, capsys):
    """The plugin's mask KernelStep|KernelCh (65600) records no op at all, so ops run inside comm.profiling(True,
    mask="Coll") leave nothing: the error said "the files hold no op ... no op ran with profiling on", which the
    files cannot tell. It names the mask, the bits it lacks, the block's mask and the fix."""
    from slicetrace.cli.main import main
    for mask, lacks in ((65600, "EventMask 65600 lacks Coll (1<<1) and P2p (1<<2)"),
                        (65602, "EventMask 65602 lacks P2p (1<<2)")):
        _no_op_files(tmp_path, mask)
        assert main(["report", str(tmp_path)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"the files hold no op (Coll or P2p event), and the trace's event mask had both but not every op type " \
            f"({lacks}), so those ops leave no record: ops may have run inside comm.profiling(True, mask=...) with a " \
            f"block mask without KernelStep and KernelCh" in err and "SLICETRACE_PROFILE_EVENT_MASK=65606" in err, err
        assert "no op ran with profiling on" not in err


def test_a_trace_of_another_tool_is_said_to_lack_slicetrace_records_not_a_mask(tmp_path, capsys):
    """A torch profiler trace given to report was told to record "with both in the mask", a setting it has none of;
    with no slicetrace_comm record in any file, the error says the files are not the example plugin's."""
    import json
    from slicetrace.cli.main import main
    other = tmp_path / "torch.json"
    other.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7, "ts": 1.5, "dur": 20},
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "python"}}]}))
    assert main(["report", str(other)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no slicetrace_comm record" in err and "a trace of another tool?" in err, err
    (tmp_path / "own").mkdir()
    for rank in range(2):               # slicetrace's own, with a mask that left the steps out: not said
        _coll_file(tmp_path / "own", rank, 2, seqs=(), counters={})
        f = tmp_path / "own" / f"trace_7_{rank}.json"
        f.write_text(f.read_text().replace('"commName": ""', '"commName": "", "EventMask": 2'))
    assert main(["report", str(tmp_path / "own")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no KernelStep or KernelCh events" in err and "another tool" not in err, err
