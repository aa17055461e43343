"""init() for one rank process (torchrun conventions) and launch() to spawn local ranks."""
from __future__ import annotations

from collections import defaultdict
import itertools
import logging
import multiprocessing.connection as mpc
from multiprocessing.managers import SyncManager
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import uuid
from typing import Any, Callable

from .api import Communicator
from .api_checks import as_index
from .config import Settings, dist_env, job_attempt, job_rank, job_world_size, quiet_unknown
from .errors import ConfigError, LaunchError, PeerError, SliceTraceError, UsageError, ours
from .launch_checks import launch_settings
from .launch_report import (close_stuck, death_text, failure_line, lead, lingering, overdue, ran_on,
                            stuck_closing)
from .launch_signals import (CLOSE_SIGNAL, ORPHAN_GRACE_S, _asked_to_close, _hold_signals, _interrupted,
                             _let_ranks_close, _no_interrupts, _QuietContext, _release_signals, _remove_job_shm,
                             _start_watch, _terminate_as_exit, _terminated)
from .rendezvous import DictStore, LaunchStore, Store, TorchStore

log = logging.getLogger("slicetrace")


# (world_size, who) -> a count of this process's init() calls that take a job id from a store; who: the process's
# own rank (launch's, torchrun's RANK), so a communicator that reorders the ranks counts alike on all; else the
# rank given (ranks as threads of one process count apart)
_JOB_CALLS: defaultdict = defaultdict(itertools.count)
_LAUNCH: tuple[int, int, Store, dict] | None = None     # in a rank process of launch(): (rank, world, store, settings)


def _default_group() -> tuple[int, int] | None:
    """(rank, world size) of torch.distributed's default process group, if the program made one: one made with
    init_process_group(rank=, world_size=) (torch.multiprocessing.spawn) sets no RANK/WORLD_SIZE, and init() then
    made each process a world of one, silently."""
    dist = sys.modules.get("torch.distributed")     # not imported: none made (and torch is not loaded for nothing)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def _torch_store(rank: int, world: int, timeout_s: float) -> Store:
    try:
        import torch.distributed as dist
    except ImportError:
        raise ConfigError(f"world_size={world} without store=: the rendezvous needs torch.distributed's TCPStore "
                          f"(torchrun), and torch is not installed; pass store=, or call slicetrace.launch() "
                          f"instead") from None
    if dist.is_available() and dist.is_initialized():
        from torch.distributed.distributed_c10d import _get_default_store
        return TorchStore(_get_default_store(), "torch.distributed's default store (init_process_group)")
    d = dist_env(ranks=False, master=True)
    missing = [n for n, v in (("MASTER_ADDR", d.master_addr), ("MASTER_PORT", d.master_port)) if v is None]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} unset: world_size={world} without store= meets the other ranks "
                          f"at a TCPStore on MASTER_ADDR:MASTER_PORT (torchrun sets both); set them, pass store=, "
                          f"or call slicetrace.launch() instead")
    # under torchrun its agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 is a client too
    return TorchStore.connect(d.master_addr, d.master_port, rank, world, rank == 0 and not d.agent_store,
                              timeout_s)


