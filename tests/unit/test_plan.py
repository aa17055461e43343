"""Plans alone: NCCL's slice/chunk/channel geometry, ring shape, traffic, and a message-passing simulation that
runs every rank's primitive list (n up to 8) and must compute the collective."""
from __future__ import annotations

import re
from collections import defaultdict, deque

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from slicetrace.errors import UsageError
from slicetrace.plan.schedule import (P2pPart, p2p_pieces, plan_collective, plan_p2p, proto_for, slice_layout,
                                      split_channels, split_p2p)
from slicetrace.plan.traffic import bytes_per_direction, expected_slices

STEP = 1 << 16            # 512 KiB FIFO / 8: small, so modest counts span many chunks and loops
UNWRITTEN = -999          # outputs start as this (inputs are -5..5)


def test_slice_layout_follows_nccl_generic_op():
    p = proto_for("all_reduce", 512 << 10)
    assert (p.slice_steps, p.chunk_steps, p.slice_per_chunk) == (2, 4, 2)
    assert slice_layout(262144, 4, p) == ((0, 131072), (131072, 131072))      # a 1 MiB chunk: 2 slices
    assert slice_layout(1000, 4, p) == ((0, 1000), (1000, 0))                 # min slice = step*2/32
    assert slice_layout(20000, 4, p) == ((0, 10000), (10000, 10000))          # ceil(n/32)*16 above the minimum
    assert slice_layout(2000, 4, p) == ((0, 2000), (2000, 0))                 # 1008 < min 8192: one slice
    assert slice_layout(0, 4, p) == ((0, 0), (0, 0))
    b = proto_for("broadcast", 512 << 10)
    assert (b.slice_steps, b.chunk_steps) == (1, 1) and len(slice_layout(5, 4, b)) == 1


@given(count=st.integers(0, 3_000_000), itemsize=st.sampled_from([1, 2, 4, 8]), nch=st.integers(1, 64))
@settings(max_examples=60, deadline=None)
def test_channels_cover_the_buffer_contiguously_and_aligned(count, itemsize, nch):
    parts = split_channels(count, itemsize, nch)
    assert sum(n for _, n in parts) == count and len(parts) <= nch
    lo = 0
    for i, (a, n) in enumerate(parts):
        assert a == lo and n > 0
        assert (a * itemsize) % 16 == 0
        lo += n
    if len(parts) > 1:
        assert all(n * itemsize >= 32 * 1024 for _, n in parts[:-1])


