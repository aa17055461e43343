"""Output files replaced whole: a reader, or a write that fails half-way, never leaves half of one."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Iterator


STDOUT = "-"         # an output path meaning standard output, as Unix tools take it


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kw: Any) -> Iterator[Any]:
    """open(path, mode, **kw) for writing, through a temporary file in the same folder renamed over `path` once
    the block ends; on any error (a full disk, an exception in the block) the temporary file is removed and `path`
    is left as it was. A path that exists and is not a regular file (/dev/stdout, a FIFO) is written in place:
    a rename would replace the device node itself. STDOUT ('-') is the process's standard output (its bytes for a
    binary mode), flushed, not closed."""
    p = os.fspath(path)
    if p == STDOUT:
        f = sys.stdout.buffer if "b" in mode else sys.stdout
        yield f
        f.flush()
        return
    if os.path.exists(p) and not os.path.isfile(p):
        with open(p, mode, **kw) as f:
            yield f
        return
    target = os.path.realpath(p)            # a symbolic link stays one: the file it names is replaced
    tmp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, mode, **kw) as f:
            yield f
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """`text` as the whole of `path` (utf-8), or `path` unchanged: readers (a textfile collector) never see half."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)
