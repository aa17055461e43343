"""The drain under arbitrary interleavings (hypothesis): per-record writers on several channels whose started
and completed entries become visible in any order, laps of the ring, records that are never published or
never completed, exact snapshots or not, polls anywhere, op tags across 2**32 and seqs across 2**32. Every
record written is delivered once, whole (its started and completed entries are one record's) and to its own
op while that op is open, or counted lost once; with no loss and a poll after every write, everything arrives
and each KernelStep lies inside its program's KernelCh."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from slicetrace.stamps.drain import Drain
from slicetrace.stamps.layout import FLAG_CH_STOP, FLAG_SEND, KIND_CHANNEL, KIND_STEP
from tests.unit.test_drain import Recorder, rings

SLOTS = 64


class Log(Recorder):
    """Recorder plus one list of what arrived, in order."""

    def __init__(self):
        super().__init__()
        self.log = []

    def channel(self, tag, recs):
        super().channel(tag, recs)
        self.log.append(("channel", tag, recs.copy()))

    def steps(self, tag, recs):
        super().steps(tag, recs)
        self.log.append(("steps", tag, recs.copy()))

    def end_op(self, tag, ts):
        super().end_op(tag, ts)
        self.log.append(("end", tag, None))


class Writers:
    """One writer per channel, by the publish protocol (stamps.layout), each step a record of its own: reserve
    and write the started payload, publish its seq word, later the completed entry. A KernelCh start or stop is
    written whole at once. Identity: record id i has step i, size i % 997 + 1, wait/ready/done 8i + 1/2/3."""

    def __init__(self, v):
        self.v, self.rid = v, 0
        self.recs = {}                      # id -> (channel, seq, op, kind, flags, program)
        self.state = {}                     # id -> 'reserved', 'published' or 'complete'

    def _write(self, which, ch, seq, op, rid, kind, flags, word=True):
        i = seq & (SLOTS - 1)
        ring = self.v.started if which == "st" else self.v.completed
        wait, ready, done = (8 * rid + 1, 8 * rid + 2, 0) if which == "st" else (0, 0, 8 * rid + 3)
        step, size = (rid, rid % 997 + 1) if kind == KIND_STEP else (0, 0)
        ring[ch][i] = (0, wait, ready, done, op & 0xFFFFFFFF, step, size, 1, kind, flags)
        if word:
            ring[ch]["seq"][i] = seq

    def reserve(self, ch, op, kind, flags, prog):
        seq = int(self.v.header["reserved"][ch]) + 1
        self.v.header["reserved"][ch] = seq
        rid, self.rid = self.rid, self.rid + 1
        self.recs[rid] = (ch, seq, op, kind, flags, prog)
        self._write("st", ch, seq, op, rid, kind, flags, word=kind == KIND_CHANNEL)
        if kind == KIND_CHANNEL:             # started and completed at once
            self._write("co", ch, seq, op, rid, kind, flags)
            self.state[rid] = "complete"
        else:
            self.state[rid] = "reserved"
        return rid

    def publish(self, rid):
        ch, seq, op, kind, flags, _ = self.recs[rid]
        self.v.started[ch]["seq"][seq & (SLOTS - 1)] = seq
        self.state[rid] = "published"

    def complete(self, rid):
        ch, seq, op, kind, flags, _ = self.recs[rid]
        self._write("co", ch, seq, op, rid, kind, flags)
        self.state[rid] = "complete"


@settings(max_examples=60, deadline=None)
@given(nch=st.integers(1, 3),
       ops=st.lists(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12) | st.integers(40, 90)),    # laps too
                             min_size=1, max_size=3), min_size=1, max_size=5),
       eager=st.booleans(), pollp=st.sampled_from([0.0, 0.01, 0.2]), exact=st.booleans(),
       tag0=st.sampled_from([1, 2 ** 32 - 2]), seq0=st.sampled_from([0, 2 ** 32 - 20]),
       rnd=st.randoms(use_true_random=False))
def test_every_record_is_delivered_once_whole_to_its_open_op_or_counted_lost(nch, ops, eager, pollp, exact, tag0,
                                                                           seq0, rnd):
    v, sink = rings(nch, SLOTS), Log()
    d = Drain(v, sink)
    v.header["reserved"][:] = seq0            # as if seq0 records per channel had been written and drained
    d.cursor[:] = seq0
    w = Writers(v)
    lapped = set()                            # (channel, seq) the drain's cursor passed after its slot was reused
    poll = d._poll

    def watched(force):                       # single-threaded: reserved does not move during a poll
        before, top = d.cursor.astype(np.int64), v.header["reserved"].astype(np.int64)
        n = poll(force)
        for c in range(nch):
            lapped.update((c, q) for q in range(int(before[c]) + 1, min(int(d.cursor[c]), int(top[c]) - SLOTS) + 1))
        return n
    d._poll = watched
    lost = None if eager else {}              # id -> 'start' (never published) or 'complete' (never completed)
    tags, finished, uniq = [], set(), {}
    for k, progs in enumerate(ops):
        tag = tag0 + k
        tags.append(tag)
        # this op's reservations, per channel in program order: KernelCh start, steps, KernelCh stop; programs
        # of one op on one channel have one KernelCh key (p2p parts to one peer), so the op's keys are not unique
        todo = {}
        for j, (ch, nsteps) in enumerate(progs):
            prog = (tag, ch % nch, j)
            todo.setdefault(ch % nch, []).extend([(KIND_CHANNEL, FLAG_SEND, prog)] + [(KIND_STEP, FLAG_SEND, prog)]
                                                 * nsteps + [(KIND_CHANNEL, FLAG_SEND | FLAG_CH_STOP, prog)])
        uniq[tag] = len(todo) == len(progs)
        d.expect(tag, channels=True, unique_keys=uniq[tag])
        if not exact:
            d.op_submitted(tag, lambda tag=tag: tag in finished)
        mine = []
        while todo or any(w.state[i] != "complete" and (lost is None or i not in lost) for i in mine):
            acts = []
            for ch, q in todo.items():
                nxt = int(v.header["reserved"][ch]) + 1    # a record must not stay open across a lap of its slot
                if all(w.state[i] == "complete" or (lost is not None and i in lost) or w.recs[i][0] != ch
                       or w.recs[i][1] > nxt - SLOTS for i in mine):
                    acts.append(("reserve", ch))
            for i in mine:
                if lost is not None and lost.get(i) == "start" or w.state[i] == "complete":
                    continue
                if w.state[i] == "reserved":
                    acts.append(("publish", i))
                elif lost is None or lost.get(i) != "complete":
                    acts.append(("complete", i))
            kind, arg = rnd.choice(acts)
            if kind == "reserve":
                k_, f_, prog = todo[arg].pop(0)
                rid = w.reserve(arg, tag, k_, f_, prog)
                mine.append(rid)
                if lost is not None and k_ == KIND_STEP and rnd.random() < 0.08:
                    lost[rid] = rnd.choice(["start", "complete"])
                if not todo[arg]:
                    del todo[arg]
                    if not todo and exact:        # every seq of the op reserved, none of a later op
                        d.op_submitted(tag, lambda tag=tag: tag in finished, v.header["reserved"].copy())
            elif kind == "publish":
                w.publish(arg)
            else:
                w.complete(arg)
            if eager or rnd.random() < pollp:
                d.poll_once()
        finished.add(tag)
        if eager or rnd.random() < 4 * pollp:
            d.poll_once()
    d.poll_once()
    d.stop(5.0)
    assert d.settled and d.idle() and not d.open_records

    # each op ends once, in order, and nothing of it arrives after its end
    assert [t for kind, t, _ in sink.log if kind == "end"] == tags
    ended = set()
    seen = set()
    nsteps = nch_recs = 0
    chs = {}
    for kind, tag, recs in sink.log:
        if kind == "end":
            ended.add(tag)
            continue
        assert tag not in ended, f"{kind} of op {tag} delivered after its end"
        for r in recs:
            assert int(r["op"]) == tag & 0xFFFFFFFF
            if kind == "steps":
                rid = int(r["step"])
                ch, seq, op, k_, f_, prog = w.recs[rid]
                assert (op, ch, int(r["channel"]), int(r["size"]), int(r["peer"]), int(r["flags"])) == \
                    (tag, ch, ch, rid % 997 + 1, 1, FLAG_SEND)
                assert (int(r["wait"]), int(r["ready"]), int(r["done"])) == (8 * rid + 1, 8 * rid + 2, 8 * rid + 3)
                assert rid not in seen and w.state[rid] == "complete"
                seen.add(rid)
                nsteps += 1
            else:
                assert kind == "channel" and int(r["flags"]) == FLAG_SEND
                prog = w.recs[(int(r["ready"]) - 2) // 8][5]          # the program of its start
                start = [i for i, rec in w.recs.items() if rec[5] == prog and rec[3] == KIND_CHANNEL]
                assert prog[:2] == (tag, int(r["channel"])) and prog not in chs
                assert (int(r["ready"]), int(r["done"])) == (8 * start[0] + 2, 8 * start[1] + 3)
                chs[prog] = (int(r["ready"]), int(r["done"]))
                nch_recs += 2
    drops = sink.drops
    assert set(drops) <= {"overrun", "unpaired", "unwritten"}, drops
    assert nsteps + nch_recs + drops["overrun"] + drops["unpaired"] + drops["unwritten"] == len(w.recs), \
        (drops, nsteps, nch_recs)
    # a program whose KernelCh start was lapped delivers nothing; one whose start and stop were read, its KernelCh
    # (unless its key repeats in its op: a lap between them drops it, as its stop may be a later program's)
    read = {(prog, k_ & FLAG_CH_STOP) for ch, seq, op, k, k_, prog in w.recs.values()
            if k == KIND_CHANNEL and (ch, seq) not in lapped}
    assert all((w.recs[rid][5], 0) in read for rid in seen), "a KernelStep of a program whose start was lapped"
    both = {p for p, stop in read if not stop and (p, FLAG_CH_STOP) in read}
    assert set(chs) <= both and {p for p in both if uniq[p[0]]} <= set(chs)
    if eager:
        assert not drops and nsteps + nch_recs == len(w.recs)
        for rid in seen:
            lo, hi = chs[w.recs[rid][5]]
            assert lo <= 8 * rid + 1 and 8 * rid + 3 <= hi
