"""Host mirrors of the kernel structs (no GPU): offsets the kernel static_asserts, IPC layout."""
from __future__ import annotations

from slicetrace.backend.cuda.layout import ARGS_DTYPE, COMM_DTYPE, PART_DTYPE, ipc_layout, peer_slot


def test_struct_sizes():
    assert PART_DTYPE.itemsize == 32 and ARGS_DTYPE.itemsize == 2920 and COMM_DTYPE.itemsize == 592
    assert ARGS_DTYPE.fields["parts"][1] == 360 and ARGS_DTYPE.fields["op_tag"][1] == 88
    assert ARGS_DTYPE.fields["seq_base"][1] == 2408 and ARGS_DTYPE.fields["seq_n"][1] == 2664


def test_ipc_layout_and_slots():
    off, total = ipc_layout(4, 8, 1 << 22)
    assert off % 4096 == 0 and total == off + 8 * 3 * (1 << 22)
    for w in (2, 3, 8):
        for r in range(w):
            assert sorted(peer_slot(r, p, w) for p in range(w) if p != r) == list(range(w - 1))
