"""Backend ABC, the unit of work a backend runs, and the registry (import paths, loaded lazily).

A backend only executes plans and writes stamps (stamps.layout); it never imports events.
"""
from __future__ import annotations

import abc
import ctypes
import importlib
import json
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..config import Settings, job_attempt
from ..errors import ConfigError, UsageError, plural
from ..plan.schedule import OpPlan, P2pPart
from ..rendezvous import Store
from ..stamps.layout import RingViews
from .signals import quiet_thread  # noqa: F401 - the backends' import

REDOPS = ("sum", "prod", "min", "max", "avg")
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64", "bfloat16")

_CCHAR, _ADDRESSOF = ctypes.c_char.from_buffer, ctypes.addressof


def host_pointer(a: Any) -> int:
    """Address of a numpy array's (or a writable memoryview's) first byte. ctypes over its buffer takes ~0.2 us;
    `.ctypes.data` and `__array_interface__` build objects (~1 us), so read-only, empty or strided arrays only go
    that way."""
    try:
        return _ADDRESSOF(_CCHAR(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


class P2pLedger:
    """Messages this rank sent to and received from each peer, counted at submit, for backends whose FIFOs do not
    show an unreceived message at close (cuda: the next collective's step rounding skips past it). At close every
    rank publishes what it sent; after the close barrier each compares what its peers sent it with what it got:
    how many messages, and a running hash of their (count, dtype), which two ends that paired alike agree on."""

    def __init__(self) -> None:
        self.sent: dict[int, list[int]] = {}     # peer -> [messages, elements, hash, elements left in the message]
        self.got: dict[int, list[int]] = {}
        self.mismatched: list[str] = []          # filled by lost()

    def count(self, work: "Work", rank: int) -> None:
        wcode = DTYPES.index(work.dtype) if work.dtype in DTYPES else 99
        for part, _ in work.parts:               # a large message travels in pieces, one after the other
            if part.peer == rank:
                continue
            n, code, whole = part.hdr or (part.count, wcode, part.count if part.total < 0 else part.total)
            m = (self.sent if part.is_send else self.got).setdefault(part.peer, [0, 0, 0, 0])
            if m[3] == 0:                        # this piece starts a message
                m[0], m[2], m[3] = m[0] + 1, (m[2] * 1000003 + whole * 131 + code + 1) & _MASK64, whole
            m[1] += n
            m[3] = max(0, m[3] - n)

    def publish(self, store: Store, key: str, colls: int = 0) -> None:
        """What this rank sent, and how many collectives it ran (`colls`), once every op of its ended."""
        store.set(key, json.dumps({"sent": sorted((p, m[0], m[1], m[2]) for p, m in self.sent.items()),
                                   "got": sorted((p, m[0]) for p, m in self.got.items()), "colls": colls}).encode())

    def did_its_part(self, raw: bytes | None, rank: int, peer: int, colls: int) -> bool:
        """A closed peer's published ledger (raw) says it sent this rank every message this rank receives from it,
        took every message this rank sends it, and ran as many collectives: what this rank waits on is in its
        FIFOs or on its way."""
        if raw is None:
            return False
        pub = json.loads(raw)
        sent, got = {q: n for q, n, _, _ in pub["sent"]}, dict(pub["got"])
        return (sent.get(rank, 0) >= self.got.get(peer, [0])[0] and got.get(rank, 0) >= self.sent.get(peer, [0])[0]
                and pub["colls"] >= colls)

    def lost(self, store: Store, keys: dict[int, str], rank: int, timeout_s: float) -> list[str]:
        """keys: peer -> the key it published under (all published before the close barrier). Messages as many at
        both ends but of other sizes or types go to `mismatched`."""
        out = []
        for p in sorted(keys):
            raw = store.get(keys[p], timeout_s, what=f"rank {p}'s sends")
            sent = {q: (n, e, h) for q, n, e, h in json.loads(raw)["sent"]}
            n, e, h = sent.get(rank, (0, 0, 0))
            gn, ge, gh, _ = self.got.get(p, [0, 0, 0, 0])
            if n > gn:
                out.append(f"{n - gn} from rank {p} ({plural(e - ge, 'element')}: it sent {n}, this rank received "
                           f"{gn})")
            elif n == gn and h != gh:
                self.mismatched.append(f"point-to-point mismatch: the {n} message(s) rank {p} sent to rank {rank} "
                                       f"differ in count or dtype from the receives that took them "
                                       f"({plural(e, 'element')} sent, {ge} received)")
        return out


_MASK64 = (1 << 64) - 1


_REGISTRY = {
    "null": "slicetrace.backend.null:NullBackend",
    "cpu": "slicetrace.backend.cpu.backend:CpuBackend",
    "cuda": "slicetrace.backend.cuda.backend:CudaBackend",   # cupy is imported only there
}


@dataclass(slots=True)     # one per op: no __dict__ to make
class Work:
    """One operation as the backend sees it. Buffers are flat, contiguous, backend-native arrays."""
    tag: int                       # communicator op counter; written into every stamp (routes to the parent)
    plan: OpPlan
    dtype: str                     # one of DTYPES
    redop: str                     # one of REDOPS (collectives that reduce)
    sendbuf: Any = None            # collectives: input (may be the same memory as recvbuf: in place)
    recvbuf: Any = None            # collectives: output
    parts: Sequence[tuple[P2pPart, Any]] = ()   # send_recv: (part, buffer) in group order; the part's data
                                                # is buffer[part.offset:part.offset + part.count]
    stamp_steps: bool = False      # KernelStep on for this op (mask snapshot at enqueue)
    stamp_channels: bool = False   # KernelCh boundaries on (KernelCh or KernelStep in the mask)
    sample_rate: int = 1
    stream: Any = None             # cuda: the caller's stream
    seq_number: int = -1           # collectives: the SeqNum its trace shows (per function, from 0); errors name it


# backends made per (job, rank) in this process: keeps re-inits' store keys and traces apart, while ranks that are
# threads of one process (each its own rank) count alike
_GEN: dict[tuple[str, int], int] = {}


class Backend(abc.ABC):
    name: str = "?"
    synchronous: bool = False   # True: submit() runs the work to the end (the session then drains inline)
    reserves_stamps: bool = False   # True: header.reserved right after submit is exactly the end of the op's seqs
    stamps_fetched: bool = False    # True: `rings` holds an op's records once fetch_stamps brought them in
    n_warps: int = 1            # warps per channel program, as profiler descriptors report it (Coll nWarps)
    generation: int = 1         # this rank's communicators of this job made in this process (any backend), this one too
    pool = None                 # cpu: registered memory (cpu/pool.py), which ring ops move through directly

    def mem_alloc(self, shape: Any, dtype: Any, symmetric: bool = False) -> Any:
        if self.pool is None:
            raise UsageError(f"mem_alloc: the {self.name} backend has no registered memory (the cpu backend's "
                             f"SLICETRACE_CPU_POOL); allocate buffers as usual")
        return self.pool.alloc(shape, dtype, symmetric)

    def symmetric(self, func: str, send: Any, recv: Any) -> bool:
        """The op runs a symmetric kernel (plan/symmetric.py): its buffers are windows here (the cpu backend)."""
        return False

    def mem_free(self, arr: Any) -> None:
        if self.pool is None:
            raise UsageError(f"mem_free: the {self.name} backend has no registered memory")
        self.pool.release(arr)

    def __init__(self, settings: Settings, rank: int, world: int, store: Store, job: str):
        self.settings, self.rank, self.world, self.store, self.job = settings, rank, world, store, job
        self.generation = _GEN[job, rank] = _GEN.get((job, rank), 0) + 1

    @property
    @abc.abstractmethod
    def rings(self) -> RingViews:
        """Stamp rings of this rank (one header + started + completed ring per channel)."""

    @abc.abstractmethod
    def as_buffer(self, x: Any, what: str) -> tuple[Any, str, int]:
        """Validate a user array: (flat native view, dtype name, element count). UsageError if not accepted."""

    @abc.abstractmethod
    def empty_like(self, buf: Any, count: int) -> Any:
        """A new flat buffer of `count` elements of buf's dtype."""

    def user_buffer(self, buf: Any, like: Any = None) -> Any:
        """What an op that allocated `buf` (out=None) for input `like` hands the caller: the buffer itself, or the
        user-facing array behind a backend's own handle."""
        return buf

    # this backend's keys under key_prefix ({r}: one per rank), forgotten by the last rank to close (Session)
    STORE_KEYS: tuple[str, ...] = ()

    @property
    def key_prefix(self) -> str:
        """This communicator's keys in the store: the job's, and the backend's count of communicators of that job
        made in this process (a job made again must not meet its predecessor's keys)."""
        return getattr(self, "_prefix", None) or self.store_prefix("")

    def store_prefix(self, kind: str, gen: int | str = "") -> str:
        """torchrun's attempt first: a restart meets its agent's store again, where the failed attempt's keys of a
        job= string stayed (its ranks' slots read as taken)."""
        return f"st/{job_attempt()}{self.job}" + (f"/{kind}{gen}" if kind else "")

    def byte_view(self, buf: Any) -> Any:
        """buf's bytes, as a send/recv group of mixed dtypes moves them (offsets and counts in bytes)."""
        return buf.view(np.uint8)

    @abc.abstractmethod
    def submit(self, work: Work) -> Any:
        """Start the work; returns a completion token. The cpu backend runs it to the end before returning."""

    @abc.abstractmethod
    def done(self, token: Any) -> bool:
        """Non-blocking: has the work finished?"""

    @abc.abstractmethod
    def wait(self, token: Any, timeout_s: float) -> None:
        """Block until the work finished; PeerError/CommTimeoutError on failure."""

    def enter_call(self) -> Any:
        """At the start of each API operation, in the caller's thread; its result goes to exit_call."""
        return None

    def exit_call(self, token: Any) -> None:
        """At the end of each API operation (also when it raised)."""

    def describe(self) -> str:
        """Its set-up choices in a line, for SLICETRACE_DEBUG=INFO's init line (as NCCL_DEBUG=INFO prints its own)."""
        return ""

    def thread_init(self) -> None:
        """Run first in any thread the library starts that calls into this backend (the drain thread)."""
        quiet_thread()

    def fetch_stamps(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """stamps_fetched: bring seqs lo[c]+1..hi[c] of every channel c, all of completed ops, into `rings` (cuda:
        copy them from device memory; cpu: publish the staged records)."""
        raise NotImplementedError(f"backend {self.name!r} writes its stamp rings as it goes")

    def channels_for(self, nbytes: int) -> int:
        """Channels for an op of nbytes (settings.nchannels wins; backends may pick by size, as NCCL does)."""
        return self.settings.channels

    def p2p_channels(self) -> int:
        """Channels send/recv connections are spread over: the same on every rank, so both ends of a connection
        pick one channel whatever each rank's group holds (plan.schedule.p2p_channel)."""
        return self.settings.channels

    def clock_sync(self) -> tuple[int, int]:
        """(offset_ns, uncertainty_ns) with host_ns = device_ns + offset_ns. The cpu clock is the host clock."""
        return 0, 0

    def check_peers(self) -> None:
        """Raise (PeerError) if waiting for the peers is pointless: aborted, or a peer died or closed."""

    def unreceived(self) -> list[str]:
        """At close: messages peers sent to this rank that it never received (lost), described; [] if none."""
        return []

    @abc.abstractmethod
    def abort(self, reason: str) -> None:
        """Make every wait on every rank fail with `reason` (used when a peer dies or a rank errors)."""

    def keep_rings(self) -> None:
        """Before close, when a drain poll still runs: close must leave the stamp rings' memory to it (a leak, on
        this error path only). A no-op where the rings outlive the backend anyway (numpy, shared memory)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release shared memory / device memory. Idempotent."""


class HostBackend(Backend):
    """A backend whose buffers are host numpy arrays (cpu, null)."""

    def as_buffer(self, x: Any, what: str) -> tuple[Any, str, int]:
        return numpy_buffer(x, what, self.name)

    def empty_like(self, buf: Any, count: int) -> Any:
        return np.empty(count, dtype=buf.dtype)

    def user_buffer(self, buf: Any, like: Any = None) -> Any:
        return host_result(buf, like)


_DTYPE_NAMES: dict = {}


def dtype_name(dt: Any) -> str:
    """dt.name, cached per dtype for the supported ones (numpy computes the name on every access, ~3 us)."""
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = dt.name
        if name in DTYPES:
            _DTYPE_NAMES[dt] = name
    return name


_NATIVE: dict = {}      # supported dtypes in this machine's byte order -> name


def _checked_dtype(x: np.ndarray, what: str) -> str:
    name = dtype_name(x.dtype)
    if name not in DTYPES:
        raise UsageError(f"{what} dtype {name} is not one of {DTYPES}")
    if not x.dtype.isnative:                # the FIFOs carry native words: every rank must read them alike
        fix = (f"a native-order array (results are written into it; an astype copy would not get them), e.g. "
               f"np.empty({x.shape}, np.dtype({x.dtype.str!r}).newbyteorder('='))" if what.startswith("out")
               else f"{what}.astype({what}.dtype.newbyteorder('='))")
        raise UsageError(f"{what} dtype {x.dtype.str!r} is not in this machine's byte order; pass {fix}")
    _NATIVE[x.dtype] = name
    return name


def numpy_buffer(x: Any, what: str, backend: str) -> tuple[Any, str, int]:
    """as_buffer for host backends: a C-contiguous numpy array of a supported dtype -> (flat view, dtype, count)."""
    if not isinstance(x, np.ndarray):
        x = host_array(x, what, backend)
    name = _NATIVE.get(x.dtype)             # a dtype that passed both checks below
    if name is None:
        name = _checked_dtype(x, what)
    if not x.flags.c_contiguous:
        fix = ("a C-contiguous array (results are written into it: np.ascontiguousarray would be a copy)"
               if what.startswith("out") else f"np.ascontiguousarray({what})")
        raise UsageError(f"{what} must be C-contiguous (got strides {x.strides}); pass {fix}")
    if x.__class__ is not np.ndarray:       # a subclass (np.matrix stays 2-D when reshaped; memmap): a plain view
        if isinstance(x, np.ma.MaskedArray):    # its mask would be ignored: masked elements reduced like the others
            raise UsageError(f"{what} is a numpy.ma.MaskedArray, whose mask the collectives would ignore; pass "
                             f"{what}.filled(fill_value) or {what}.data")
        x = x.view(np.ndarray)
    return x.ravel(), name, x.size            # C-contiguous: a flat view (reshape(-1) costs twice as much)


def _is_torch(x: Any) -> bool:
    """x is a torch.Tensor (a subclass too; torch.Size and the like are not)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, getattr(torch, "Tensor", ()))


def refuse_lazy_torch_bits(x: Any, what: str) -> None:
    """A torch view with its negative (or conjugate) bit set keeps the values un-negated in memory, which a
    collective would read: the result was silently wrong (torch._neg_view, x.conj() of a complex result)."""
    for bit, fix in (("is_neg", "resolve_neg"), ("is_conj", "resolve_conj")):
        test = getattr(x, bit, None)
        if test is not None and test():
            raise UsageError(f"{what} is a torch view with its {bit[3:]} bit set (its memory holds the values "
                             f"before that operation); pass {what}.{fix}()")


def host_array(x: Any, what: str, backend: str) -> np.ndarray:
    """A torch CPU tensor, or any array with __dlpack__ in host memory, as a numpy view of its memory (results
    written into the view land in x). torch bfloat16 goes through its bits (numpy has no bfloat16 of its own)."""
    if _is_torch(x):
        torch = sys.modules["torch"]
        if x.requires_grad:
            raise UsageError(f"{what} is a torch tensor that requires grad; pass {what}.detach() (the collectives "
                             f"write outside autograd)")
        if x.device.type != "cpu":
            raise UsageError(f"{what} is a torch tensor on {x.device}; backend={backend!r} takes CPU tensors or "
                             f"numpy arrays (backend='cuda' takes CUDA tensors)")
        if x.layout != torch.strided:
            raise UsageError(f"{what} is a torch tensor of layout {x.layout}; pass {what}.to_dense()")
        refuse_lazy_torch_bits(x, what)
        name = str(x.dtype).replace("torch.", "")
        if name not in DTYPES:
            raise UsageError(f"{what} dtype {name} is not one of {DTYPES}")
        if not x.is_contiguous():
            raise UsageError(f"{what} is a non-contiguous torch tensor (strides {tuple(x.stride())}); pass "
                             f"{what}.contiguous() (an output, or x in place: then copy the results back from it)")
        if name == "bfloat16":
            try:
                import ml_dtypes
            except ImportError:
                raise UsageError(f"{what} is a torch bfloat16 tensor; backend={backend!r} needs the ml_dtypes "
                                 f"package for bfloat16 (pip install ml_dtypes)") from None
            return np.from_dlpack(x.view(torch.int16)).view(ml_dtypes.bfloat16)
    elif not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        raise UsageError(f"{what} must be a numpy.ndarray, a torch CPU tensor or a host array with __dlpack__ for "
                         f"backend={backend!r}, got {type(x).__module__}.{type(x).__name__}")
    else:
        dev = x.__dlpack_device__()[0]
        if int(dev) not in (1, 3):              # kDLCPU, kDLCUDAHost
            raise UsageError(f"{what} lives on DLPack device type {int(dev)}, not in host memory; "
                             f"backend={backend!r} takes host arrays")
    try:
        return np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise UsageError(f"{what} ({type(x).__name__}) cannot be shared with numpy through DLPack: {e}") from None


def host_result(buf: np.ndarray, like: Any) -> Any:
    """An allocated output as the caller gets it: a torch tensor over the same memory when x was one."""
    if not _is_torch(like):
        return buf
    import torch
    if buf.dtype.name == "bfloat16":
        return torch.from_numpy(buf.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(buf)


def create(settings: Settings, rank: int, world: int, store: Store, job: str) -> Backend:
    try:
        module, cls = _REGISTRY[settings.backend].split(":")
    except KeyError:
        raise ConfigError(f"backend={settings.backend!r} is not one of {sorted(_REGISTRY)}") from None
    return getattr(importlib.import_module(module), cls)(settings, rank, world, store, job)


def part_views(parts: Sequence[tuple[P2pPart, Any]]) -> list[tuple[P2pPart, Any]]:
    """(part, the part's own elements) for host-array backends: pieces of one split buffer become views."""
    return [(p, b if p.offset == 0 and b.size == p.count else b[p.offset:p.offset + p.count]) for p, b in parts]
