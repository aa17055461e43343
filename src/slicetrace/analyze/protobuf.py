"""The few protobuf wire pieces `slicetrace convert` writes (perfetto/trace/*.proto), by hand: scalar helpers, a
numpy encoder of many debug annotations at once, and a decoder for checking the output."""
from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import TraceFormatError

# field numbers of perfetto/trace/*.proto (google/perfetto protos/perfetto/trace/)
TRACE_PACKET = 1
P_TIMESTAMP, P_SEQ_ID, P_TRACK_EVENT, P_TRACK_DESCRIPTOR = 8, 10, 11, 60
TD_UUID, TD_NAME, TD_PROCESS, TD_PARENT = 1, 2, 3, 5
# track_event/track_descriptor.proto: ChildTracksOrdering child_ordering = 11 and int32 sibling_order_rank = 12
# (varints; also in Perfetto's generated include/perfetto/public/protos/trace/track_event/track_descriptor.pzc.h);
# ProcessOrdering process_ordering = 19 (varint), read on the root track (uuid 0) since v57.0 (CHANGELOG: "explicit
# thread and process ordering in track descriptors"); older readers skip it as an unknown field. All three checked
# against Perfetto's compiled protos in the `perfetto` 0.59.1 wheel (perfetto_trace_pb2.TrackDescriptor: 11 enum,
# 12 int32, 19 enum; PROCESS_ORDERING_EXPLICIT = 1; 18 (state) is the field below 19)
TD_CHILD_ORDERING, TD_SIBLING_ORDER_RANK, TD_PROCESS_ORDERING = 11, 12, 19
CHILD_EXPLICIT = 3                          # ChildTracksOrdering.EXPLICIT
PROCESS_ORDERING_EXPLICIT = 1               # ProcessOrdering.PROCESS_ORDERING_EXPLICIT
PD_PID, PD_NAME = 1, 6
PID_MAX = (1 << 31) - 1                     # ProcessDescriptor.pid is int32
TE_ANNOTATIONS, TE_TYPE, TE_TRACK, TE_CATEGORIES, TE_NAME, TE_FLOW, TE_FLOW_END = 4, 9, 11, 22, 23, 47, 48
DA_BOOL, DA_UINT, DA_INT, DA_DOUBLE, DA_STRING, DA_NAME = 2, 3, 4, 5, 6, 10
_M64 = (1 << 64) - 1
# most varints are lengths (packets of a few hundred bytes) and small values: looked up, no loop
_SMALL = [bytes([i]) for i in range(128)] + [bytes([i & 0x7F | 0x80, i >> 7]) for i in range(128, 1 << 14)]
_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)      # a uint64 varint has up to 10 groups of 7 bits
_COL10 = np.arange(10)
_LIMITS = np.array([1 << (7 * i) for i in range(1, 10)], np.uint64)    # a varint's length grows at each


def varint(n: int) -> bytes:
    if 0 <= n < 16384:
        return _SMALL[n]
    n &= _M64                   # negative int64s as two's complement, as protobuf does
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def pb_int(field: int, v: int) -> bytes:
    return varint(field << 3) + varint(v)


