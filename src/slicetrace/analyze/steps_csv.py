"""The KernelStep table as CSV (`slicetrace report --csv`), for pandas or a spreadsheet."""
from __future__ import annotations

import os

import numpy as np

from .atomic import atomic_open
from .trace import KERNEL_STEP_TABLE

STEPS_CSV_COLUMNS = KERNEL_STEP_TABLE.names + ("wait_us", "transfer_us", "gbps")
_ROWS = 1 << 15


def write_steps_csv(ks: np.ndarray, path: str | os.PathLike, comms: np.ndarray | None = None) -> int:
    """kernel_steps()'s table as CSV, one KernelStep per row, in time order, plus the wait (ready - wait), the
    transfer (done - ready) and its GB/s (0 for a zero-length transfer): for pandas or a spreadsheet. Rows written.
    comms (several communicators' rows, `report --all-comms`): each row's commHash, a first column "comm"."""
    order = np.argsort(ks["wait_ns"], kind="stable")
    ks = ks[order]
    wait_us = (ks["ready_ns"] - ks["wait_ns"]) / 1e3
    xfer_ns = ks["done_ns"] - ks["ready_ns"]
    gbps = np.divide(ks["size"], xfer_ns, out=np.zeros(len(ks)), where=xfer_ns > 0)
    cols = [ks[n] for n in KERNEL_STEP_TABLE.names] + [wait_us, xfer_ns / 1e3, gbps]
    cols = cols if comms is None else [comms[order]] + cols
    line = ",".join("%.3f" if c.dtype.kind == "f" else "%d" for c in cols) + "\n"      # as f"{v:.3f}", str(v)
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        f.write(",".join(STEPS_CSV_COLUMNS if comms is None else ("comm",) + STEPS_CSV_COLUMNS) + "\n")
        for i in range(0, len(ks), _ROWS):      # a block's rows as Python values at a time, not every row's
            f.write("".join(line % row for row in zip(*(c[i:i + _ROWS].tolist() for c in cols))))
    return len(ks)
