"""backend.base helpers shared by the backends and the API."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from slicetrace.api_checks import ptr as _ptr
from slicetrace.backend.base import host_pointer, numpy_buffer
from slicetrace.errors import UsageError

_BYTES = b"abcdefgh" * 8


def _c_buffer(nbytes: int):
    """Memory whose address ctypes tells us (not numpy): the arrays below are views into it."""
    buf = (ctypes.c_char * nbytes)()
    return buf, ctypes.addressof(buf)


def _plain():
    buf, addr = _c_buffer(4000)
    return np.frombuffer(buf, np.float32), addr, buf


def _offset():
    buf, addr = _c_buffer(1000)
    return np.frombuffer(buf, np.int8)[7:], addr + 7, buf


def _empty():
    buf, addr = _c_buffer(80)
    a = np.frombuffer(buf, np.float64)[4:4]          # no element: numpy may place it anywhere in its base
    want = a.__array_interface__["data"][0]
    assert addr <= want <= addr + 80
    return a, want, buf


def _strided():
    buf, addr = _c_buffer(8000)
    return np.frombuffer(buf, np.int64)[5::3], addr + 5 * 8, buf


def _readonly():
    a = np.frombuffer(_BYTES, np.uint8)[3:]                                  # bytes: read-only
    return a, ctypes.cast(ctypes.c_char_p(_BYTES), ctypes.c_void_p).value + 3, _BYTES


def _readonly_flag():
    buf, addr = _c_buffer(64)
    a = np.frombuffer(buf, np.uint8)[9:]
    a.setflags(write=False)
    return a, addr + 9, buf


@pytest.mark.parametrize("make", [_plain, _offset, _empty, _strided, _readonly, _readonly_flag],
                         ids=["plain", "offset", "empty", "strided", "readonly", "readonly-flag"])
def test_host_pointer_is_the_address_of_the_first_element_for_any_numpy_array(make):
    """The address is checked against ctypes' own for the memory under the array (base + byte offset), so the
    fallback paths (empty, strided, read-only arrays cannot be wrapped by ctypes) are checked too."""
    a, want, keep = make()
    assert host_pointer(a) == want
    assert _ptr(a) == want
    assert a.base is not None and keep is not None


def test_views_of_one_buffer_differ_by_their_byte_offsets():
    buf, addr = _c_buffer(4096)
    whole = np.frombuffer(buf, np.int32)
    assert host_pointer(whole) == addr
    assert host_pointer(whole[3:]) - host_pointer(whole) == 12
    assert host_pointer(whole[10::2]) - host_pointer(whole) == 40           # strided: the fallback path
    ro = whole[7:]
    ro.setflags(write=False)
    assert host_pointer(ro) - host_pointer(whole) == 28                     # read-only: the fallback path


def test_host_buffers_are_checked_per_array_whatever_passed_before():
    """Dtypes that passed are remembered: a byte-swapped or unsupported one of the same kind is still refused, and
    the flat view is a view of the array's own memory, not the array or a copy."""
    for _ in range(2):
        x = np.arange(6, dtype="=f4").reshape(2, 3)
        flat, name, n = numpy_buffer(x, "x", "cpu")
        assert (name, n, flat.shape) == ("float32", 6, (6,)) and flat is not x and np.shares_memory(flat, x)
        for bad, msg in ((np.ones(4, ">f4" if np.little_endian else "<f4"), "is not in this machine's byte order"),
                         (np.ones(4, np.complex64), "dtype complex64 is not one of"),
                         (np.ones((4, 4), np.float32)[:, 1], "must be C-contiguous")):
            with pytest.raises(UsageError, match=msg):
                numpy_buffer(bad, "x", "cpu")


def test_p2p_ledger_finds_the_messages_a_peer_sent_that_were_never_received():
    """Three ranks' ledgers through one store: rank 0 sends rank 1 two messages (the second cut into two pieces, as
    split_p2p cuts a large message over two channels) and rank 2 one; rank 1 receives only the first. Pieces used to
    count as messages: 'it sent 3'."""
    from types import SimpleNamespace

    from slicetrace.backend.base import P2pLedger
    from slicetrace.plan.schedule import P2pPart
    from slicetrace.rendezvous import DictStore

    def work(*parts, dtype="float32"):
        return SimpleNamespace(parts=[(p, None) for p in parts], dtype=dtype)

    books = [P2pLedger() for _ in range(3)]
    books[0].count(work(P2pPart(1, True, 10, 0), P2pPart(0, True, 4, 1), P2pPart(0, False, 4, 2)), 0)  # a self pair
    books[0].count(work(P2pPart(1, True, 6, 0, 0, 12), P2pPart(1, True, 6, 1, 6, 12), P2pPart(2, True, 3, 2)), 0)
    books[1].count(work(P2pPart(0, False, 10, 0)), 1)
    books[2].count(work(P2pPart(0, False, 3, 0)), 2)
    assert {p: m[:2] for p, m in books[0].sent.items()} == {1: [2, 22], 2: [1, 3]} and books[0].got == {}
    store = DictStore({})
    keys = {r: f"sent/{r}" for r in range(3)}
    for r, b in enumerate(books):
        b.publish(store, keys[r])
    lost = [b.lost(store, {p: k for p, k in keys.items() if p != r}, r, 1.0) for r, b in enumerate(books)]
    assert lost == [[], ["1 from rank 0 (12 elements: it sent 2, this rank received 1)"], []]
    assert all(b.mismatched == [] for b in books)


