"""report's text on when the ranks started their collectives (analyze/report.py render): start-up skew, the
straggler verdict and its table, the largest skew, and collectives left out of the verdict."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .verdicts import OP_FRACTION, SPREAD_X, fewest_trials

if TYPE_CHECKING:       # report imports this module
    from .report import Report


def render_skew(rep: Report, con) -> None:
    """Start-up skew, then the straggler verdict (its table only when a rank is a consistent straggler)."""
    from rich.table import Table
    gone, rule = rep.stragglers_left_out, rep.straggler_rule
    if rep.startup:
        w = rep.startup
        con.print(f"start-up skew: {w['func']} #{w['seq']}, the first collective, rank {w['rank']} started "
                  f"{w['late_us']:.1f} us after the first of {w['ranks']} ranks (the processes' start-up: left out "
                  f"of the stragglers)")
    floor = (f"{rule['floor_us']:.1f} us: the larger of {SPREAD_X:g} x the other ranks' median start spread, "
             f"{rule['others_spread_us']:.1f} us, and {OP_FRACTION:g} x the median op, {rule['op_us']:.1f} us")
    named = [r for r in rep.stragglers if r["consistent"]]
    if rep.stragglers and rule["collectives"]:      # shown either way: a rank last in most is worth a look
        what = ("channel programs started" if rule.get("judged_from") != "Coll" else
                "Coll event began (called the op: KernelCh not recorded)")
        t = Table(title=f"who started last (the rank whose {what} last, of {rule['collectives']} collectives after "
                        f"the first)")
        for c in ("rank", "collectives started last", "beyond the floor", "median late us", "worst us", "chance"):
            t.add_column(c, justify="right")
        for r in rep.stragglers:
            t.add_row(str(r["rank"]), str(r["times_last"]), str(r["times_late"]), f"{r['median_late_us']:.1f}",
                      f"{r['worst_us']:.1f}", f"{r['chance']:.2g}")
        con.print(t)
    if named:
        for r in named:
            con.print(f"straggler: rank {r['rank']} started last in {r['times_last']} of {rule['collectives']} "
                      f"collectives after the first, {r['times_late']} times more than the noise floor after every "
                      f"other rank (floor {floor}); median {r['median_late_us']:.1f} us after the first rank; odds "
                      f"of so many by chance {r['chance']:.2g}")
    elif rule["collectives"]:
        late = rule.get("late_collectives", 0)
        con.print(f"stragglers: no consistent straggler in {rule['collectives']} collectives after the first (" + (
                  "no rank started more than the noise floor after every other rank in any of them" if not late else
                  "no rank started more than the noise floor after every other rank in 2 or more of them and more "
                  "often than chance explains, overall or in one function's") + f"; floor {floor})")
    elif rep.startup and not gone["collectives"]:
        con.print("stragglers: not judged, the first collective (start-up) is the only one recorded on every rank")
    if rep.late_ops:                    # build kept the top N (--top 0: none)
        w = rep.late_ops[0]
        con.print(f"largest skew: {w['func']} #{w['seq']}, rank {w['rank']} started {w['late_us']:.1f} us after the "
                  f"first of {w['ranks']} ranks")
    if gone["collectives"]:             # a rank without the records may be the straggler: no confident wrong name
        who = "; ".join(f"rank {d['rank']} lacked {d['collectives']}" for d in gone["lacking"])
        con.print(f"stragglers: {gone['collectives']} collective(s) left out, not recorded on every rank ({who}; "
                  f"their KernelCh or Coll records are missing: a file cut short, or records dropped, see the loss "
                  f"counters): the rank that started them last may be one that lacks them"
                  + (", so the verdict counts the other collectives only" if rule["collectives"] else ""))
    elif rep.links and not rep.stragglers and not rep.startup and not rule["collectives"]:
        con.print("stragglers: not judged, no collective recorded on every rank (matched by SeqNum from KernelCh, "
                  "else Coll events: point-to-point ops, send/recv and all_to_all alike, carry none, see who waited "
                  "on whom; a mask without KernelCh and Coll leaves them out)")


def render_waited(rep: Report, con) -> None:
    """The most waited on line: the rank the waits led to in more ops than chance explains (waited.most_waited),
    else why no rank is named, with every rank's share of the waits."""
    if not rep.held_up:
        if rep.links:                   # judged and nothing found must not read like not judged
            con.print("most waited on: none, no rank waited after its first op (start-up is left out)")
        return
    rule, tot = rep.waited_rule, sum(h["wait_us"] for h in rep.held_up)
    each = ", ".join(f"rank {h['rank']} {h['wait_us']:.1f} us" for h in rep.held_up)
    named = [r for r in rule.get("ranks", []) if r["consistent"]]
    if not rule.get("ops"):
        con.print(f"most waited on: not judged, no op after the first has op records (Coll/P2p) to count by; the "
                  f"{tot:.1f} us the ranks waited lead to {each}")
        return
    n, pct = rule["ops"], 100 * rule["p"]
    if not named:
        top = rule["ranks"][0] if rule["ranks"] else None
        share = (f"{100 * top['ops'] / n:.0f} % of ops (rank {top['rank']}: the waits led to it, more than the "
                 f"floor {rule['floor_us']:.1f} us, in {top['ops']} of {n} ops after the first)" if top else
                 f"0 % of ops (in none of the {n} ops after the first were one rank's waits the most and more "
                 f"than the floor {rule['floor_us']:.1f} us)")
        need = (f"{rule['needed']} needed" if rule["needed"] else
                f"too few ops to name one: all of {fewest_trials(rule['p'], rule['tests'])} or more needed")
        more = (f"; beyond chance, but the waits lead to rank {rule['largest']} more in all" if top and
                top.get("beyond_chance") else "")
        con.print(f"most waited on: no rank stands out: the largest share was {share}, {pct:.0f} % expected by "
                  f"chance ({need} at {100 * rule['alpha']:g} % odds over {rule['tests']} ranks){more}; the "
                  f"{tot:.1f} us the ranks waited after their first op lead to {each}")
        return
    w = next(h for h in rep.held_up if h["rank"] == named[0]["rank"])
    others = [h for h in rep.held_up if h is not w]
    nxt = f"; next rank {others[0]['rank']}, {others[0]['wait_us']:.1f} us" if others else ""
    strag = {r["rank"] for r in rep.stragglers if r["consistent"]}
    why = "" if w["rank"] in strag or not rep.straggler_rule["collectives"] else (
        " (not named a straggler above: that verdict counts the collectives a rank started more than its noise "
        "floor after every other rank, this one the ops in which the others waited on it, late to start or slow to "
        "move data)")
    r = named[0]
    con.print(f"most waited on: rank {w['rank']}, {w['wait_us']:.1f} of the {tot:.1f} us the ranks waited after their "
              f"first op ({w['data_us']:.1f} us for its data, {w['credit_us']:.1f} us for room in its buffers; a wait "
              f"on a rank that was itself waiting is passed on to the rank it waited for); the waits led to it, more "
              f"than the floor {rule['floor_us']:.1f} us, in {r['ops']} of {n} ops after the first ({pct:.0f} % "
              f"expected by chance; odds of so many {r['chance']:.2g}){why}{nxt}")
