"""What a plan moves: expected slices per connection and bytes per direction (used by tests and the analyzer)."""
from __future__ import annotations

from .schedule import OpPlan

BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
                "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0}


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of `op` (bench's op names) on n ranks: busbw = algbw x this. One copy for
    the bench and the inspector plugin."""
    return BUSBW_FACTOR[op](n)


def message_bytes(op: str, count: int, itemsize: int, n: int) -> int:
    """An op's message size as nccl-tests' `size` and NCCL's Inspector count it: count x element size, where for
    all_gather and reduce_scatter count is the per-rank one and the size the whole buffer (x n ranks)."""
    return count * itemsize * (n if op in ("all_gather", "reduce_scatter") else 1)


def expected_slices(plan: OpPlan) -> list[tuple[int, bool, int, int, int]]:
    """(channel, is_send, peer, slice index within the program, bytes) for every non-empty slice."""
    out = []
    for prog in plan.programs:
        k = 0
        for prim in prog.prims:
            for _, n in prim.slices:
                if n > 0:
                    if prim.recv_from is not None:
                        out.append((prog.channel, False, prim.recv_from, k, n * plan.itemsize))
                    if prim.send_to is not None:
                        out.append((prog.channel, True, prim.send_to, k, n * plan.itemsize))
                k += 1
    return out


def sampled_slices(prog, sample_rate: int):
    """Per non-empty slice of a program, in order: (elements, receives, sends, its index among the received slices,
    among the sent ones, received record kept, sent record kept). A direction keeps the slices whose index among
    its own (empty ones included) is a multiple of sample_rate: counted per direction, the k-th slice a rank sends
    on a connection is the k-th its peer receives, so both ends keep the same slices and a kept send meets its kept
    receive."""
    kr = ks = 0
    for prim in prog.prims:
        rv, sd = prim.recv_from is not None, prim.send_to is not None
        for _, n in prim.slices:
            if n > 0:
                yield n, rv, sd, kr, ks, rv and kr % sample_rate == 0, sd and ks % sample_rate == 0
            kr += rv
            ks += sd


def stamp_records(prog, sample_rate: int, steps: bool, channels: bool) -> tuple[int, int]:
    """(records, sampled out) a program writes: a KernelCh start and stop, then one record per direction of every
    slice sampled_slices keeps (stamps.layout, the kernel's order)."""
    recs, skipped = (2 if channels else 0), 0
    if steps:
        for _, rv, sd, _, _, keep_r, keep_s in sampled_slices(prog, sample_rate):
            recs += keep_r + keep_s
            skipped += rv + sd - keep_r - keep_s
    return recs, skipped


def bytes_per_direction(plan: OpPlan) -> tuple[int, int]:
    """(bytes sent, bytes received) by this rank."""
    sent = sum(b for _, s, _, _, b in expected_slices(plan) if s)
    recv = sum(b for _, s, _, _, b in expected_slices(plan) if not s)
    return sent, recv