@pytest.mark.parametrize("recv", [dict(count=12, dtype="float32"), dict(count=10, dtype="int32")])
def test_p2p_ledger_finds_messages_received_with_another_count_or_dtype(recv):
    """cuda steps carry no header: a receive of another size or type took the data silently; the ledger's running
    hash of (count, dtype) per pair now tells at close (as many messages at both ends, not the same ones)."""
    from types import SimpleNamespace

    from slicetrace.backend.base import P2pLedger
    from slicetrace.plan.schedule import P2pPart
    from slicetrace.rendezvous import DictStore
    a, b = P2pLedger(), P2pLedger()
    a.count(SimpleNamespace(parts=[(P2pPart(1, True, 10, 0), None)], dtype="float32"), 0)
    b.count(SimpleNamespace(parts=[(P2pPart(0, False, recv["count"], 0), None)], dtype=recv["dtype"]), 1)
    store = DictStore({})
    a.publish(store, "sent/0")
    assert b.lost(store, {0: "sent/0"}, 1, 1.0) == []
    assert len(b.mismatched) == 1 and "the 1 message(s) rank 0 sent to rank 1 differ in count or dtype" in \
        b.mismatched[0]


def test_pointer_of_device_buffers_by_each_protocol():
    """A torch tensor's data_ptr() was read as `dataptr()` and the cuda backend's RawBuf (bfloat16 tensors where
    CuPy has none) had no branch: both read as address 0, so every group of them looked overlapping."""
    from types import SimpleNamespace
    from slicetrace.api_checks import check_group_overlap
    from slicetrace.backend.cuda.buffers import RawBuf
    from slicetrace.plan.schedule import P2pPart

    class Torchish:
        def __init__(self, p):
            self.p = p

        def data_ptr(self):
            return self.p
    assert _ptr(SimpleNamespace(data=SimpleNamespace(ptr=4096))) == 4096          # CuPy
    assert _ptr(Torchish(8192)) == 8192
    assert _ptr(RawBuf(12288, 10, "bfloat16")) == 12288
    assert _ptr(object()) == 0
    a, b = RawBuf(1 << 20, 100, "bfloat16"), RawBuf(2 << 20, 100, "bfloat16")    # separate: accepted
    check_group_overlap([(P2pPart(0, True, 100, 0), a, "bfloat16", 0), (P2pPart(1, False, 100, 0), b, "bfloat16", 0),
                         (P2pPart(1, False, 100, 0), object(), "bfloat16", 0)], 2)   # unknown address: not checked
    same = [(P2pPart(0, True, 100, 0), a, "bfloat16", 0), (P2pPart(1, False, 100, 0), a, "bfloat16", 0)]
    with pytest.raises(UsageError, match=r"recv\(peer=1\) overlaps that of send\(peer=0\)"):
        check_group_overlap(same, 2)


def test_a_closed_peer_did_its_part_when_it_sent_all_asked_of_it_and_ran_every_collective():
    """cuda's watchdog took any closed peer as 'cannot finish' (a receive queued behind long work was aborted)."""
    from types import SimpleNamespace

    from slicetrace.backend.base import P2pLedger
    from slicetrace.plan.schedule import P2pPart
    from slicetrace.rendezvous import DictStore
    sender, receiver, store = P2pLedger(), P2pLedger(), DictStore({})
    sender.count(SimpleNamespace(parts=[(P2pPart(1, True, 10, 0), None)], dtype="float32"), 0)
    sender.publish(store, "sent/0", colls=3)
    raw = store.try_get("sent/0")
    receiver.count(SimpleNamespace(parts=[(P2pPart(0, False, 10, 0), None)], dtype="float32"), 1)
    assert receiver.did_its_part(raw, 1, 0, colls=3)
    assert not receiver.did_its_part(raw, 1, 0, colls=4)            # a collective it never ran
    receiver.count(SimpleNamespace(parts=[(P2pPart(0, False, 10, 0), None)], dtype="float32"), 1)
    assert not receiver.did_its_part(raw, 1, 0, colls=3)            # a second receive it never sent for
    assert not receiver.did_its_part(None, 1, 0, colls=0)           # closed without publishing (it failed)


def test_a_closed_peer_that_never_took_our_send_did_not_do_its_part():
    """A rank that closed without receiving: the sender's op still waits on it (the watchdog must abort it)."""
    from types import SimpleNamespace

    from slicetrace.backend.base import P2pLedger
    from slicetrace.plan.schedule import P2pPart
    from slicetrace.rendezvous import DictStore
    sender, closer, store = P2pLedger(), P2pLedger(), DictStore({})
    sender.count(SimpleNamespace(parts=[(P2pPart(1, True, 10, 0), None)], dtype="float32"), 0)
    closer.publish(store, "sent/1")
    assert not sender.did_its_part(store.try_get("sent/1"), 0, 1, colls=0)
    closer.count(SimpleNamespace(parts=[(P2pPart(0, False, 10, 0), None)], dtype="float32"), 1)
    closer.publish(store, "sent/1")
    assert sender.did_its_part(store.try_get("sent/1"), 0, 1, colls=0)