def init(backend: str | None = None, rank: int | None = None, world_size: int | None = None, *,
         store: Store | None = None, job: str | None = None, name: str = "", **settings: Any) -> Communicator:
    """Make this rank's Communicator. Explicit arguments beat SLICETRACE_* variables; without rank/world_size,
    torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are used (in a rank of launch(): its rank, world and store);
    without those, a world of one. In a rank of launch(), launch()'s settings are the defaults (not its cpu_bind,
    which binds by rank in the launch's world)."""
    if _LAUNCH is not None:     # a sub-communicator ran with the environment's settings, unprofiled, nothing said
        backend = _LAUNCH[3].get("backend") if backend is None else backend
        settings = {**{k: v for k, v in _LAUNCH[3].items() if k not in ("backend", "cpu_bind")}, **settings}
    s = Settings.from_env(backend=backend, **settings)
    # checked before any store is used: a bad rank would otherwise wait out the rendezvous timeout
    rank = None if rank is None else _as_int("rank", rank, "in 0..world_size-1")
    world_size = None if world_size is None else _as_int("world_size", world_size, ">= 1")
    # torchrun's variables only when used: explicit arguments (launch()'s ranks, the CLI's) leave them alone
    if _LAUNCH is not None and world_size != 1:       # init() there joins that world, as torchrun's variables do
        if world_size in (None, _LAUNCH[1]):
            rank = _LAUNCH[0] if rank is None else rank
            world_size = _LAUNCH[1]
        store = _LAUNCH[2] if store is None else store
    env = dist_env(ranks=rank is None or world_size is None, master=False)
    used = (rank is None and env.rank is not None) or (world_size is None and env.world_size is not None)
    rank_name = "RANK" if rank is None and (env.rank is not None or used) else "rank"   # upper: the environment's
    world_name = "WORLD_SIZE" if world_size is None and (env.world_size is not None or used) else "world_size"
    group = _default_group() if _LAUNCH is None and env.rank is None and env.world_size is None else None
    if group is not None and rank is None and world_size is None:
        rank, world_size = group                        # its store is the rendezvous too (_torch_store)
    # torch's env:// rule: RANK and WORLD_SIZE come together (RANK=0 alone made a world of one, RANK=1 alone failed)
    half = rank is None and world_size is None and (env.rank is None) != (env.world_size is None)
    rank = env.rank if rank is None else rank
    world_size = env.world_size if world_size is None else world_size
    if world_size is not None and world_size < 1:       # before "give both": that is not what is wrong
        raise UsageError(f"{world_name}={world_size} must be an int >= 1")
    if rank is None or world_size is None:
        if half or rank not in (None, 0) or world_size not in (None, 1):
            raise UsageError(f"{rank_name}={rank!r} and {world_name}={world_size!r}: give both, or neither for one "
                             f"rank")
        rank, world_size = 0, 1
    if store is not None and not isinstance(store, Store):
        raise UsageError(f"store={store!r} (type {type(store).__name__}) must be a slicetrace.rendezvous.Store, "
                         f"e.g. DictStore(a dict shared by the ranks)")
    if not 0 <= rank < world_size:
        raise UsageError(f"{rank_name}={rank} must be an int in 0..{world_size - 1} ({world_name}={world_size})")
    if store is None:
        store = DictStore({}) if world_size == 1 else _torch_store(rank, world_size, s.timeout_s)
    key = None
    if job is None and world_size == 1:
        job = uuid.uuid4().hex[:10]
    elif job is None:
        top = _LAUNCH[1] if _LAUNCH is not None else job_world_size() or (group and group[1])
        if top is not None and world_size != top:   # its members' calls cannot be told from another group's
            raise UsageError(f"init(world_size={world_size}) in a job of {top} ranks makes a sub-communicator: pass "
                             f"job=, a string its members share and no other communicator uses (NCCL's unique id); "
                             f"without one, groups of ranks making communicators of one size could join each other")
        # a key per call: the store outlives a communicator (torchrun's agent, torch's default store), so a fixed
        # key could hand a later call the previous communicator's id; every rank counts its calls alike
        who = _LAUNCH[0] if _LAUNCH is not None else job_rank()
        key = f"slicetrace/job/{job_attempt()}{world_size}/{next(_JOB_CALLS[world_size, rank if who is None else who])}"
        twice = UsageError(f"init(): two communicators of world_size={world_size} met at the job id key {key!r} "
                           f"(groups of ranks making communicators over one store: sub-communicators); pass job=, "
                           f"a string the members of one communicator share and no other uses (NCCL's unique id)")
        if rank == 0:
            job = uuid.uuid4().hex[:10]
            if store.claim(key, job.encode()).decode() != job:      # another rank 0 took this call's key
                store.set(f"{key}/twice", b"1")                     # its members and ours cannot tell whose it is
                raise twice
        else:
            job = store.get(key, s.timeout_s, what=f"job id from rank 0 ({key})").decode()
            if store.try_get(f"{key}/twice") is not None:
                raise twice
    comm = Communicator(s, rank, world_size, store, job, name)
    if key is not None:
        comm._session.extra_keys = [key, f"{key}/twice"]
    return comm


