"""User arrays -> flat device views without copies: CuPy arrays, torch CUDA tensors and anything with
__dlpack__ on a CUDA device. bfloat16 works through torch even where CuPy has no bfloat16 dtype: the
buffer is then a RawBuf (pointer, count, dtype name) that keeps the tensor alive."""
from __future__ import annotations

import ctypes

import sys
from typing import Any

from ...backend.base import DTYPES, dtype_name, refuse_lazy_torch_bits
from ...errors import UsageError
from .layout import ITEMSIZE

_KDLCUDA = (2, 13)          # DLPack device types kDLCUDA, kDLCUDAManaged


class RawBuf:
    """A flat device buffer known only by pointer (bfloat16 without CuPy support)."""

    def __init__(self, ptr: int, count: int, dtype: str, owner: Any = None):
        self.ptr, self.count, self.dtype_name, self.owner = int(ptr), int(count), dtype, owner
        self.itemsize = ITEMSIZE[dtype]
        self.size = self.count

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, s: slice) -> "RawBuf":
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise UsageError(f"RawBuf supports contiguous slices only, got {s!r}")
        lo, hi, _ = s.indices(self.count)
        return RawBuf(self.ptr + lo * self.itemsize, max(0, hi - lo), self.dtype_name, self.owner)

    def reshape(self, *shape: Any) -> Any:
        o = self.owner
        if o is not None and hasattr(o, "reshape") and getattr(o, "numel", lambda: -1)() == self.count:
            return o.reshape(*shape)
        return self


def stream_ptr(s: Any, device: int) -> int:
    """The cudaStream_t an op runs on: `stream=` (a CuPy or torch stream, or an int), else CuPy's current stream if
    the caller chose one, else torch's where torch is in use (under `torch.cuda.stream(s)` a torch user means s,
    a non-blocking stream that would not wait for the default one)."""
    if s is None:
        ptr = sys.modules["cupy"].cuda.get_current_stream().ptr      # imported by the backend (an import: ~1 us)
        torch = sys.modules.get("torch")
        if ptr or torch is None or not hasattr(torch, "cuda") or not torch.cuda.is_initialized():
            return ptr
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)     # ~10x faster than current_stream()
        return int(raw(device)) if raw is not None else torch.cuda.current_stream(device).cuda_stream
    if isinstance(s, int):
        return s
    for attr in ("ptr", "cuda_stream"):
        if hasattr(s, attr):
            return int(getattr(s, attr))
    raise UsageError(f"stream={s!r} is not a CuPy stream, a torch stream or a cudaStream_t int")


def refuse_capture(rt: Any, stream: int) -> None:
    """A CUDA graph would replay the launch with the stamp seqs and FIFO steps of its capture: refused, before
    anything is enqueued (and the capture stays valid: the query is capture-safe)."""
    query = getattr(rt, "streamIsCapturing", None)
    if query is None:
        return
    try:
        capturing = query(stream) != 0
    except rt.CUDARuntimeError:     # the legacy stream while a blocking stream captures: unusable for us too
        capturing = True
    if capturing:
        raise UsageError(f"stream {stream:#x} is capturing a CUDA graph: slicetrace ops cannot be captured (a replay "
                         f"would reuse the capture's FIFO steps and stamp seqs); run them outside the capture")


_THREAD_LOCAL = 1          # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


