"""The cuda backend's completion: waiting on an op's event against a deadline, and what turns a stuck, aborted or
mismatched op into an error (the watchdog asks the same questions of an op nobody waits on)."""
from __future__ import annotations

import time
from typing import Any

from ...errors import CommTimeoutError, MismatchError, PeerError, credit
from .tokens import Token


class Completion:
    """Mixed into CudaBackend (its mem, store, sigs, order, ledger, watch, _pending, _prefix, _last and _broken)."""

    def done(self, token: Token) -> bool:
        return bool(token.event.done)

    def wait(self, token: Token, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        next_store = time.monotonic() + 0.25
        pause = 0.0
        while not token.event.done:
            now = time.monotonic()
            if self.mem.words[1]:
                break                                        # the kernel saw an abort word and exits
            if now > deadline:
                self._fail(self._mismatch(token) or CommTimeoutError(
                    f"rank {self.rank}: op {token.tag} did not finish within timeout_s={timeout_s}; aborted; "
                    f"{self.mem.progress(self._side)}"), token)
            if now > next_store:
                next_store = now + 0.25
                err = self._mismatch(token)
                if err is not None:
                    self._fail(err, token)
                why = self.cannot_finish(token)
                if why is not None:
                    self._fail(PeerError(why), token)
            time.sleep(pause)
            pause = min(pause * 2 + 1e-5, 1e-3)
        if self.mem.words[1]:
            why = self._abort_reason()
            self._fail(self._mismatch(token) or PeerError(
                f"rank {self.rank}: op {token.tag} was aborted" + (f": {why}" if why else " (abort word raised)")),
                token)
        if token.sig is not None:
            why = self.sigs.differs(token.sig)      # ended, but a peer ran another collective (it raises too)
            if why is not None:
                self._fail(MismatchError(f"rank {self.rank}: {why}"), token)

    def _mismatch(self, token: Token) -> MismatchError | None:
        why = self.mismatch(token.sig)
        return None if why is None else MismatchError(f"rank {self.rank}: {why}")

    def mismatch(self, sig: tuple | None = None) -> str | None:
        """Why this rank's collectives (sig, else every one kept) differ from a peer's, or why its messages and a
        peer's collective, issued in different orders, wait on each other (order.P2pOrder), else None."""
        if self.sigs is None:
            return None
        why, last = self.sigs.differs(sig) or self.sigs.first_difference(), self._last
        if why is None and last is not None and (self.mem.words[1] or not last.event.done):
            why = self.order.find()         # only ops still waiting (or that an abort ended) can be in such a cycle
        return why

    def cannot_finish(self, token: Token) -> str | None:
        """Why op `token` can never finish (a peer aborted, or one it needs is gone), else None."""
        if token.event.done:            # it ended: only an exit on an abort word makes it wrong (a peer that
            if not self.mem.words[1]:   # aborts after our ops all ended breaks nothing of ours)
                return None
            why = self._abort_reason()
            return f"rank {self.rank}: op {token.tag} exited on an abort word" + (f": {why}" if why else "")
        why = self._abort_reason()
        if why is not None:
            return f"rank {self.rank}: a peer aborted: {why}"
        gone = self.watch.gone(self._pending.peers(token), self._did_its_part)
        return None if gone is None else f"rank {self.rank}: op {token.tag} cannot finish: {gone}"

    def _abort_reason(self) -> str | None:
        """What the rank that aborted this communicator wrote in the store, else None."""
        why = self.store.try_get(f"{self._prefix}/abort")
        return None if why is None else why.decode(errors="replace")

    def _did_its_part(self, p: int) -> bool:
        """A closed peer that sent all we receive from it and ran all our collectives (its ledger, published first)."""
        return self.ledger.did_its_part(self.store.try_get(f"{self._prefix}/sent/{p}"), self.rank, p,
                                        0 if self.sigs is None else self.sigs.seq)

    @property
    def last_token(self) -> Token | None:
        return self._last

    def running_token(self) -> tuple[Token | None, str]:
        """The op a failure stops: the earliest launched op not done (the host may have launched hundreds more
        behind it), else the last one; and a note on the ops queued behind it, for the error."""
        first, behind = self._pending.oldest()
        if first is None:
            return self._last, ""
        return first, (f"; {behind} op(s) launched after it will not run" if behind else "")

    @property
    def broken(self) -> str | None:
        return self._broken

    def unreceived(self) -> list[str]:
        return self._lost

    def check_peers(self, closing: bool = False) -> None:
        """closing (the close barrier's check): a peer that closed its communicator is on its way to the barrier,
        not gone; one whose process died before it got there is (one that got there may exit)."""
        why = self._abort_reason()
        if why is not None:
            raise PeerError(f"rank {self.rank}: a peer aborted: {why}")
        peers = tuple(p for p in range(self.world) if p != self.rank and not (
            closing and self.store.try_get(f"{self._prefix}/close/{p}") is not None))
        gone = self.watch.gone(peers, closed_ok=closing)
        if gone is not None:
            raise PeerError(f"rank {self.rank}: {gone}")

    def _fail(self, err: Exception, token: Token) -> None:
        """Abort on err and raise it, credited to token's op, or to the earlier op still running on the GPU (not to
        a later op whose submit or wait found it)."""
        first, _ = self._pending.oldest()
        if first is not None and first.tag < token.tag:
            token = first
        self.abort(str(err), type(err), token.op)
        self._told = True
        ends_within(token.event, 10.0)                             # the kernel polls the abort words and exits
        raise credit(err, token.op)

    def abort(self, reason: str, kind: type = PeerError, op: tuple[str, int] | None = None) -> None:
        """Raise the abort words; the first abort's reason, kind and op (None: not known) are what later ops raise."""
        if self._broken is None:        # kind and op first: another thread reads _broken, then those
            self._broken_as, self._broken_op, self._broken = kind, op, reason
        if not self.mem.raise_abort(self._side):        # closed: its words are freed (a late watchdog)
            return
        try:
            if self.store.try_get(f"{self._prefix}/abort") is None:
                self.store.set(f"{self._prefix}/abort", f"rank {self.rank}: {reason}".encode())
        except Exception:
            pass


def ends_within(event: Any, timeout_s: float) -> bool:
    """Whether the event completes within timeout_s."""
    end = time.monotonic() + timeout_s
    while not event.done and time.monotonic() < end:
        time.sleep(1e-3)
    return bool(event.done)
