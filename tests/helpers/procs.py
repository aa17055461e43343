"""Multi-rank harness for tests: spawn, a timeout on every join, survivors killed before asserting.

`RankPool` keeps `world` rank processes alive across test cases; each call ships a picklable function
`fn(ctx, *args)` to every rank and collects the results. ctx is a dict with rank, world, store, job and a
per-process `state` dict that persists between calls (e.g. a Communicator made once).
"""
from __future__ import annotations

import glob
import multiprocessing as mp
import os
import traceback
import uuid
from typing import Any, Callable

from slicetrace.rendezvous import DictStore


def _rank_main(rank: int, world: int, store_map: Any, job: str, conn) -> None:
    ctx = {"rank": rank, "world": world, "store": DictStore(store_map), "job": job, "state": {}}
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            fn, args = msg
            try:
                conn.send(("ok", fn(ctx, *args)))
            except BaseException as e:  # noqa: BLE001 - shipped back to the test
                conn.send(("err", (type(e).__name__, str(e), traceback.format_exc())))
    finally:
        closer = ctx["state"].get("close")
        if closer:
            try:
                closer()
            except Exception:
                pass


class RankError(Exception):
    def __init__(self, rank: int, name: str, msg: str, tb: str):
        super().__init__(f"rank {rank}: {name}: {msg}\n{tb}")
        self.rank, self.name, self.msg = rank, name, msg


class RankPool:
    def __init__(self, world: int, timeout: float = 120.0):
        self.world, self.timeout = world, timeout
        self._ctx = mp.get_context("spawn")
        self._mgr = self._ctx.Manager()
        self.store_map = self._mgr.dict()
        self.job = uuid.uuid4().hex[:10]
        self.conns, self.procs = [], []
        for r in range(world):
            a, b = self._ctx.Pipe()
            p = self._ctx.Process(target=_rank_main, args=(r, world, self.store_map, self.job, b),
                                  name=f"rank{r}", daemon=True)
            p.start()
            self.conns.append(a)
            self.procs.append(p)

    def run(self, fn: Callable, *args: Any, timeout: float | None = None, ranks=None) -> list[Any]:
        """Run fn on every rank (or `ranks`); raise RankError for the first failing rank."""
        ranks = list(range(self.world)) if ranks is None else list(ranks)
        return self.run_each([(fn, args)] * len(ranks), timeout=timeout, ranks=ranks)

    def run_each(self, calls: list, timeout: float | None = None, ranks=None) -> list[Any]:
        """calls[i] = (fn, args) runs on rank ranks[i] (default: rank i), all at once; results in that order.
        A rank with no answer within the timeout gets the pool killed before TimeoutError is raised; otherwise
        every rank has answered (none is left running) when the first failing rank's RankError is raised."""
        timeout = timeout or self.timeout
        ranks = list(range(len(calls))) if ranks is None else list(ranks)
        for r, (fn, args) in zip(ranks, calls):
            self.conns[r].send((fn, args))
        out: dict[int, Any] = {}
        errors = []
        for r in ranks:
            if not self.conns[r].poll(timeout):
                self.kill()
                raise TimeoutError(f"rank {r} gave no answer within {timeout}s (pool killed)")
            try:
                status, val = self.conns[r].recv()
            except EOFError:
                errors.append(RankError(r, "EOFError", "rank process died", ""))
                continue
            if status == "ok":
                out[r] = val
            else:
                errors.append(RankError(r, *val))
        if errors:
            raise errors[0]
        return [out[r] for r in ranks]

    def results_or_errors(self, fn: Callable, *args: Any, timeout: float | None = None) -> list[Any]:
        """Like run, but returns RankError objects in place of results instead of raising."""
        timeout = timeout or self.timeout
        for c in self.conns:
            c.send((fn, args))
        res = []
        for r, c in enumerate(self.conns):
            if not c.poll(timeout):
                self.kill()
                raise TimeoutError(f"rank {r} gave no answer within {timeout}s (pool killed)")
            try:
                status, val = c.recv()
            except EOFError:
                res.append(RankError(r, "EOFError", "rank process died", ""))
                continue
            res.append(val if status == "ok" else RankError(r, *val))
        return res

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(10)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except (OSError, BrokenPipeError):
                pass
        for p in self.procs:
            p.join(30)
        self.kill()                      # survivors are killed before anyone asserts
        try:
            self._mgr.shutdown()
        except Exception:
            pass
        leaked = glob.glob(f"/dev/shm/*{self.job}*")
        for f in leaked:
            os.unlink(f)


def wait_child(pid: int, timeout: float = 30.0) -> int:
    """A forked child's exit code, waited for at most `timeout` s; a child still running then is killed and reaped
    before the AssertionError (a fork test must not leave it behind)."""
    import signal
    import time
    deadline = time.monotonic() + timeout
    while (r := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"forked child {pid} did not exit within {timeout} s (killed)")
        time.sleep(0.01)
    return os.waitstatus_to_exitcode(r[1])
