"""Fault-injection trial of the cpu engine and the launcher: many 2..5-rank jobs, each with one fault at a random
point, checked for a clear error on every other rank in time, the launcher's exit status and message, no process
left running, no /dev/shm segment of the job left, and trace files that parse (or are marked partial).

    PYTHONPATH=src python scripts/fault_trial.py --trials 10 [--cases kill,stop,...] [--seed 1] [--timeout 3]

Each job runs in a process group of its own (`--job` re-runs this file as that job). Cases: kill (SIGKILL a rank
mid-op), kill_server (SIGKILL the launcher's store server, the one helper process of a job), stop (SIGSTOP a
rank), kill_init / kill_close (SIGKILL a rank during its init() / close()), raise (fn raises on one rank), skip (a
rank skips an op), sigint (Ctrl-C to the process group), init_kill (ranks made by init() with RANK/WORLD_SIZE, no
launcher; SIGKILL one mid-op).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "sendrecv", "all_to_all")
SIZES = (0, 4, 4096, 65536, 1 << 20, 8 << 20, 64 << 20)
CASES = ("kill", "kill_server", "stop", "kill_init", "kill_close", "raise", "skip", "sigint", "init_kill")
OP_NAMES = r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll|send|recv|" \
           r"all_reduce|all_gather|reduce_scatter|broadcast|reduce|all_to_all|collective|op |point-to-point)"

# ---- in a rank ----

def _daemon_timer(delay: float, fn) -> None:
    """A fault that fires only while the rank runs: a non-daemon timer kept the process alive past its exit."""
    t = threading.Timer(delay, fn)
    t.daemon = True
    t.start()


def _note(folder: str, name: str, rec: dict) -> None:
    tmp = os.path.join(folder, f".{name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, os.path.join(folder, f"{name}.json"))


if __name__ == "__mp_main__" and os.environ.get("FT_INIT_KILL"):        # a spawned rank: kill it during init()
    import multiprocessing as _mp
    _who, _delay = os.environ["FT_INIT_KILL"].split()
    if _mp.current_process().name == f"slicetrace-rank{_who}":
        def _kill_self():
            _note(os.environ["FT_DIR"], "fault", {"t": time.monotonic(), "kind": "kill_init"})
            os.kill(os.getpid(), signal.SIGKILL)
        _daemon_timer(float(_delay), _kill_self)


def do_op(comm, op: str, nbytes: int) -> None:
    import numpy as np
    n, r = comm.world_size, comm.rank
    per = max(nbytes // 4 // n, 0)          # per-rank piece (all_gather, reduce_scatter, all_to_all)
    if op == "all_reduce":
        x = np.ones(nbytes // 4, np.float32)
        comm.all_reduce(x, x)
    elif op == "all_gather":
        comm.all_gather(np.ones(per, np.float32), np.empty(per * n, np.float32))
    elif op == "reduce_scatter":
        comm.reduce_scatter(np.ones(per * n, np.float32), np.empty(per, np.float32))
    elif op == "broadcast":
        x = np.ones(nbytes // 4, np.float32)
        comm.broadcast(x, x, root=1 % n)
    elif op == "reduce":
        x = np.ones(nbytes // 4, np.float32)
        comm.reduce(x, x, root=0)
    elif op == "sendrecv":
        a, b = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
        with comm.group():
            comm.send(a, (r + 1) % n)
            comm.recv(b, (r - 1) % n)
    elif op == "all_to_all":
        comm.all_to_all(np.ones(per * n, np.float32), np.empty(per * n, np.float32))


def run_ops(comm, plan: dict) -> str:
    folder, f = plan["dir"], plan["fault"]
    me = f["rank"] == comm.rank
    rec = {"rank": comm.rank, "pid": os.getpid(), "job": comm._session.job}
    _note(folder, f"r{comm.rank}", rec)
    try:
        for i, (op, nb) in enumerate(plan["ops"]):
            if me and i == f["at"]:
                if f["kind"] in ("kill", "stop", "init_kill"):
                    sig = signal.SIGSTOP if f["kind"] == "stop" else signal.SIGKILL

                    def hit(sig=sig):
                        _note(folder, "fault", {"t": time.monotonic(), "kind": f["kind"], "op": i})
                        os.kill(os.getpid(), sig)
                    _daemon_timer(f["delay"], hit)
                elif f["kind"] == "raise":
                    _note(folder, "fault", {"t": time.monotonic(), "kind": "raise", "op": i})
                    raise RuntimeError(f"injected fault on rank {comm.rank} before op {i}")
                elif f["kind"] == "skip":
                    _note(folder, "fault", {"t": time.monotonic(), "kind": "skip", "op": i})
                    continue
            do_op(comm, op, nb)
    except BaseException as e:
        rec.update(t_err=time.monotonic(), err=type(e).__name__, msg=str(e)[:2000])
        _note(folder, f"r{comm.rank}", rec)
        raise
    rec["ok"] = time.monotonic()
    _note(folder, f"r{comm.rank}", rec)
    if me and f["kind"] == "kill_close":        # fn returns, launch's child closes the communicator
        def hit():
            _note(folder, "fault", {"t": time.monotonic(), "kind": "kill_close"})
            os.kill(os.getpid(), signal.SIGKILL)
        _daemon_timer(f["delay"], hit)
    return "ok"


def job_launch(plan: dict) -> int:
    import slicetrace
    import slicetrace.launcher as L
    jid = plan["job"]
    L.uuid = type("U", (), {"uuid4": staticmethod(lambda: uuid.UUID(jid.ljust(32, "0")))})   # a job id we know
    kw = dict(timeout_s=plan["timeout"], nchannels=plan["nch"], join_timeout_s=300)
    if plan["profile"]:
        kw.update(profiler_plugin="example", profile_dump_file=os.path.join(plan["dir"], "trace", "run"))
    try:
        slicetrace.launch(run_ops, plan["nranks"], plan, **kw)
    except slicetrace.LaunchError as e:
        _note(plan["dir"], "launcher", {"t": time.monotonic(), "err": type(e).__name__, "msg": str(e)[:4000]})
        return 1
    except BaseException as e:
        _note(plan["dir"], "launcher", {"t": time.monotonic(), "err": type(e).__name__, "msg": str(e)[:4000]})
        raise
    _note(plan["dir"], "launcher", {"t": time.monotonic(), "err": None})
    return 0


def job_init_rank(plan: dict) -> int:
    """One rank made by init() from RANK/WORLD_SIZE; the store: a manager dict whose address the trial gives."""
    from multiprocessing.managers import DictProxy, SyncManager
    import slicetrace
    from slicetrace.rendezvous import DictStore
    host, port = plan["mgr"]
    mgr = SyncManager(address=(host, port), authkey=b"ft")
    mgr.register("store", proxytype=DictProxy)
    mgr.connect()
    kw = dict(timeout_s=plan["timeout"], nchannels=plan["nch"])
    if plan["profile"]:
        kw.update(profiler_plugin="example", profile_dump_file=os.path.join(plan["dir"], "trace", "run"))
    try:
        with slicetrace.init(store=DictStore(mgr.store()), job=plan["job"], **kw) as comm:
            run_ops(comm, plan)
    except slicetrace.SliceTraceError:
        return 1
    return 0


# ---- the trial ----

def _session_procs(sid: int) -> list[int]:
    out = []
    for d in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(d, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            out.append(int(d.split("/")[2]))
    return out


def _children(pid: int) -> list[tuple[int, int]]:
    """(start time, pid) of pid's children that are spawned Python processes."""
    out = []
    for d in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(d, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) == pid:
                with open(d.replace("stat", "cmdline"), "rb") as f:
                    if b"spawn_main" in f.read():
                        out.append((int(fields[19]), int(d.split("/")[2])))
        except (OSError, ValueError):
            continue
    return sorted(out)