def simulate(func, n, count, root=0, nch=3, seed=0):
    """Run every rank's plan with unbounded FIFOs; return outputs (sum reduction)."""
    rng = np.random.default_rng(seed)
    cin = count * n if func == "reduce_scatter" else count
    cout = count * n if func == "all_gather" else count
    ins = [rng.integers(-5, 6, cin).astype(np.int64) for _ in range(n)]
    outs = [np.full(cout, UNWRITTEN, np.int64) for _ in range(n)]
    plans = [plan_collective(func, n, r, count, 8, root, nch, STEP) for r in range(n)]
    queues = defaultdict(deque)
    work = [deque((p.channel, prim, off, m) for p in plan.programs for prim in p.prims for off, m in prim.slices)
            for plan in plans]
    edges = set()
    while any(work):
        moved = False
        for r in range(n):
            while work[r]:
                ch, prim, off, m = work[r][0]
                if prim.recv_from is not None and not queues[(prim.recv_from, r, ch)]:
                    break
                work[r].popleft()
                moved = True
                bufs = {"in": ins[r], "out": outs[r]}
                val = bufs[prim.src][prim.src_off + off:prim.src_off + off + m].copy() if prim.src else None
                if prim.recv_from is not None:
                    got = queues[(prim.recv_from, r, ch)].popleft()
                    val = got + val if prim.reduce else got
                if prim.dst:
                    outs[r][prim.dst_off + off:prim.dst_off + off + m] = val
                if prim.send_to is not None:
                    queues[(r, prim.send_to, ch)].append(val)
                    edges.add((r, prim.send_to))
        assert moved, f"{func} n={n}: the plans deadlock"
    assert not any(queues.values()), "a slice was sent and never received"
    return ins, outs, edges


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("func", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"])
def test_every_rank_plan_together_computes_the_collective(func, n):
    for count in (0, 1, 7, 12_345, 100_003):
        root = count % n
        ins, outs, edges = simulate(func, n, count, root)
        total = np.sum(ins, axis=0)
        for r in range(n):
            if func == "all_reduce":
                want = total
            elif func == "all_gather":
                want = np.concatenate(ins)
            elif func == "reduce_scatter":
                want = total[r * count:(r + 1) * count]
            elif func == "broadcast":
                want = ins[root]
            else:                                    # NCCL: recvbuff is only used on the root
                want = total if r == root else np.full(count, UNWRITTEN, np.int64)
            assert np.array_equal(outs[r], want), (func, n, count, r)
        if count and func in ("all_reduce", "all_gather", "reduce_scatter"):
            assert edges == {(r, (r + 1) % n) for r in range(n)}          # exactly the ring


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_all_reduce_moves_2_n_minus_1_over_n_of_the_buffer(n):
    count = 1_000_000
    sent = [bytes_per_direction(plan_collective("all_reduce", n, r, count, 4, 0, 4, STEP)) for r in range(n)]
    assert sum(s for s, _ in sent) == sum(v for _, v in sent) == 2 * (n - 1) * count * 4
    for s, v in sent:
        assert abs(s - 2 * (n - 1) / n * count * 4) <= 2 * n * 16 * 4 * 4      # within chunk alignment


def test_p2p_plan_chunks_and_self_parts():
    parts = [P2pPart(1, True, 300_000, 0), P2pPart(0, False, 10, 1), P2pPart(2, False, 5, 2),
             P2pPart(0, True, 10, 3)]
    plan = plan_p2p(parts, 3, 0, 4, 1 << 19, 1 << 19, 2)
    assert [p.params["peer"] for p in plan.programs] == [1, 2]                # the self parts are a copy
    assert plan.self_pairs == ((3, 1),)                                       # (send, recv) part indices
    sends = [s for s in expected_slices(plan) if s[1]]
    assert sum(b for *_, b in sends) == 300_000 * 4 and max(b for *_, b in sends) <= 1 << 19


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 8), nch=st.integers(1, 64), data=st.data())
def test_a_p2p_connection_runs_on_one_channel_at_both_ends(n, nch, data):
    """Each rank plans its own group (different peers, counts and order of peers); the k-th send of a to b and
    the k-th receive at b from a still land on the same channel, so (channel, step) pairs them in a trace."""
    groups = []
    for r in range(n):
        msgs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.booleans()), max_size=12))
        groups.append([P2pPart(p, s, 10, i) for i, (p, s) in enumerate(msgs) if p != r])
    where: dict[tuple, list[int]] = defaultdict(list)      # (src, dst, is_send side) -> channels in order
    for r, parts in enumerate(groups):
        for prog in plan_p2p(parts, n, r, 4, 1 << 19, 1 << 19, nch).programs:
            pr = prog.params
            assert 0 <= prog.channel < nch
            src, dst = (r, pr["peer"]) if pr["is_send"] else (pr["peer"], r)
            where[(src, dst, pr["is_send"])].append((pr["conn"], prog.channel))
    for (src, dst, is_send), sends in where.items():
        if is_send:
            recvs = dict(where.get((src, dst, False), []))
            assert [k for k, _ in sends] == list(range(len(sends)))
            assert all(recvs.get(k, c) == c for k, c in sends), (src, dst, sends, recvs)


def test_p2p_channels_keep_a_ranks_send_and_receive_apart_at_two_ranks():
    """2 ranks, a send and a receive split into 8 pieces each: 16 programs on 16 channels, as before the pieces
    were placed by connection, so each still gets a whole block on the GPU."""
    parts = [P2pPart(1, True, 10, i) for i in range(8)] + [P2pPart(1, False, 10, 8 + i) for i in range(8)]
    for r in (0, 1):
        parts_r = [P2pPart(1 - r, p.is_send, p.count, p.index) for p in parts]
        assert sorted(q.channel for q in plan_p2p(parts_r, 2, r, 4, 1 << 19, 1 << 19, 64).programs) == list(range(16))


@pytest.mark.parametrize("n", [2, 4, 6, 8])
def test_a_ring_of_sends_keeps_each_ranks_send_and_receive_on_two_channels(n):
    """Pipeline and ring patterns (send to r + 1, receive from r - 1) with an even number of ranks: no rank runs its
    send and its receive in one block."""
    for r in range(n):
        parts = [P2pPart((r + 1) % n, True, 10, 0), P2pPart((r - 1) % n, False, 10, 1)]
        send, recv = (q.channel for q in plan_p2p(parts, n, r, 4, 1 << 19, 1 << 19, 64).programs)
        assert send != recv, (n, r)


