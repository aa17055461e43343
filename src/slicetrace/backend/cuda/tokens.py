"""Completion tokens of a cuda communicator's ops, and the ops still running: they run in issue order, so an op
cannot finish without the peers of every earlier op still ahead of it (what the watchdog and wait() judge)."""
from __future__ import annotations

from collections import deque
from typing import Any


class Token:
    __slots__ = ("event", "tag", "peers", "stream", "sig", "op")

    def __init__(self, event: Any, tag: int, peers: tuple[int, ...], stream: int, sig: tuple | None,
                 op: tuple[str, int] | None = None):
        self.event, self.tag, self.peers = event, tag, peers      # peers: the ranks the op cannot finish without
        self.stream, self.sig = stream, sig                       # sig: a collective's (opsig), else None
        self.op = op            # (func, SeqNum): what its failure is credited to (errors.credit)


class Pending:
    """Launched ops not seen done yet. The caller's thread adds; the watchdog reads a copy."""

    def __init__(self) -> None:
        self._q: deque[Token] = deque()

    def add(self, tok: Token) -> None:
        q = self._q
        while q and q[0].event.done:    # events complete in issue order: the done ones are at the front
            q.popleft()
        q.append(tok)

    def oldest(self) -> tuple[Token | None, int]:
        """The earliest launched op not done yet (the one its stream is running: a failure stops it, and the ops
        launched behind it never run) and how many were launched after it; (None, 0) when all are done."""
        q = tuple(self._q)
        for i, t in enumerate(q):
            if not t.event.done:
                return t, len(q) - 1 - i
        return None, 0

    def peers(self, tok: Token) -> tuple[int, ...]:
        """tok's peers and those of the earlier ops that have not finished."""
        out = set(tok.peers)
        for t in tuple(self._q):
            if t.tag < tok.tag and not t.event.done:
                out.update(t.peers)
        return tuple(sorted(out))