def capture_mode_thread_local() -> bool:
    """For our own threads (drain, watchdog), which never capture: their event and stream queries must not
    invalidate a CUDA graph another thread captures in global mode (torch.cuda.graph's default), which they did
    in PyTorch's NCCL watchdog too. The mode is the driver's, per thread. False if the driver has no such call."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        mode = ctypes.c_int(_THREAD_LOCAL)
        return lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    except (OSError, AttributeError):
        return False


def pointer(buf: Any) -> int:
    return buf.ptr if isinstance(buf, RawBuf) else int(buf.data.ptr)


def nbytes(buf: Any) -> int:
    return int(buf.nbytes)


def self_copies(parts: Any, pairs: Any, item: int) -> list[tuple[int, int, int]]:
    """(bytes, source pointer, destination pointer) of a group's sends to self into their receives from self
    (NCCL's self copy; `pairs` from the plan, which checked them); empty ones are left out."""
    out = []
    for i, j in pairs:
        (s, sb), (r, rb) = parts[i], parts[j]
        if s.count:
            out.append((s.count * item, pointer(sb) + s.offset * item, pointer(rb) + r.offset * item))
    return out


def _torch_buffer(x: Any, what: str, device: int) -> tuple[Any, str, int]:
    import cupy
    if not x.is_cuda:
        raise UsageError(f"{what} is a torch tensor on {x.device}; the cuda backend takes CUDA tensors")
    if x.device.index != device:
        raise UsageError(f"{what} is on cuda:{x.device.index}, this rank uses cuda:{device}")
    if not x.is_contiguous():
        raise UsageError(f"{what} is not contiguous; pass x.contiguous()")
    refuse_lazy_torch_bits(x, what)
    name = str(x.dtype).replace("torch.", "")
    if name not in DTYPES:
        raise UsageError(f"{what} has dtype {name}; accepted: {DTYPES}")
    _refuse_misaligned(x.data_ptr(), x.element_size(), what, "x.clone()")
    if name == "bfloat16" and not hasattr(cupy, "bfloat16"):
        return RawBuf(x.data_ptr(), x.numel(), name, owner=x), name, x.numel()
    arr = cupy.from_dlpack(x)
    return arr.ravel(), name, arr.size


def as_buffer(x: Any, what: str, device: int) -> tuple[Any, str, int]:
    import cupy
    if isinstance(x, RawBuf):
        return x, x.dtype_name, x.count
    if type(x).__module__.startswith("torch"):
        return _torch_buffer(x, what, device)
    if isinstance(x, cupy.ndarray):
        arr = x
    elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        dev_type = int(x.__dlpack_device__()[0])
        if dev_type not in _KDLCUDA:
            raise UsageError(f"{what} lives in host memory (DLPack device type {dev_type}); the cuda backend "
                             f"takes CuPy arrays or torch CUDA tensors")
        arr = cupy.from_dlpack(x)
    else:
        raise UsageError(f"{what} is a {type(x).__module__}.{type(x).__name__}, a host array; the cuda backend "
                         f"takes CuPy arrays or torch CUDA tensors (DLPack)")
    if arr.data.device_id != device:
        raise UsageError(f"{what} is on cuda:{arr.data.device_id}, this rank uses cuda:{device}")
    if not arr.flags.c_contiguous:
        raise UsageError(f"{what} is not contiguous; pass cupy.ascontiguousarray(x)")
    name = dtype_name(arr.dtype)
    if name not in DTYPES:
        raise UsageError(f"{what} has dtype {name}; accepted: {DTYPES}")
    _refuse_misaligned(arr.data.ptr, arr.itemsize, what, "cupy.array(x)")
    return (arr if arr.ndim == 1 else arr.ravel()), name, int(arr.size)


def _refuse_misaligned(ptr: int, itemsize: int, what: str, copy: str) -> None:
    if ptr % itemsize:                      # the kernels load whole elements: a misaligned one faults the context
        raise UsageError(f"{what} starts at address {ptr:#x}, not a multiple of its itemsize {itemsize}; pass an "
                         f"aligned copy ({copy})")


def user_buffer(buf: Any) -> Any:
    """An allocated output for the caller: the torch tensor behind a RawBuf (bfloat16 without CuPy bfloat16)."""
    if isinstance(buf, RawBuf) and type(buf.owner).__module__.startswith("torch"):
        return buf.owner
    return buf


def empty_like(buf: Any, count: int) -> Any:
    import cupy
    if isinstance(buf, RawBuf):
        o = buf.owner
        if o is not None and type(o).__module__.startswith("torch"):
            import torch
            t = torch.empty(count, dtype=o.dtype, device=o.device)
            return RawBuf(t.data_ptr(), count, buf.dtype_name, owner=t)
        a = cupy.empty(count, dtype=cupy.uint16)
        return RawBuf(a.data.ptr, count, buf.dtype_name, owner=a)
    return cupy.empty(count, dtype=buf.dtype)


def enqueue_self_copies(rt: Any, work: Any, stream: int, beside: bool, side: int, fork: int, join: int) -> bool:
    """Sends to self matched with recvs from self, as device copies. Beside a kernel and from 1 MiB, on `side`
    forked from and joined back into `stream` (an all_to_all's own block then overlaps its transfers, as NCCL's
    in-kernel self copy does); True when the caller must join (wait on `join`) after its launch."""
    copies = self_copies(work.parts, work.plan.self_pairs, work.plan.itemsize)
    total = sum(n for n, _, _ in copies)
    if not total:
        return False
    forked = beside and total >= 1 << 20
    if forked:
        rt.eventRecord(fork, stream)
        rt.streamWaitEvent(side, fork, 0)
    for n, src, dst in copies:
        rt.memcpyAsync(dst, src, n, 3, side if forked else stream)
    if forked:
        rt.eventRecord(join, side)
    return forked


def local_copy(rt: Any, work: Any, stream: int) -> None:
    """Single-rank collectives (no programs): the result is the input."""
    plan = work.plan
    n = plan.count * plan.itemsize
    if plan.nranks == 1 and n and work.sendbuf is not None and work.recvbuf is not None:
        src, dst = pointer(work.sendbuf), pointer(work.recvbuf)
        if src != dst:
            rt.memcpyAsync(dst, src, n, 3, stream)