@pytest.mark.parametrize("self_parts, words", [
    ([(True, 4), (True, 4), (False, 4)], "2 send(s) to itself and 1 recv(s)"),
    ([(False, 4)], "0 send(s) to itself and 1 recv(s)"),
    ([(True, 4), (False, 4), (True, 6), (False, 5)], "send to self #1 on rank 1 has count=6 but the recv"),
])
def test_p2p_sends_and_recvs_to_self_must_pair_up(self_parts, words):
    """Checked in the plan, so every backend rejects the group the same way and before anything moves."""
    parts = [P2pPart(0, True, 8, 0)] + [P2pPart(1, s, n, i + 1) for i, (s, n) in enumerate(self_parts)]
    with pytest.raises(UsageError, match=re.escape(words)):
        plan_p2p(parts, 2, 1, 4, 1 << 19, 1 << 19, 1)
    ok = [P2pPart(1, s, 4, i) for i, s in enumerate((True, False, False, True))]
    assert plan_p2p(ok, 2, 1, 4, 1 << 19, 1 << 19, 1).self_pairs == ((0, 1), (3, 2))


def test_p2p_pieces_one_per_512_kib_within_the_channel_and_world_budgets():
    assert p2p_pieces(0, 1, 2) == 1 and p2p_pieces(1 << 19, 64, 2) == 1
    assert p2p_pieces(8 << 20, 64, 2) == 16                     # one per 512 KiB
    assert p2p_pieces(1 << 30, 64, 2) == 32                     # at most 32
    assert p2p_pieces(1 << 30, 16, 2) == 8                      # half the channels
    assert p2p_pieces(1 << 30, 64, 4) == 10                     # an exchange with every peer fits 64 programs
    assert p2p_pieces(1 << 30, 64, 5) == 5                      # 5 ranks: d = 2 and 3 need 3 colours, 12 channels


@pytest.mark.parametrize("n", [2, 3, 5])
def test_both_ends_cut_a_message_alike_however_each_groups_it(n):
    """NCCL does not ask the two sides to group alike: three sends in one group on rank 0 against three single
    receives on rank 1 must make the same pieces (before, the cut depended on the group's parts with the peer)."""
    from slicetrace.plan.schedule import split_p2p
    count, chans = 3 << 20, (lambda nbytes: 64)
    grouped, _ = split_p2p(tuple((1, True, count, i * count) for i in range(3)), 0, n, 4, chans)
    single = [split_p2p(((0, False, count, i * count),), 1, n, 4, chans)[0] for i in range(3)]
    assert [(p.count, p.offset) for p, _ in grouped] == [(p.count, p.offset) for g in single for p, _ in g]
    assert len(grouped) > 3


def _matched_groups(n, msgs):
    """Each rank's group for messages (src, dst, count) in one global order: sends and receives interleaved as
    each rank meets them, so ranks hold different numbers of parts and peers."""
    groups = [[] for _ in range(n)]
    for src, dst, count in msgs:
        groups[src].append((dst, True, count, 0))
        if dst != src:
            groups[dst].append((src, False, count, 0))
        else:
            groups[src].append((src, False, count, 0))
    return groups