def plan_trial(case: str, rng: random.Random, base: str, timeout: float, i: int) -> dict:
    nranks = rng.randint(2, 5)
    nops = rng.randint(10, 40)             # enough ops that a fault at a random point lands inside one
    ops = [(rng.choice(OPS), rng.choice(SIZES)) for _ in range(nops)]
    if sum(nb for _, nb in ops) > 96 << 20:             # keep a trial in seconds on 2 cores
        ops = [(o, min(nb, 8 << 20)) for o, nb in ops]
    job = uuid.uuid4().hex[:10]
    d = os.path.join(base, f"{case}_{i}_{job}")
    os.makedirs(os.path.join(d, "trace"))
    return {"case": case, "nranks": nranks, "ops": ops, "job": job, "dir": d, "timeout": timeout,
            "nch": rng.choice((1, 2)), "profile": rng.random() < 0.5,
            "fault": {"kind": case, "rank": rng.randrange(nranks), "at": rng.randrange(nops * 3 // 4),
                      "delay": rng.uniform(0, 0.02)}}      # inside op `at` or one soon after


def run_trial(plan: dict, rng: random.Random) -> dict:
    case, d = plan["case"], plan["dir"]
    before = set(os.listdir("/dev/shm"))
    env = {**os.environ, "FT_DIR": d}
    if case == "kill_init":
        env["FT_INIT_KILL"] = f"{plan['fault']['rank']} {rng.uniform(0.0, 1.5):.3f}"
        plan["fault"]["at"] = 10 ** 6
    limit = plan["timeout"] + 5 + 10 + 30
    t0 = time.monotonic()
    procs, mgr = [], None
    if case == "init_kill":
        from multiprocessing.managers import DictProxy, SyncManager
        store: dict = {}
        SyncManager.register("store", callable=lambda: store, proxytype=DictProxy)
        mgr = SyncManager(address=("127.0.0.1", 0), authkey=b"ft")
        mgr.start()
        plan["mgr"] = list(mgr.address)
        for r in range(plan["nranks"]):
            e = {**env, "RANK": str(r), "WORLD_SIZE": str(plan["nranks"]), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "1"}
            procs.append(subprocess.Popen([sys.executable, __file__, "--init-rank", json.dumps(plan)], env=e,
                                          start_new_session=True, stderr=subprocess.PIPE, stdout=subprocess.PIPE))
    else:
        procs.append(subprocess.Popen([sys.executable, __file__, "--job", json.dumps(plan)], env=env,
                                      start_new_session=True, stderr=subprocess.PIPE, stdout=subprocess.PIPE))
    outcome = {"case": case, "dir": d, "problems": []}
    if case in ("sigint", "kill_server"):
        at = rng.uniform(0.1, 2.0)
        time.sleep(at)
        if procs[0].poll() is None:
            if case == "sigint":
                os.killpg(procs[0].pid, signal.SIGINT)
            else:
                kids = _children(procs[0].pid)
                if kids:
                    os.kill(kids[0][1], signal.SIGKILL)
            _note(d, "fault", {"t": time.monotonic(), "kind": case, "at": at})
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, limit - (time.monotonic() - t0)))
            errs.append(err.decode(errors="replace"))
        except subprocess.TimeoutExpired:
            outcome["problems"].append(f"HANG: pid {p.pid} still running after {limit} s")
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    outcome["rc"] = [p.returncode for p in procs]
    outcome["stderr"] = [e[-3000:] for e in errs] or [""]
    left = [pid for p in procs for pid in _session_procs(p.pid)]
    if left:
        time.sleep(ORPHAN_WAIT)
        still = [pid for p in procs for pid in _session_procs(p.pid)]
        if still:
            outcome["problems"].append(f"SURVIVORS {still} ({ORPHAN_WAIT} s after the job's exit)")
            for pid in still:
                os.kill(pid, signal.SIGKILL)
        else:
            outcome["late_exit"] = left
    if mgr is not None:
        mgr.shutdown()
    shm = [n for n in set(os.listdir("/dev/shm")) - before if plan["job"] in n]
    if shm:
        outcome["problems"].append(f"SHM LEFT {shm}")
        for n in shm:
            os.unlink(os.path.join("/dev/shm", n))
    check(plan, outcome)
    return outcome


