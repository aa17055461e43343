"""What bench's --json file says of its run besides the rows: where and with what it ran (provenance), whether it
is complete (completeness), and its settings as JSON values (json_value)."""
from __future__ import annotations

import os
import signal

from ..errors import SliceTraceError


def provenance(backend: str, nranks: int, compare: str | None) -> dict:
    """Where and with what a sweep ran, for --json: results without their hardware are not comparable."""
    import datetime
    import platform

    import numpy as np
    from .. import __version__
    env = {"finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "python": platform.python_version(), "numpy": np.__version__,
           "slicetrace": __version__, "backend": backend, "ranks": nranks, "cpus": len(os.sched_getaffinity(0)),
           "cpu_model": next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                              if ln.startswith("model name")), platform.processor())}
    if backend == "cuda":
        try:
            import cupy
            rt = cupy.cuda.runtime
            names = [rt.getDeviceProperties(i)["name"] for i in range(rt.getDeviceCount())]
            env["gpus"] = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
            env["cupy"] = cupy.__version__
        except Exception as e:          # the run itself worked; say why this part is missing
            env["gpus"] = f"unknown ({type(e).__name__})"
    if compare:
        try:
            import torch
            env["torch"] = torch.__version__
            if compare == "nccl":
                v = torch.cuda.nccl.version()
                env["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:
            env["torch"] = f"unknown ({type(e).__name__})"
    return env


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def completeness(failed: BaseException | None) -> dict:
    """--json's mark: complete, or the rows measured before the run failed or was stopped, and why."""
    if failed is None:
        return {"complete": True}
    if isinstance(failed, SliceTraceError):
        why = f"failed: {str(failed).splitlines()[0]}"
    elif isinstance(failed, KeyboardInterrupt):
        why = "interrupted (Ctrl-C)"
    else:
        why = "terminated (SIGTERM)" if failed.code == 128 + signal.SIGTERM else f"exited ({failed.code})"
    return {"complete": False, "incomplete": why}


def json_value(v):
    """A setting as JSON keeps it (numbers, strings, null, a dict of them); anything else as its text."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    return str(v)