@settings(max_examples=150, deadline=None)
@given(n=st.integers(2, 6), data=st.data())
def test_both_ends_cut_a_message_into_the_same_pieces(n, data):
    """A halo exchange has ranks with one neighbour and ranks with two: the sender's piece k of a message must be
    the receiver's piece k (same connection, same count), whatever else each group holds; and no rank needs more
    programs than one launch runs when it exchanges at most one message each way with each peer (more large
    messages per peer can need more: cuda refuses that group, naming the limit)."""
    msgs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1),
                                        st.sampled_from([0, 1, 1000, 3 << 18, 5 << 20, 40 << 20])), max_size=10))
    groups = _matched_groups(n, msgs)
    chans = lambda nbytes: max(1, min(64, nbytes // (32 << 10)))     # the cuda backend's rule
    cut = {}
    for r, shape in enumerate(groups):
        pieces, nprog = split_p2p(tuple(shape), r, n, 4, chans)
        ways = [(peer, snd) for peer, snd, _, _ in shape if peer != r]
        if len(ways) == len(set(ways)):
            assert sum(nprog) <= 64
        plan = plan_p2p([p for p, _ in pieces], n, r, 4, 1 << 19, 1 << 19, 64)
        for prog in plan.programs:
            pr = prog.params
            src, dst = (r, pr["peer"]) if pr["is_send"] else (pr["peer"], r)
            cut[(src, dst, pr["is_send"], pr["conn"])] = (pr["count"], prog.channel)
    for (src, dst, is_send, k), got in cut.items():
        if is_send:
            assert cut[(src, dst, False, k)] == got, (src, dst, k)


def test_halo_exchange_pieces_match_between_a_boundary_and_an_interior_rank():
    """Rank 0 of a line 0-1-2 talks to rank 1 only, rank 1 to both: 16 MiB each way is cut alike at both ends
    (with the budget of each rank's own peer count, rank 0 cut 32 pieces and rank 1 expected 16; 3 ranks take 6
    channels per connection number, so 10 pieces of 2 parts per peer fill 60 of the 64)."""
    n, count = 3, 4 << 20
    groups = [[(1, True, count, 0), (1, False, count, 0)],
              [(0, True, count, 0), (2, True, count, 0), (0, False, count, 0), (2, False, count, 0)],
              [(1, True, count, 0), (1, False, count, 0)]]
    chans = lambda nbytes: 64
    split = [split_p2p(tuple(g), r, n, 4, chans)[1] for r, g in enumerate(groups)]
    assert split == [[10, 10], [10, 10, 10, 10], [10, 10]]


def test_the_p2p_program_budget_is_what_one_cuda_launch_runs():
    from slicetrace.backend.cuda.layout import MAXP
    from slicetrace.plan.schedule import MAX_P2P_PROGRAMS
    assert MAX_P2P_PROGRAMS == MAXP


@pytest.mark.parametrize("n", range(2, 10))
def test_all_to_all_never_puts_a_ranks_send_and_receive_on_one_channel(n):
    """Any rank count, odd ones included (a cycle of d-steps of odd length cannot be coloured with 2): every
    program of a rank's all_to_all gets a channel of its own, also split into pieces, and both ends agree."""
    k = p2p_pieces(64 << 20, 64, n)
    chans = {}
    for r in range(n):
        parts = []
        for d in range(1, n):
            for i in range(k):
                parts.append(P2pPart((r + d) % n, True, 10, len(parts)))
                parts.append(P2pPart((r - d) % n, False, 10, len(parts)))
        progs = plan_p2p(parts, n, r, 4, 1 << 19, 1 << 19, 64).programs
        used = [q.channel for q in progs]
        assert len(set(used)) == len(used) == 2 * (n - 1) * k, (n, r, k)
        for q in progs:
            src, dst = (r, q.params["peer"]) if q.params["is_send"] else (q.params["peer"], r)
            chans.setdefault((src, dst, q.params["conn"]), set()).add(q.channel)
    assert all(len(c) == 1 for c in chans.values())


def test_plans_of_large_ops_are_cached_by_the_dozen_not_the_thousand():
    """One lru cache of 4096 plans held 250-630 MB in a run of random large counts (a plan grows with its op: ~0.3 KB
    per FIFO step). Large plans now have a small cache of their own; small ones stay cached by the thousand. (What
    they hold is a benchmark's question; this checks which cache keeps what.)"""
    small_cache, large_cache = plan_collective.caches
    small = plan_collective("all_reduce", 8, 0, 1000, 4, 0, 1, STEP)
    n_small = small_cache.cache_info().currsize
    for i in range(300):            # distinct 64 MiB all_reduces
        plan_collective("all_reduce", 8, 0, (16 << 20) + 1024 * i, 4, 0, 1, 1 << 19)
    assert large_cache.cache_info().currsize == large_cache.cache_info().maxsize == 64
    assert small_cache.cache_info().currsize == n_small and small_cache.cache_info().maxsize == 4096
    assert plan_collective("all_reduce", 8, 0, 1000, 4, 0, 1, STEP) is small
    big = plan_collective("all_reduce", 8, 0, (16 << 20) + 1024 * 299, 4, 0, 1, 1 << 19)
    assert plan_collective("all_reduce", 8, 0, (16 << 20) + 1024 * 299, 4, 0, 1, 1 << 19) is big


@pytest.mark.parametrize("per_rank, want", [(32 << 10, 8), (64 << 10, 16), (128 << 10, 32), (1 << 20, 32)])
def test_all_gather_and_reduce_scatter_get_channels_by_nccls_bytes(per_rank, want):
    """NCCL counts nRanks x count bytes for all_gather and reduce_scatter when it picks and fills channels; the
    per-rank bytes gave up to nRanks x fewer (1 channel for 32 KiB per rank at 8 ranks, NCCL's 8)."""
    from slicetrace.backend.cuda.args import auto_channels
    n, count = 8, per_rank // 4
    for func, c in (("all_gather", count), ("reduce_scatter", count)):
        nch = auto_channels(c * 4 * n, 32)
        plan = plan_collective(func, n, 3, c, 4, 0, nch, 1 << 19)
        assert len(plan.programs) == want, (func, len(plan.programs))
    assert len(plan_collective("all_reduce", n, 3, count, 4, 0, auto_channels(count * 4, 32), 1 << 19).programs) \
        == max(1, min(32, per_rank // (32 << 10)))


def test_a_cached_plan_takes_keywords_and_one_op_is_one_entry_however_called():
    """The cache's wrapper took positional arguments only: plan_collective(..., root=0) raised TypeError."""
    pos = plan_collective("all_reduce", 2, 0, 100, 4, 0, 1, STEP)
    assert plan_collective("all_reduce", 2, 0, 100, 4, root=0, nchannels=1, step_bytes=STEP) is pos
