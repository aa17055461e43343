"""The op a cuda failure is credited to: the earliest launched op not done (the one the GPU runs), not the last
launched (the host may be hundreds of ops ahead of the GPU)."""
from __future__ import annotations

from slicetrace.backend.cuda.tokens import Pending, Token


class _Ev:
    def __init__(self, done: bool = False):
        self.done = done


def _tok(tag: int, done: bool = False) -> Token:
    return Token(_Ev(done), tag, (1,), 0, None, ("all_reduce", tag))


def test_oldest_is_the_first_op_not_done_and_counts_the_ops_behind_it():
    p = Pending()
    toks = [_tok(t) for t in range(1, 8)]
    for t in toks:
        p.add(t)
    assert p.oldest() == (toks[0], 6)
    for t in toks[:3]:                  # the GPU finished three: the fourth runs, three more wait behind it
        t.event.done = True
    assert p.oldest() == (toks[3], 3)
    for t in toks:
        t.event.done = True
    assert p.oldest() == (None, 0)


def test_done_ops_leave_the_queue_as_new_ones_come():
    p = Pending()
    a, b = _tok(1, done=True), _tok(2)
    p.add(a)
    p.add(b)
    c = _tok(3)
    p.add(c)
    assert p.oldest() == (b, 1)
