"""report's text on the links (analyze/report.py render): the slow link and slow receive side verdicts, what they
rest on, why they were not judged, and why a link far below in the links table is not named."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .links import MIN_JUDGED_BYTES, too_few_ops
from .verdicts import ALPHA

if TYPE_CHECKING:       # report imports this module
    from .report import Report


def render_links(rep: Report, con) -> None:
    """The links' verdicts, after the stragglers and waits."""
    moving = {r["rank"]: r["copy_us"] for r in rep.ranks}
    med = float(np.median(list(moving.values()))) if moving else 0.0

    def longest(r: int) -> str:
        return f"moves data longest ({moving[r]:.1f} us of copies, the median rank {med:.1f} us)"
    for ln in rep.slow_links:
        s, d = ln["src"], ln["dst"]
        n_o = ln.get("sender_other_links", 0)
        link_only = n_o > 0 and not ln.get("sender_other_links_slow", 0)    # its copies to other peers are fine
        who = f"rank {s}'s data path or link {s}->{d}" if ln["sender_outlier"] and not link_only else f"link {s}->{d}"
        con.print(f"slow link: {who} moves {ln['gbps']:.2f} GB/s (typical slice), {ln['below_pct']:.0f} % below the "
                  f"median link ({ln['median_gbps']:.2f})"
                  + _judged_text(ln)
                  + (f"; rank {s} also {longest(s)}: a slow rank's copies look like a slow link"
                     if ln["sender_outlier"] and not link_only else "")
                  + (f"; rank {s} {longest(s)}, but its {n_o} other link(s) move at the usual rate: the link, not "
                     f"its copies" if ln["sender_outlier"] and link_only else "")
                  + (f"; it feeds rank {d}, which {longest(d)}: writes into a lagging rank's buffers are slowed "
                     f"too, so this may be rank {d}, not the link"
                     if ln.get("receiver_outlier") and not ln["sender_outlier"] else ""))
    bare = rep.links_judged_by == "slices"          # how the send sides were judged (links.link_rates)
    most = "in the groups of like slices carrying most of its bytes" if bare else "in most of its ops"
    for ln in rep.slow_receive_sides:     # p2p: a slow receiver does not slow its sender's slices
        s, d = ln["src"], ln["dst"]
        n_o, n_slow = ln["receiver_other_links"], ln["receiver_other_links_slow"]
        sends = [x["dst"] for x in rep.slow_links if x["src"] == d]
        con.print(f"slow receive side: link {s}->{d}'s receive side (rank {d}'s copies out of it) moves "
                  f"{ln['gbps']:.2f} GB/s (typical slice), {ln['below_pct']:.0f} % below the median link's receive "
                  f"side ({ln['median_gbps']:.2f})"
                  + _judged_text(ln)
                  + (f"; its send side moves at the usual rate ({ln['send_gbps']:.2f} GB/s, the median link's "
                     if ln["send_gbps"] >= 0.75 * ln["send_median_gbps"] else     # slow_links' 25 %, pooled only
                     f"; its send side is that far below only pooled, not {most} ({ln['send_gbps']:.2f} GB/s, the "
                     f"median link's ")
                  + f"{ln['send_median_gbps']:.2f}): the data was there, rank {d} was slow to take it"
                  + (f"; rank {d}'s receives from its {n_o} other peer(s) move at the usual rate: this link's "
                     f"receive, not all of rank {d}'s copies" if n_o and not n_slow else "")
                  + (f"; rank {d}'s receives from {n_slow} of its {n_o} other peer(s) are that slow too: rank {d}'s "
                     f"copies" if n_slow else "")
                  + (f"; rank {d} also {longest(d)}" if ln["receiver_outlier"] else "")
                  + (f"; rank {d} also sends on slow link(s) {', '.join(f'{d}->{x}' for x in sends)} above: both "
                     f"point at rank {d}'s copies" if sends else ""))
    judged = sum(1 for ln in rep.links if ln.get("judged_slices", 1))
    if 0 < len(rep.links) < 3:
        con.print(f"slow links: not judged, {len(rep.links)} link(s) in this trace and the check compares each with "
                  f"the median of 3 or more")
    elif rep.links and judged < 3:
        con.print(f"slow links: not judged, {judged} of the {len(rep.links)} links moved slices of {MIN_JUDGED_BYTES} "
                  f"B or more (smaller ones time latency, not bandwidth)")
    elif rep.links and rep.link_rule and too_few_ops(rep.link_rule):
        r = rep.link_rule
        con.print(f"slow links: not judged, too few ops to judge links: {r['ops']} op(s) after the first (start-up, "
                  f"left out) where 3 or more links moved; a link slow in every one would still be within chance, "
                  f"so it takes {r['needed'] or 'too many'} (the stragglers' rule: odds of at most {ALPHA:g} over "
                  f"the {r['tests']} links)")
    elif rep.links and not rep.slow_links:
        side = " by their send side" if rep.slow_receive_sides else ""       # a receive side is, above
        con.print(f"slow links: none among the {len(rep.links)} links{side} (none more than 25 % below the median "
                  f"link {most}{' (no op records)' if bare else ', more often than chance explains'})")
    for ln in rep.links_below_unnamed:      # the table shows it far below: the verdict says why it is not named
        con.print(f"link {ln['src']}->{ln['dst']} moves {ln['gbps']:.2f} GB/s in the links table, "
                  f"{ln['below_pct']:.0f} % below the median link's {ln['median_gbps']:.2f}, but is not named slow: "
                  f"{_failed_text(ln, most)}")