ORPHAN_WAIT = 12.0


def _load(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check(plan: dict, out: dict) -> None:
    import re
    d, case, f = plan["dir"], plan["case"], plan["fault"]
    fault = _load(os.path.join(d, "fault.json"))
    ranks = {r: _load(os.path.join(d, f"r{r}.json")) for r in range(plan["nranks"])}
    launcher = _load(os.path.join(d, "launcher.json"))
    out["fault_fired"] = fault is not None
    worst = 0.0
    bound = plan["timeout"] + 2.0
    if fault is not None and case not in ("sigint", "kill_close", "kill_server"):
        for r, rec in ranks.items():
            if r == f["rank"] or rec is None or "ok" in rec:
                continue
            if "t_err" not in rec:
                out["problems"].append(f"rank {r}: no error recorded")
                continue
            dt = rec["t_err"] - fault["t"]
            worst = max(worst, dt)
            if dt > bound:
                out["problems"].append(f"rank {r}: error {dt:.2f} s after the fault (> {bound})")
            names_rank = re.search(rf"rank\(?s?\)? {f['rank']}\b", rec["msg"])
            if not names_rank:
                out["problems"].append(f"rank {r}: error does not name rank {f['rank']}: {rec['msg'][:300]}")
            if case not in ("skip",) and not re.search(OP_NAMES, rec["msg"]) and "set-up" not in rec["msg"]:
                out["problems"].append(f"rank {r}: error names no op: {rec['msg'][:300]}")
    out["worst"] = worst
    out["launch_s"] = launcher["t"] - fault["t"] if launcher and fault and launcher["t"] > fault["t"] else 0.0
    rc = out["rc"]
    if case == "init_kill":         # a rank that finished its ops (the fault came after its part) exits 0
        bad = [c for r, c in enumerate(rc) if r != f["rank"] and c != (0 if "ok" in (ranks[r] or {}) else 1)]
        if bad:
            out["problems"].append(f"init ranks' exit codes {rc}")
    elif case == "sigint":
        if fault is not None and rc[0] not in (130, -2, 0, 1):
            out["problems"].append(f"exit code {rc[0]} after SIGINT")
    else:
        frec = ranks.get(f["rank"]) or {}
        late = fault is not None and "ok" in frec and fault["t"] > frec["ok"]     # in close, or past it
        want = 1 if fault is not None else 0
        if rc[0] != want and not ((late or case in ("kill_close", "kill_server")) and rc[0] in (0, 1)):
            out["problems"].append(f"launcher exit code {rc[0]}, wanted {want}; stderr: {out['stderr'][0][-800:]}")
        if launcher is not None and launcher["err"] and fault is not None and case in ("kill", "kill_init", "stop"):
            if f"rank {f['rank']}" not in launcher["msg"].split("\n")[0]:
                out["problems"].append(f"launcher's lead line names another rank: {launcher['msg'][:300]}")
    from slicetrace.analyze.records import read_records
    from slicetrace.errors import TraceFormatError
    if launcher is not None and launcher["err"]:     # the lead line: one clear line, not a library's traceback
        lead = launcher["msg"].split("\n", 1)[0]
        # a library's error raw is unclear; our PeerError may quote it after saying what is gone
        if (re.search(r"(ConnectionRefused|BrokenPipe|EOFError|ConnectionReset)Error", lead)
                and "PeerError: rendezvous store" not in lead) or (
                case == "kill_server" and "store" not in lead and fault is not None and lead.startswith("rank")
                and "PeerError" not in lead and "died" not in lead):
            out["problems"].append(f"unclear launcher error: {lead[:300]}")
    for t in glob.glob(os.path.join(d, "trace", "*.json")):
        cut: list = []
        try:
            read_records(t, empty_ok=True, cut=cut)     # an array cut short: Chrome's format lets the ] go
        except TraceFormatError as e:
            out["problems"].append(f"TRACE {os.path.basename(t)}: {e}")
        if cut:
            out.setdefault("cut_traces", []).append(os.path.basename(t))


def main() -> int:
    if sys.argv[1:2] in (["--job"], ["--init-rank"]):      # as from a terminal: a trial run with `&` ignores it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.argv[1:2] == ["--job"]:
        return job_launch(json.loads(sys.argv[2]))
    if sys.argv[1:2] == ["--init-rank"]:
        return job_init_rank(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--out", default="/tmp/fault_trial")
    ap.add_argument("--json", default="", help="write every outcome here")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    table, outcomes = {}, []
    for case in a.cases.split(","):
        for i in range(a.trials):
            plan = plan_trial(case, rng, a.out, a.timeout, i)
            o = run_trial(plan, rng)
            outcomes.append({"plan": plan, **o})
            row = table.setdefault(case, [0, 0, 0, 0.0, 0.0])
            row[0] += 1
            row[1] += o["fault_fired"]
            row[2] += bool(o["problems"])
            row[3] = max(row[3], o.get("worst", 0.0))
            row[4] = max(row[4], o.get("launch_s", 0.0))
            print(f"{case:12} #{i} n={plan['nranks']} nch={plan['nch']} prof={int(plan['profile'])} "
                  f"rc={o['rc']} fired={int(o['fault_fired'])} worst={o.get('worst', 0):.2f}s "
                  f"launch={o.get('launch_s', 0):.2f}s " + ("OK" if not o["problems"] else
                  "FAIL " + " | ".join(o["problems"])), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(outcomes, f, indent=1)
    print(f"\n{'case':12} {'trials':>6} {'fired':>6} {'failures':>8} {'rank err s':>10} {'launch s':>8}")
    for case, (n, fired, bad, w, ls) in table.items():
        print(f"{case:12} {n:6} {fired:6} {bad:8} {w:10.2f} {ls:8.2f}")
    return int(any(row[2] for row in table.values()))


if __name__ == "__main__":
    sys.exit(main())
