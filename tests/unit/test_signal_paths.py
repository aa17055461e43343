"""Signal handlers slicetrace sets and must take away again: SIGTERM-as-exit once the last profiled communicator
closed off the main thread, and what a forked child inherits from a hold or set-up's SIGTERM window."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLICETRACE_", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code, *args], timeout=120, cwd=str(ROOT), env=env,
                          capture_output=True, text=True)


def test_sigterm_kills_again_once_the_last_profiled_communicator_closed_off_the_main_thread(tmp_path):
    """close() in another thread cannot set a handler: SIGTERM kept raising SystemExit(143) for good (a program
    that catches SystemExit, or waits in a finally, was no longer stopped by it). Set-up's window still exits."""
    code = ("import signal, sys, threading, slicetrace\n"
            "from slicetrace.backend.segment import sigterm_exits\n"
            "c = slicetrace.init(backend='null', profiler_plugin='example', profile_dump_file=sys.argv[1] + '/a')\n"
            "t = threading.Thread(target=c.close)\nt.start()\nt.join(60)\nassert not t.is_alive()\n"
            "try:\n    with sigterm_exits():\n        signal.raise_signal(signal.SIGTERM)\n"
            "except SystemExit as e:\n    assert e.code == 143, e.code\n"
            "else:\n    sys.exit('set-up window: no SystemExit')\n"
            "signal.raise_signal(signal.SIGTERM)\n"
            "sys.exit(7)\n")
    p = _script(code, str(tmp_path))
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stderr)