def _failed_text(ln: dict, most: str) -> str:
    """The rule a link far below in the links table failed (links.unnamed_below)."""
    f = ln["failed"]
    if f == "too_few_ops":
        return "too few ops to judge links"
    if f == "not_judged":
        return f"none of its slices after the first op is of {MIN_JUDGED_BYTES} B or more, which judge links"
    if f == "typical":
        return (f"its typical slice moves {ln['typical_gbps']:.2f} GB/s, within 25 % of the median link's "
                f"{ln['typical_median_gbps']:.2f} (the verdict judges typical slices after the first op: a few "
                f"stalled slices, or the start-up, pull the table's figure down)")
    if f == "no_op":
        return "it moved in no op after the first where 3 or more links moved"
    if f == "ops":
        return (f"its typical slice is {ln['typical_gbps']:.2f} GB/s, far below the median link's "
                f"{ln['typical_median_gbps']:.2f} pooled, but not {most}" + (
                    f" ({ln['ops_slow']} of {ln['ops']} ops after the first)" if ln["ops"] else ""))
    return (f"its typical slice is that far below in {ln['ops_slow']} of {ln['ops']} ops after the first, which "
            f"chance explains (odds {ln['chance']:.2g}; the stragglers' rule: at most {ALPHA:g} over the links)")


def _judged_text(ln: dict) -> str:
    """What a slow link's (or receive side's) verdict rests on: its ops, or its groups of slices (a trace without
    op records), and its channels."""
    odds = f", odds of so many by chance {ln['chance']:.2g}" if ln.get("chance") is not None else ""
    return ((f", in {ln['ops_slow']} of {ln['ops']} ops after the first{odds}" if ln["ops"] > 1 else "")
            + _groups_text(ln)
            + (f"; that far below the other links on {ln['channels_slow']} of {ln['channels']} channels"
               if ln["channels"] > 1 else ""))


def _groups_text(ln: dict) -> str:
    """How a slow link of a trace without op records was judged (links.link_rates' groups of slices), else ''."""
    if not ln.get("slice_groups"):
        return ""
    return (f", judged without ops (the trace has no Coll/P2p records) against the other links' slices of its size "
            f"and kind (fused with a receive or not) in each quarter of the run: that far below in "
            f"{ln['slice_groups_slow']} of its {ln['slice_groups']} such groups, which carry most of its bytes")