def _as_int(arg: str, v: Any, want: str) -> int:
    i = as_index(v)
    if i is None:
        raise UsageError(f"{arg}={v!r} (type {type(v).__name__}) must be an int {want}")
    return i


def _send(conn, msg: tuple) -> None:
    try:
        conn.send_bytes(pickle.dumps(msg))
    except OSError:             # the launcher is gone: nobody to tell
        pass


def _crowding(world: int) -> bool:
    """cpu_bind='auto': bind when the ranks fill more than half of the CPUs, where the scheduler was seen to put two
    on one core; with cores to spare it does not, and a bound rank's own compute would keep to one core."""
    return hasattr(os, "sched_getaffinity") and 2 * world > len(os.sched_getaffinity(0))


def _child(fn: Callable, rank: int, world: int, store_map: Any, job: str, settings: dict, args: tuple,
           conn, parent: int, sigint_ignored: bool = False) -> None:
    quiet_unknown()                              # the launcher warned of unknown SLICETRACE_* variables
    running = threading.Event()                  # set while fn may be interrupted (see _watch_parent)
    running.set()
    _start_watch(parent, ORPHAN_GRACE_S, job, running)
    _send(conn, ("started",))                    # fn was unpickled: a later death is not an import problem
    comm, me = None, os.getpid()
    try:
        signal.signal(CLOSE_SIGNAL, _asked_to_close)     # the launcher's request, even with SIGINT ignored
        signal.signal(signal.SIGTERM, _terminated)
        if not sigint_ignored:                   # ignored while we started (_QuietProcess): Ctrl-C is on again
            signal.signal(signal.SIGINT, _interrupted)
        if Settings.from_env(**settings).cpu_bind == "auto" and _crowding(world):
            settings = {**settings, "cpu_bind": "on"}      # our own rank processes: nothing else inherits it
        global _LAUNCH
        _LAUNCH = (rank, world, LaunchStore(store_map), settings)
        comm = init(rank=rank, world_size=world, store=_LAUNCH[2], job=job, **settings)
        result = fn(comm, *args)
        _leave_if_forked(me)
        running.clear()
        _no_interrupts()                         # an interrupted launch lets closing ranks finish (plugins)
        _send(conn, ("closing",))                # from here the launcher bounds it (launch_report.stuck_closing)
        comm.close()
        comm = None
        try:
            # plain pickle, before it writes (a failure leaves the pipe clean): with torch imported, the pipe's own
            # pickler sends a tensor as a handle to this process's shared memory, gone once it exits
            conn.send_bytes(pickle.dumps(("ok", result)))
        except OSError:                          # the launcher is gone: nobody to tell
            pass
        except Exception as e:  # noqa: BLE001 - any pickling failure: AttributeError, TypeError, PicklingError
            _send(conn, ("err", f"rank {rank}: fn's return value could not be sent to the launcher (pickle): "
                                f"{type(e).__name__}: {e}; return plain data (numbers, strings, numpy arrays)", ""))
    except BaseException as e:  # noqa: BLE001 - reported to the parent with its traceback
        _leave_if_forked(me, e)
        _no_interrupts()                         # the launcher forwards the terminal's Ctrl-C: close first
        running.clear()
        try:
            why = f"rank {rank} failed: {type(e).__name__}: {e}"
            store_map.setdefault(LaunchStore.FAILED_KEY, why.encode())
            if comm is not None:
                comm._session.backend.abort(why)
        except BaseException:
            pass
        _send(conn, ("err", f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        if comm is not None:
            try:
                comm.close()
            except BaseException:               # a late interrupt included: the orphan check below still runs
                pass
        if os.getppid() != parent:
            _remove_job_shm(job)                 # orphaned: the launcher that would have removed it is gone


def _leave_if_forked(me: int, exc: BaseException | None = None) -> None:
    """A child fn forked that came back here (returned or raised) exits: the rank's pipe, result and communicator
    are its parent's (it aborted the job, or replaced the rank's result)."""
    if os.getpid() != me:
        code = 0
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        elif exc is not None:
            traceback.print_exc()
            code = 1
        os._exit(code)


def launch(fn: Callable, nranks: int, *args: Any, join_timeout_s: float | None = None, **settings: Any) -> list[Any]:
    """Run fn(comm, *args) in `nranks` spawned processes; return the results in rank order.

    A failing or dead rank makes every other rank fail within settings.timeout_s; survivors are asked to close
    timeout_s + 5 s after the first failure (or after join_timeout_s in all), as on Ctrl-C, so that their profiler
    plugins write their traces, and killed if still running 10 s later; the job's shared memory is removed, and a
    LaunchError leads with the rank where the failure began (`.errors`: each rank that did not return: its error
    and traceback, or how it ended: died, exited without a result, asked to close while still running, and whether it then closed
    or was killed).
    """
    nranks, s = launch_settings(fn, nranks, args, join_timeout_s, settings)
    ctx = _QuietContext()
    job = uuid.uuid4().hex[:10]
    mgr = SyncManager(ctx=ctx)
    try:
        mgr.start(_start_watch, (os.getpid(), 0.0, job))   # the store's server goes with its launcher too (at once)
    except EOFError:            # the spawned server re-ran the caller's module, which called launch() again
        server = mgr._process
        server.join(5)
        if server.exitcode is not None and server.exitcode < 0:     # or it was killed (signal) while it started
            raise LaunchError(f"launch(): the store's server process (pid {server.pid}) was killed by signal "
                              f"{-server.exitcode} while it started", {}) from None
        raise LaunchError("launch(): the store's server process failed to start: spawned processes import the "
                          "caller's module, so call launch() under `if __name__ == '__main__':`", {}) from None
    except BaseException:       # Ctrl-C while it reads the server's address: the server (SIGINT ignored) has no
        server = getattr(mgr, "_process", None)         # shutdown hook yet, and exit would wait on it for good
        if server is not None and server.is_alive():
            server.kill()
            server.join(5)
        raise
    with mgr:
        store_map = mgr.dict()
        pipes, procs = [], []
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        heads: dict[int, str] = {}              # rank -> its error's "Type: message", without the traceback
        started: set[int] = set()
        closing: dict[int, float] = {}          # rank -> when its fn returned (its close began)
        returned: dict[int, float] = {}         # rank -> when its result came; warned: said to linger after it
        warned: set[int] = set()
        dead: set[int] = set()                  # ranks the launcher found gone without a word: where it began
        stuck: set[int] = set()                 # ranks still running at the deadline: asked to close

        def read(c, r: int) -> bool:
            """One message of rank r; False once its pipe has nothing more to say."""
            try:
                status, *val = pickle.loads(c.recv_bytes())
            except (EOFError, OSError):         # gone, maybe mid-message (killed): its exit code tells why
                return False
            except Exception as e:  # noqa: BLE001 - its result was sent whole but does not unpickle here
                errors[r] = heads[r] = (f"rank {r}: its return value could not be rebuilt in the launcher "
                                        f"(unpickling): {type(e).__name__}: {e}; return plain data")
                return False
            if status == "started":
                started.add(r)
                return True
            if status == "closing":
                closing.setdefault(r, time.monotonic())
                return True
            if status == "ok":
                results[r] = val[0]
                returned[r] = time.monotonic()
            else:
                errors[r] = f"{val[0]}\n{val[1]}" if val[1] else val[0]
                heads[r] = val[0]
            return False

        first_fail = None
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN     # ranks keep the caller's choice
        restore = _terminate_as_exit()
        try:
            # spawned inside the try: an interrupt between two starts still kills the first and removes its memory
            for r in range(nranks):
                a, b = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(fn, r, nranks, store_map, job, settings, args, b,
                                                     os.getpid(), ignored), name=f"slicetrace-rank{r}")
                p.start()
                b.close()
                pipes.append(a)
                procs.append(p)
            pending = {p.sentinel: r for r, p in enumerate(procs)}
            readers = {pipes[r]: r for r in range(nranks)}
            start = time.monotonic()
            while pending or readers:
                ready = mpc.wait(list(readers) + list(pending), timeout=0.5)
                for obj in ready:
                    if obj in readers:
                        if not read(obj, readers[obj]):
                            readers.pop(obj)
                    elif obj in pending:
                        r = pending.pop(obj)
                        procs[r].join(1)     # the sentinel can fire before exitcode is set (seen: "None")
                        c = pipes[r]
                        while c in readers and c.poll(0):        # what it said before it went
                            if not read(c, r):
                                readers.pop(c)
                        if r not in errors and r not in results:
                            dead.add(r)
                            errors[r] = death_text(r, procs[r].exitcode, r in started)
                late = stuck_closing(closing, set(results) | set(errors), time.monotonic(), s.timeout_s)
                errors.update(late)
                stuck.update(late)
                if errors and first_fail is None:
                    first_fail = time.monotonic()
                    dead_rank = min(dead, default=None)     # a rank's own error: it set the key itself
                    if dead_rank is not None:
                        try:
                            LaunchStore(store_map).claim(LaunchStore.FAILED_KEY, errors[dead_rank].encode())
                        except PeerError:       # the store's server is gone too: the ranks watch each other
                            pass
                now = time.monotonic()
                for line in lingering(returned, set(pending.values()), warned, now, s.timeout_s):
                    log.warning(line)
                if first_fail is not None and overdue(first_fail, now, s.timeout_s):
                    for c, r in list(readers.items()):      # results that came in since the last wait: not stuck
                        while c in readers and c.poll(0):
                            if not read(c, r):
                                readers.pop(c)
                    first_rank = min(errors, key=lambda k: lead(k, errors, dead, stuck))
                    for r in [r for r in range(nranks) if r not in results and r not in errors]:  # had their timeout
                        errors[r] = ran_on(r, first_rank, now - first_fail, s.timeout_s)
                        stuck.add(r)
                    break
                if join_timeout_s is not None and now - start > join_timeout_s:
                    for r in [r for r in range(nranks) if r not in results and r not in errors]:
                        errors[r] = f"rank {r} still running after join_timeout_s={join_timeout_s}"
                        stuck.add(r)
                    break
                if stuck and len(results) + len(errors) == nranks and stuck.issuperset(pending.values()):
                    break                       # the others are gone: the stuck ones need not wait the deadline
                if not pending and readers:
                    # processes are gone; anything unread now will never come
                    for c, r in list(readers.items()):
                        if not c.poll(0):
                            readers.pop(c)
                            errors.setdefault(r, f"rank {r} exited without a result")
        finally:
            interrupted = isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit))
            # timeout(1) signals the launcher and then its group: a 2nd TERM mid-cleanup. (Off the main thread
            # neither is set: restore is None whenever held is.)
            held = _hold_signals(restore)
            try:
                if interrupted:
                    _let_ranks_close([p for r, p in enumerate(procs) if r in started], held,
                                     CLOSE_SIGNAL if ignored else signal.SIGINT)   # ignored SIGINT: ranks too
                elif stuck:     # asked first, as on Ctrl-C: a hung rank's trace is the one its user needs
                    close_stuck(procs, stuck, started, set(closing), held, errors)
                for p in procs:
                    if p.is_alive():
                        p.kill()
                    p.join(10)
                _remove_job_shm(job)
            finally:
                _release_signals(held)
    if errors:
        r = min(errors, key=lambda k: lead(k, errors, dead, stuck))
        others = "; ".join(failure_line(k, v.splitlines()[0]) for k, v in sorted(errors.items()) if k != r)
        shown = heads[r] if ours(heads.get(r, "")) else errors[r]   # bad input, a timeout: no traceback
        raise LaunchError(failure_line(r, shown) + (f"\nother ranks: {others}" if others else ""), errors)
    missing = [r for r in range(nranks) if r not in results]
    if missing:
        raise SliceTraceError(f"ranks {missing} returned no result")
    return [results[r] for r in range(nranks)]
