"""One error hierarchy for slicetrace. Every error names the bad value and what is accepted."""
from __future__ import annotations

import difflib
from typing import Iterable


class SliceTraceError(Exception):
    """Base of every error slicetrace raises on purpose."""
    failed_op: tuple[str, int] | None = None    # the op a communicator's failure is told with (credit); None: none


class ConfigError(SliceTraceError, ValueError):
    """A setting, argument or environment variable has a value we do not accept."""


class UsageError(SliceTraceError, ValueError):
    """An operation was called with arguments that cannot work (shape, dtype, rank, buffer kind)."""


class MismatchError(SliceTraceError):
    """Ranks disagree on an operation (kind, count, dtype, root, peer)."""


class BackendError(SliceTraceError, RuntimeError):
    """The backend failed (compile, launch, shared memory, device)."""


class CompileError(BackendError):
    """Kernel compilation failed; the message carries the log and the numbered source."""


class PeerError(SliceTraceError, RuntimeError):
    """A peer rank died, aborted or did not arrive in time."""


class CommTimeoutError(PeerError, TimeoutError):
    """A wait ran past its timeout."""


class LaunchError(PeerError):
    """A rank started by slicetrace.launch() failed; `errors` maps rank -> that rank's error and traceback."""

    def __init__(self, msg: str, errors: dict | None = None):
        super().__init__(msg)
        self.errors = errors or {}


class PluginError(SliceTraceError):
    """A profiler plugin could not be loaded or initialised."""


class TraceFormatError(SliceTraceError, ValueError):
    """A trace file does not have the shape the analyzer expects."""


def credit(e: BaseException, op: tuple[str, int] | None) -> BaseException:
    """e, credited to `op` (its function and SeqNum, -1 for none), or None: to no op, for the plugins' comm_failed.
    The first credit stands: a backend that knows which op a failure belongs to (an earlier one, found at a later
    submit or wait) credits it before the session would credit the op whose submit raised it."""
    if isinstance(e, SliceTraceError) and "failed_op" not in e.__dict__:
        e.failed_op = op
    return e


def plural(n: int, noun: str, nouns: str = "") -> str:
    """'1 element', '3 elements' (nouns: an irregular plural): a count in a message reads right."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def comm_label(comm_hash: int, name: str) -> str:
    """A communicator as messages name it (one process may hold several): its commHash as its traces show it, in
    their file names and CommHash args, and its name (init(name=...))."""
    return f"comm_hash={comm_hash}, name={name!r}"


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name a misspelt `word` most likely meant, for a "did you mean" hint: one that differs in case
    only, else difflib's closest (None: nothing close)."""
    known = sorted(known)
    return next((k for k in known if k.lower() == word.lower()), None) or \
        next(iter(difflib.get_close_matches(word, known, 1)), None)


def ours(summary: str) -> bool:
    """Whether a "TypeName: message" line names one of these errors (a rank's failure relayed as text): bad input,
    a timeout, a peer that left, rather than a bug, whose traceback is worth showing."""
    return summary.split(":", 1)[0] in _NAMES


_NAMES = {n for n, c in dict(globals()).items() if isinstance(c, type) and issubclass(c, SliceTraceError)}
