"""Watch how many trace files' records a reader holds at once (convert and report read one file at a time)."""
from __future__ import annotations

import gc
import weakref


class Records(list):            # a list that a weak reference can watch
    pass


def one_file_at_a_time(monkeypatch) -> list:
    """Patch the readers so each read asserts no earlier file's records are still alive; returns the weak
    references, one per file read."""
    from slicetrace.analyze import records, runfiles, trace
    alive: list = []

    def read(path, *a, **kw):
        gc.collect()
        held = sum(r() is not None for r in alive)
        got = Records(records.read_records(path, *a, **kw))
        alive.append(weakref.ref(got))
        assert held == 0, f"{held} file(s)' records still held when reading {path}"
        return got
    monkeypatch.setattr(trace, "_read", read)            # load_files' reader
    monkeypatch.setattr(runfiles, "read_records", read)  # the one-file-at-a-time reader's
    return alive
