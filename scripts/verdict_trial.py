"""How often `slicetrace report`'s verdicts name a planted straggler, and how often they name a rank in a healthy run.

Two steps, so one corpus of traces can be judged by two versions of the analyzer:

  gen   DIR --ranks 4 --runs 10 [--plant late|copy|busy --rank R --us U] [-b 64K -e 4M -n 20 -w 5]
        traced `slicetrace bench` runs into DIR/<config>/<i>/ (a plant is a profiler plugin of this module, loaded
        by SLICETRACE_PROFILER_PLUGIN, that slows rank R: late sleeps U us before each collective; copy sleeps U us
        in each of its worker's copies; busy binds the rank to the last CPU beside one spinning process per
        rank, and the other ranks to the other CPUs)
  judge DIR [DIR ...]
        per config: runs whose report names each rank as straggler, most waited on, or a slow link's end

Run with PYTHONPATH=src:scripts from the repository root.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time

TRIAL_ENV = "VERDICT_TRIAL"         # "mode:rank:us", read by the plant plugin in each rank


class Plant:
    """The profiler plugin that slows one rank (TRIAL_ENV); every other rank it leaves alone."""
    version, name = 8, "verdict_plant"

    def _init(self, comm, mask):
        mode, rank, us = os.environ[TRIAL_ENV].split(":")
        self.late_s = 0.0
        if comm is None or comm.rank != int(rank):
            return None
        if mode == "late":
            from slicetrace.events.abi import EventType
            mask.value |= int(EventType.COLL)               # its start_event sees each collective
            self.late_s = float(us) / 1e6
        elif mode == "copy":
            import slicetrace.backend.cpu.worker as w
            real, pause = w.np, float(us) / 1e6

            class Slow:
                def __getattr__(self, k):
                    return getattr(real, k)

                @staticmethod
                def copyto(*a, **k):
                    time.sleep(pause)
                    return real.copyto(*a, **k)
            w.np = Slow()
        return None

    def init(self, comm, mask):
        ctx = self._init(comm, mask)
        mode, rank, _ = os.environ[TRIAL_ENV].split(":")
        if mode == "busy" and comm is not None:
            cpus = os.sched_getaffinity(0)
            last = max(cpus)                                # the spinners' CPU: this rank's alone, the rest elsewhere
            for tid in os.listdir("/proc/self/task"):       # every thread of the rank, the worker's too
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), {last} if comm.rank == int(rank) else (cpus - {last} or cpus))
        return ctx

    def start_event(self, ctx, descr):
        from slicetrace.events.abi import CollDescr
        if self.late_s and isinstance(descr, CollDescr):
            time.sleep(self.late_s)
        return None

    def stop_event(self, handle, ts_ns):
        pass

    def record_event_state(self, handle, state, args):
        pass

    def finalize(self, ctx):
        pass


def gen(a) -> None:
    name = f"r{a.ranks}_{a.b}-{a.e}" + (f"_{a.plant}{a.rank}_{a.us}" if a.plant else "_ok")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(["src", "scripts", os.environ.get("PYTHONPATH", "")]))
    spin = None
    if a.plant:
        env[TRIAL_ENV] = f"{a.plant}:{a.rank}:{a.us}"
        env["SLICETRACE_PROFILER_PLUGIN"] = "verdict_trial:Plant"
        if a.plant == "busy":
            env["SLICETRACE_CPU_BIND"] = "off"              # else the rank's op thread is bound back
            spin = [subprocess.Popen(["taskset", "-c", str(max(os.sched_getaffinity(0))), sys.executable, "-c",
                                      "import time\nt=time.monotonic()+600\nwhile time.monotonic()<t: pass"])
                    for _ in range(a.ranks)]        # the slowed rank gets 1/(ranks+1) of its CPU, the others more
    try:
        for i in range(a.runs):
            out = os.path.join(a.dir, name, str(i))
            cmd = [sys.executable, "-m", "slicetrace", "bench", "--ranks", str(a.ranks), "-b", a.b, "-e", a.e,
                   "-n", str(a.n), "-w", str(a.w), "--trace", out]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            print(name, i, "rc", r.returncode, flush=True)
            if r.returncode:
                print(r.stdout[-2000:], r.stderr[-2000:])
    finally:
        for p in spin or ():
            p.kill()
            p.wait(timeout=10)


def _names(prefix: str) -> dict:
    from slicetrace.cli.main import main
    with tempfile.TemporaryDirectory() as tmp:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["report", prefix, "--json", os.path.join(tmp, "r.json")])
        doc = json.load(open(os.path.join(tmp, "r.json")))
    text = " ".join(buf.getvalue().split())
    assert rc == 0, text
    m = re.search(r"most waited on: rank (\d+),", text)
    return {"straggler": sorted(r["rank"] for r in doc["stragglers"] if r["consistent"]),
            "waited": [int(m.group(1))] if m else [],
            "slow_link": sorted({(d["src"], d["dst"]) for d in doc["slow_links"]})}


def judge(dirs: list[str]) -> None:
    for top in dirs:
        for cfg in sorted(os.listdir(top)):
            runs = sorted(os.listdir(os.path.join(top, cfg)), key=int)
            got = []
            for i in runs:
                d = os.path.join(top, cfg, i)
                pre = sorted({re.sub(r"_\d+\.json$", "", f) for f in os.listdir(d) if f.endswith(".json")})
                got.append(_names(os.path.join(d, pre[0])) if pre else None)
            planted = re.search(r"_(late|copy|busy)(\d+)_", cfg)
            want = int(planted.group(2)) if planted else None
            line = [f"{cfg:28s} runs {len(got)}"]
            for k in ("straggler", "waited"):
                named = sum(bool(g and g[k]) for g in got)
                right = sum(bool(g and g[k] == [want]) for g in got) if planted else 0
                line.append(f"{k}: named {named}" + (f", rank {want} alone {right}" if planted else ""))
            line.append(f"slow_link: {sum(bool(g and g['slow_link']) for g in got)}")
            line.append("; ".join(f"{g['straggler']}/{g['waited']}" if g else "-" for g in got))
            print(" | ".join(line), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("dir")
    g.add_argument("--ranks", type=int, default=4)
    g.add_argument("--runs", type=int, default=10)
    g.add_argument("--plant", choices=("late", "copy", "busy"))
    g.add_argument("--rank", type=int, default=1)
    g.add_argument("--us", type=int, default=2000)
    g.add_argument("-b", default="64K")
    g.add_argument("-e", default="4M")
    g.add_argument("-n", type=int, default=20)
    g.add_argument("-w", type=int, default=5)
    j = sub.add_parser("judge")
    j.add_argument("dirs", nargs="+")
    a = p.parse_args()
    gen(a) if a.cmd == "gen" else judge(a.dirs)


if __name__ == "__main__":
    main()