def pb_bytes(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def pb_str(field: int, text: str) -> bytes:
    return pb_bytes(field, text.encode())


def track_descriptor(uuid: int, name: str | None = None, parent: int | None = None,
                     process: tuple[int, str] | None = None, child_ordering: int | None = None,
                     order_rank: int | None = None, process_ordering: int | None = None) -> bytes:
    """A TracePacket's track_descriptor field. process: (pid, name); order_rank: sibling_order_rank (int32), read
    where the parent orders its children EXPLICIT (for process tracks: where the root track, uuid 0, has
    process_ordering EXPLICIT)."""
    for what, v, lo in (("pid", process and process[0], 1), ("sibling_order_rank", order_rank, 0)):
        if v is not None and not lo <= v <= PID_MAX:        # an int32 past its range reads back negative
            raise ValueError(f"TrackDescriptor {what}={v} is outside {lo}..{PID_MAX} (int32)")
    body = pb_int(TD_UUID, uuid)
    if parent is not None:
        body += pb_int(TD_PARENT, parent)
    if name is not None:
        body += pb_str(TD_NAME, name)
    if process is not None:
        body += pb_bytes(TD_PROCESS, pb_int(PD_PID, process[0]) + pb_str(PD_NAME, process[1]))
    for field, v in ((TD_CHILD_ORDERING, child_ordering), (TD_SIBLING_ORDER_RANK, order_rank),
                     (TD_PROCESS_ORDERING, process_ordering)):
        if v is not None:
            body += pb_int(field, v)
    return pb_bytes(P_TRACK_DESCRIPTOR, body)


def annotation(name: str, v: Any) -> bytes:
    if isinstance(v, bool):
        val = pb_int(DA_BOOL, int(v))
    elif isinstance(v, int) and -(1 << 63) <= v <= _M64:
        val = pb_int(DA_UINT if v >= 1 << 63 else DA_INT, v)       # e.g. a comm hash past int64
    elif isinstance(v, float):
        val = varint(DA_DOUBLE << 3 | 1) + struct.pack("<d", v)
    else:                       # also an int past 64 bits: no DebugAnnotation number holds it, its digits do
        val = pb_str(DA_STRING, str(v))
    return pb_bytes(TE_ANNOTATIONS, pb_str(DA_NAME, name) + val)


def fits_rows(names: tuple[str, ...]) -> bool:
    """annotation_rows writes each annotation's length as one byte: short names only."""
    return bool(names) and all(len(n.encode()) <= 100 for n in names)


def _varints(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of an int64 array as a (n, width) byte matrix and the mask of the bytes used (width: the longest)."""
    u = np.ascontiguousarray(vals, np.int64).view(np.uint64)
    n = 1 + np.searchsorted(_LIMITS, u, side="right")              # 1..10 bytes
    w = int(n.max()) if len(n) else 1
    used = _COL10[:w] < n[:, None]
    more = used[:, 1:].astype(np.uint8) << 7
    b = ((u[:, None] >> _SHIFTS[:w]) & np.uint64(0x7F)).astype(np.uint8)
    b[:, :-1] |= more
    return b, used


def _const(k: int, b: bytes) -> tuple[np.ndarray, np.ndarray]:
    return np.broadcast_to(np.frombuffer(b, np.uint8), (k, len(b))), np.ones((k, len(b)), bool)


def _rows(parts: list[tuple[np.ndarray, np.ndarray]]) -> list[bytes]:
    """Rows of bytes laid out as matrices with masks of the bytes used, read out row by row."""
    mask = np.hstack([m for _, m in parts])
    flat = np.hstack([b for b, _ in parts])[mask].tobytes()
    ends = np.cumsum(mask.sum(1)).tolist()
    return [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]


def annotation_rows(names: tuple[str, ...], vals: np.ndarray) -> list[bytes]:
    """b"".join(annotation(n, v) for n, v in zip(names, row)) for each row of an int64 matrix, in numpy."""
    k = len(vals)
    parts = []
    for j, name in enumerate(names):
        nb = name.encode()
        v, used = _varints(vals[:, j])
        head, every = _const(k, bytes([0x22, 0, 0x52, len(nb)]) + nb + bytes([DA_INT << 3]))
        head = head.copy()
        head[:, 1] = 3 + len(nb) + used.sum(1)                      # DebugAnnotation length: < 128, one byte
        parts += [(head, every), (v, used)]
    return _rows(parts)


def packet_heads(ts: np.ndarray, event_len: np.ndarray, seq: int) -> list[bytes]:
    """Each TracePacket's bytes up to its TrackEvent's payload: the packet's tag and length, its timestamp, the
    sequence id and the TrackEvent's tag and length (event_len), in numpy."""
    k = len(ts)
    t, t_used = _varints(ts)
    e, e_used = _varints(event_len)
    inner = 1 + t_used.sum(1) + 3 + e_used.sum(1) + event_len
    return _rows([_const(k, tag(TRACE_PACKET, 2)), _varints(inner), _const(k, tag(P_TIMESTAMP, 0)), (t, t_used),
                  _const(k, pb_int(P_SEQ_ID, seq) + tag(P_TRACK_EVENT, 2)), (e, e_used)])


def wire_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """One protobuf message's (field number, value): varints and fixed64 as int, length-delimited as bytes (for
    checking what convert wrote without Perfetto's own packages)."""
    out: list[tuple[int, int | bytes]] = []
    i = 0

    def read_varint() -> int:
        nonlocal i
        v = shift = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v
    while i < len(buf):
        key = read_varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            out.append((field, read_varint()))
        elif wire == 1:
            out.append((field, struct.unpack_from("<Q", buf, i)[0]))
            i += 8
        elif wire == 2:
            n = read_varint()
            out.append((field, buf[i:i + n]))
            i += n
        else:
            raise TraceFormatError(f"protobuf wire type {wire} at byte {i}: not one convert writes")
    return out
