"""The Communicator: validate -> plan -> session.run. One per rank process (see slicetrace.init / launch)."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Iterator

from .api_checks import (GROUPED, a2a_counts, as_index, check_overlap, comm_named, group_opened, int_index,
                         no_stream_on_cpu, outside_groups, ptr, redop_name, tag_value, told, writable)
from .api_p2p import a2a_mismatch, run_group
from .api_profiling import ProfilingControls
from .backend.base import REDOPS, Work
from .config import Settings
from .errors import MismatchError, PeerError, SliceTraceError, UsageError, plural
from .events.abi import DATATYPE_NAMES, FUNC_NAMES
from .events.host import OpInfo, TaskInfo
from .plan.schedule import P2pPart, plan_collective
from .plan.symmetric import plan_symmetric
from .plan.traffic import message_bytes
from .rendezvous import Store
from .session import Session

log = logging.getLogger("slicetrace")


class Communicator(ProfilingControls):
    """NCCL-like collectives over `world_size` ranks. Buffers: host arrays (cpu) or CUDA arrays (cuda), see README.
    Profiling controls (profiling, flush_profiler, drop_counters, ...): api_profiling.ProfilingControls."""

    def __init__(self, settings: Settings, rank: int, world_size: int, store: Store, job: str, name: str = ""):
        # public: made directly, a dict of settings or a float rank failed deep inside (or ran with rank 0.0)
        if not isinstance(settings, Settings):
            raise UsageError(f"settings={settings!r} (type {type(settings).__name__}) must be a slicetrace.Settings")
        world = as_index(world_size)
        if world is None or world < 1:
            raise UsageError(f"world_size={world_size!r} (type {type(world_size).__name__}) must be an int >= 1")
        world_size, rank = world, int_index(rank, "rank", world, f" (world_size={world})")
        if not isinstance(store, Store):
            raise UsageError(f"store={store!r} (type {type(store).__name__}) must be a slicetrace.rendezvous.Store")
        if not isinstance(name, str):
            raise UsageError(f"name={name!r} must be a str (the communicator's name in traces and metrics)")
        self._settings, self._rank, self._world = settings, rank, world_size
        self._step_bytes = settings.step_bytes      # a property of frozen settings: computed once, not per op
        self._tag, self._seq = 0, {}    # the last op's tag; per-function op counters (_next_seq)
        self._group: list[tuple[P2pPart, Any, str, int]] | None = None
        self._group_depth = self._group_max = self._run_depth = 0    # user group nesting: now, deepest, at run
        self._group_owner = 0                                           # the thread that opened the group
        # a group's opening, and a call joining it: one thread at a time; re-entrant, as a signal handler's send in
        # this thread while it holds the lock waited on itself for good (one from another op says so, _enter)
        self._group_lock = threading.RLock()
        self._p2p_plans: dict[tuple, tuple] = {}
        self._p2p_pos: dict[tuple[int, bool], int] = {}   # (peer, is_send) -> its pieces so far, mod p2p_channels
        self._stream: Any = None        # cuda: None = the current stream at each call
        self._closed = False
        self._busy = threading.Lock()   # one op at a time: a second thread gets an error, not a corrupted step count
        self._closing = threading.Lock()    # one closer; a second close returns
        self._active = 0                    # thread inside an op's try (0: none), see close()
        # last: an interrupt in a statement after it dropped a made session, whose plugins were never finalized
        self._session = Session(settings, rank, world_size, store, job, name)

    # read-only: the FIFOs, plans and peers were set up for these (an assignment would aim ops at wrong peers)
    rank = property(lambda self: self._rank, doc="this rank, 0..world_size - 1")
    world_size = property(lambda self: self._world, doc="the number of ranks")
    settings = property(lambda self: self._settings, doc="the Settings it was made with (frozen)")
    backend_name = property(lambda self: self._settings.backend, doc="'cpu', 'cuda' or 'null'")
    comm_hash = property(lambda self: self._session.comm_hash, doc="NCCL's commHash of this communicator")
    name = property(lambda self: self._session.name, doc="its name in traces and errors (init(name=...))")

    # ---- helpers ----
    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("communicator is closed")
        if self._session.forked:        # its FIFOs and peers are its parent's: both would get wrong results
            raise UsageError(f"this communicator was made in process {self._session._pid}; a forked child cannot "
                             f"use it (make one of its own, e.g. with slicetrace.launch())")

    def _buf(self, x: Any, what: str):
        return self._session.backend.as_buffer(x, what)

    def _out(self, out: Any, like: Any, dtype: str, count: int, what: str = "out", why: str = ""):
        if out is None:
            try:
                return None, self._session.backend.empty_like(like, count)
            except (ValueError, MemoryError) as e:      # a count from the caller (recv_counts) past memory
                raise UsageError(f"the output of {plural(count, 'element')}{why} cannot be allocated: {e}") from None
        flat, dt, n = self._buf(out, what)
        writable(flat, what)                # the view: a DLPack array shows read-only there only
        if dt != dtype:
            raise UsageError(f"{what} dtype {dt} differs from the input dtype {dtype}")
        if n != count:
            raise UsageError(f"{what} has {plural(n, 'element')}, this operation needs {count}{why}")
        return out, flat

    def _info(self, func: str, tasks: list, user_tag: int, mask: int, seq: int, stream: Any = None) -> OpInfo | None:
        if not mask:
            return None
        # tag, func, tasks, seq_number, user_tag, mask, ts_ns, n_warps, stream, group_depth (1: implicit), by
        # position: keywords cost ~2x (events.ops checks the order)
        return OpInfo(self._tag, func, tasks, seq, user_tag, mask, time.monotonic_ns(), self._session.backend.n_warps,
                      stream, 1 + max(self._group_depth, self._run_depth))

    def _next_seq(self, func: str) -> int:
        """Per-function op counter of this communicator; every op counts, profiled or not (NCCL's seqNumber)."""
        seq = self._seq[func] = self._seq.get(func, -1) + 1
        return seq

    def _enter(self, func: str) -> None:
        if not self._busy.acquire(blocking=False):
            self._check_open()
            if self._closing.locked() and not self._active:     # held by a close() in another thread
                raise UsageError("communicator is closed")
            if self._active == threading.get_ident():
                raise UsageError(f"{func}: this thread is inside an operation of this communicator already (from a "
                                 f"plugin callback or a signal handler?); an op cannot start inside another")
            raise UsageError(f"{func}: another thread is inside an operation of this communicator; issue one "
                             f"communicator's operations from one thread at a time (as NCCL requires)")

    def _on_device(self, fn, *args: Any) -> Any:
        """fn(*args) on the communicator's device whatever the thread's (a plain call: a `with` costs ~1 us/op)."""
        be = self._session.backend
        dev = be.enter_call()
        try:
            return fn(*args)
        except (PeerError, MismatchError) as e:    # between ranks: which communicator; its plugins hear of it
            told(comm_named(e, self._session), self._session)
            raise
        finally:
            be.exit_call(dev)

    def _guarded(self, what: str, fn, *args: Any) -> Any:
        """fn(*args) as one operation: one thread at a time (_enter), on the backend's device."""
        self._enter(what)
        try:
            self._active = threading.get_ident()
            self._check_open()          # a close() from another thread may have won the race to the lock
            return self._on_device(fn, *args)
        finally:
            self._active = 0
            self._busy.release()

    def _collective(self, func: str, *args: Any) -> Any:
        return self._guarded(func, self._collective_one, func, *args)

    def _collective_one(self, func: str, x: Any, out: Any, out_count_of, op: str = "sum", root: int = 0,
                        user_tag: int = 0, stream: Any = None) -> Any:
        outside_groups(self, func)
        if self._group is not None:
            raise UsageError(f"{func} inside comm.group(): {GROUPED}")
        sess = self._session
        be = sess.backend
        send, dtype, n = be.as_buffer(x, "x")
        redop = op if op.__class__ is str and op in REDOPS else redop_name(op)    # checks' fast paths inline
        if root.__class__ is not int or not 0 <= root < self._world:
            root = int_index(root, "root", self._world)
        count, out_n = out_count_of(n)
        user_out, recv = self._out(out, send, dtype, out_n)
        if user_out is not None:
            check_overlap(func, send, recv, count, self._rank)
        user_tag = tag_value(user_tag)
        if stream is not None:
            no_stream_on_cpu(func, stream, self._settings.backend)
        self._tag += 1
        itemsize = send.itemsize
        nch = be.channels_for(message_bytes(func, count, itemsize, self._world))     # NCCL's, by bytes
        if be.symmetric(func, send, recv):
            plan = plan_symmetric(func, self._world, self._rank, count, itemsize, nch, self._step_bytes)
        else:
            plan = plan_collective(func, self._world, self._rank, count, itemsize, root, nch, self._step_bytes)
        mask = sess.op_mask_for(count * itemsize) if sess.host is not None else 0    # no plugin: nothing to count
        seq = self._seq[func] = self._seq.get(func, -1) + 1     # _next_seq, inline
        info = None
        if mask:                    # events only when a plugin listens: nothing to build otherwise
            # func, peer, is_send, count, datatype, root, send_buff, recv_buff, n_programs (keywords cost 2x)
            task = TaskInfo(FUNC_NAMES[func], -1, False, count, DATATYPE_NAMES.get(dtype, dtype), root, ptr(send),
                            ptr(recv), len(plan.programs))
            task.variant = plan.algo
            info = self._info(func, [task], user_tag, mask, seq, stream)     # the caller's, as given (None: current)
        work = Work(self._tag, plan, dtype, redop, sendbuf=send, recvbuf=recv, stream=stream, seq_number=seq)
        self._session.run(work, info)
        if user_out is not None:
            return user_out
        if func == "reduce" and self._rank != root:
            return None                 # NCCL leaves recvbuff unused off the root: no result to hand back
        if func in ("all_gather", "reduce_scatter"):      # 1-D at every world size (x's shape at 1 before)
            return self._session.backend.user_buffer(recv, x)
        return self._result(recv, x)

    def _result(self, recv: Any, x: Any) -> Any:
        """An allocated output as the caller gets it (a torch tensor, not the cuda backend's RawBuf), shaped as x."""
        res = self._session.backend.user_buffer(recv, x)
        return res.reshape(getattr(x, "shape", (-1,))) if hasattr(res, "reshape") else res

    # ---- collectives (counts follow NCCL) ----
    def all_reduce(self, x: Any, out: Any = None, op: str = "sum", *, user_tag: int = 0, stream: Any = None):
        return self._collective("all_reduce", x, out, lambda n: (n, n), op, 0, user_tag, stream)

    def broadcast(self, x: Any, out: Any = None, root: int = 0, *, user_tag: int = 0, stream: Any = None):
        return self._collective("broadcast", x, out, lambda n: (n, n), "sum", root, user_tag, stream)

    def reduce(self, x: Any, out: Any = None, root: int = 0, op: str = "sum", *, user_tag: int = 0,
               stream: Any = None):
        """The reduction into out (or a new array) on the root; on the other ranks, out as it was if given, else
        None (NCCL's recvbuff is used on the root only)."""
        return self._collective("reduce", x, out, lambda n: (n, n), op, root, user_tag, stream)

    def all_gather(self, x: Any, out: Any = None, *, user_tag: int = 0, stream: Any = None):
        return self._collective("all_gather", x, out, lambda n: (n, n * self._world), "sum", 0, user_tag,
                                stream)

    def reduce_scatter(self, x: Any, out: Any = None, op: str = "sum", *, user_tag: int = 0, stream: Any = None):
        def counts(n: int):
            if n % self._world:
                raise UsageError(f"reduce_scatter input has {plural(n, 'element')}, not a multiple of "
                                 f"world_size={self._world}")
            return n // self._world, n // self._world
        return self._collective("reduce_scatter", x, out, counts, op, 0, user_tag, stream)

    # ---- point to point ----
    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Batch send/recv calls; they run concurrently when the outermost group ends (ncclGroupStart/End)."""
        self._check_open()
        with self._group_lock:                  # two threads' checks passed at once: both opened, one's never ran
            outside_groups(self, "comm.group()", span=False)   # a group of its own may open inside another's
            self._group_depth += 1
            self._group_max = max(self._group_max, self._group_depth)
            if self._group is None:
                group_opened(self, True)        # its owner first: a call in between would pass as the owner's
                self._group = []
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._group_lock:              # closed in one step, as it opened: a group opened in between kept
                self._group_depth -= 1          # its state, not this one's reset
                parts = None
                if self._group_depth == 0:
                    group_opened(self, False)
                    parts, self._group, depth, self._group_max = self._group, None, self._group_max, 0
            if ok and parts:
                self._run_depth = depth         # the GroupApi event's groupDepth: 1 + the user's nesting
                try:
                    self._run_p2p(parts)
                finally:
                    self._run_depth = 0

    def _p2p(self, x: Any, peer: int, is_send: bool, user_tag: int) -> None:
        self._check_open()
        outside_groups(self, "send" if is_send else "recv")
        peer = int_index(peer, "peer", self._world)
        user_tag = tag_value(user_tag)
        flat, dtype, n = self._buf(x, "x" if is_send else "out")
        if not is_send:
            writable(flat, "out")
        self._enqueue([(P2pPart(peer, is_send, n, 0), flat, dtype, user_tag)])

    def _enqueue(self, entries: list, checked: bool = False) -> None:
        """Send/recv entries join the open group, or run now as a group of their own (checked: their buffers are
        known not to overlap, as all_to_all's)."""
        with self._group_lock:          # a group another thread opened since the call's check: not joined
            if self._group is not None:
                outside_groups(self, "all_to_all" if checked else "send/recv")
                self._group.extend(entries)
                return
        self._run_p2p(entries, checked)

    def send(self, x: Any, peer: int, *, user_tag: int = 0) -> None:
        self._p2p(x, peer, True, user_tag)

    def recv(self, out: Any, peer: int, *, user_tag: int = 0) -> Any:
        self._p2p(out, peer, False, user_tag)
        return out

    def _run_p2p(self, entries: list, checked: bool = False) -> None:
        self._guarded("send/recv", run_group, self, entries, checked)      # closed inside its group(): _guarded

    def all_to_all(self, x: Any, out: Any = None, *, send_counts: Any = None, recv_counts: Any = None,
                   user_tag: int = 0) -> Any:
        """Block j of x goes to rank j, out's block j comes from rank j: equal blocks, or each block's count in
        send_counts / recv_counts (torch's split sizes; rank i's send_counts[j] is rank j's recv_counts[i])."""
        self._check_open()
        outside_groups(self, "all_to_all")
        flat, dtype, n = self._buf(x, "x")
        user_tag = tag_value(user_tag)
        sends, recvs = a2a_counts(n, send_counts, recv_counts, self._rank, self._world)
        user_out, recv = self._on_device(self._out, out, flat, dtype, sum(recvs), "out",     # on x's device
                                         "" if recv_counts is None else f" (the sum of recv_counts={recvs})")
        if user_out is not None:
            check_overlap("all_to_all", flat, recv, 0, self._rank)
        self._check_open()
        entries, at_s, at_r = [], 0, 0  # blocks as offsets into x / out: no per-block views (a CuPy slice costs µs)
        for j in range(self._world):
            entries.append((P2pPart(j, True, sends[j], 0, at_s), flat, dtype, user_tag))
            entries.append((P2pPart(j, False, recvs[j], 0, at_r), recv, dtype, user_tag))
            at_s, at_r = at_s + sends[j], at_r + recvs[j]
        try:
            self._enqueue(entries, checked=True)     # x and out were checked above
        except MismatchError as e:              # the data path sees messages, not which counts made them
            raise comm_named(a2a_mismatch(e, sends, recvs), self._session) from None
        if user_out is not None:
            return user_out
        return self._result(recv, x) if send_counts is None else self._session.backend.user_buffer(recv, x)

    def mem_alloc(self, shape: Any, dtype: Any = "float32", *, symmetric: bool = False) -> Any:
        """A numpy array in this rank's registered memory (cpu backend, SLICETRACE_CPU_POOL bytes; as ncclMemAlloc +
        ncclCommRegister): ring collectives on such buffers skip FIFO copies (the peer reads or writes them).
        symmetric=True makes it a window (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC): all_reduce, all_gather
        and reduce_scatter on windows run the symmetric kernels, and then every rank must pass windows."""
        self._check_open()
        if symmetric.__class__ is not bool:
            raise UsageError(f"mem_alloc: symmetric={symmetric!r}; pass True or False")
        return self._session.backend.mem_alloc(shape, dtype, symmetric)

    def mem_free(self, arr: Any) -> None:
        """Return an array from mem_alloc to the pool (use it no more: the next mem_alloc may hand it out)."""
        self._check_open()
        self._session.backend.mem_free(arr)

    def barrier(self) -> None:
        """Every rank arrives before any leaves (through the rendezvous store; includes this rank's pending ops)."""
        self._check_open()
        outside_groups(self, "barrier")
        if self._group is not None:             # it would run before the group's ops it promises to include
            raise UsageError(f"barrier inside comm.group(): {GROUPED}")
        self._guarded("barrier", self._session.barrier)

    def synchronize(self) -> None:
        """cuda: wait for this communicator's last op (cpu ops are already complete)."""
        self._check_open()
        self._on_device(self._session.synchronize)

    def close(self) -> None:
        if self._closed:
            return
        closing = self._closing         # a close that finds another under way returns, not "inside an operation"
        if not closing.acquire(blocking=False):
            return
        try:
            # held, no op in its try: a KeyboardInterrupt hit an op between its lock and its try (or an op starts and
            # will find us closed). An op in its try (another thread's, or this one's under a signal handler) is not.
            got = self._busy.acquire(blocking=False)
            if not got and not self._active:    # an op between its lock and its try, or a lock an interrupt leaked
                got = self._busy.acquire(timeout=0.05)
            if not got and self._active:
                who = "this thread (a handler?) is" if self._active == threading.get_ident() else "another thread is"
                raise UsageError(f"close: {who} inside an operation of this communicator; close it once that "
                                 f"operation has returned (one thread at a time, close included, as NCCL requires)")
            try:
                if not self._closed:
                    self._closed = True
                    if self._session.forked:    # nothing of the parent's to free, no device to select
                        self._session.close()
                    else:                       # from any thread: the backend frees on its own device
                        self._on_device(self._session.close)
            finally:
                if got:                         # a leaked lock stays held: later ops find the comm closed
                    self._busy.release()
        finally:
            closing.release()
        if self._group:                         # closed by now: the peers hear it; the caller must too (and the
            n = len(self._group)                # group's owner, at its exit: "closed")
            raise UsageError(f"close: a comm.group() was open with {n} send/recv queued; they never ran")

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
            return
        try:                                    # the block's own error is the one to see
            self.close()
        except SliceTraceError as e:
            log.error("slicetrace: closing after %s: %s", exc[0].__name__, e)
