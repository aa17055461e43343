"""RowFormat's shared leading digits (sinks/chrome_text.py): a %d column whose rows all share their leading digits
(a clock over a short span, ids from one base) has them written as template text and only the rest computed,
zero-filled. The bytes must be those of one % per block."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slicetrace.sinks.chrome_text import CH_LINES, STEP_LINE, RowFormat

# bases on and around 4-digit group boundaries and powers of ten, where a prefix split can go wrong
_BASE = st.one_of(st.sampled_from([10**4, 10**8 - 1, 10**8, 10**12, 10**12 - 7, 99_990_000, 123_4567_8900_0000,
                                   2**53, 10**17]), st.integers(10**4, 10**17))
_SPAN = st.sampled_from([1, 9, 10, 9_999, 10_000, 10**6, 10**9])


def _cols(line: str, n: int, bases: list[int], spans: list[int], seed: int) -> np.ndarray:
    """Each %d column: a base and offsets below a span (a %03d column: 0..999)."""
    rng = np.random.default_rng(seed)
    specs = _specs(line)
    cols = np.empty((n, len(specs)), np.int64)
    for j, spec in enumerate(specs):
        cols[:, j] = (rng.integers(0, 1000, n) if spec == "%03d"
                      else bases[j % len(bases)] + rng.integers(0, spans[j % len(spans)], n))
    return cols


def _specs(line: str) -> list[str]:
    out, i = [], 0
    while (i := line.find("%", i)) >= 0:
        spec = "%03d" if line.startswith("%03d", i) else "%d"
        out.append(spec)
        i += len(spec)
    return out


@settings(max_examples=60, deadline=None)
@given(bases=st.lists(_BASE, min_size=1, max_size=6), spans=st.lists(_SPAN, min_size=1, max_size=4),
       n=st.sampled_from([64, 100, 1000]), seed=st.integers(0, 2**16), steps=st.booleans())
def test_columns_with_shared_leading_digits_give_the_bytes_of_one_percent(bases, spans, n, seed, steps):
    line = STEP_LINE if steps else CH_LINES
    cols = _cols(line, n, bases, spans, seed)
    want = ((line * n) % tuple(cols.ravel().tolist())).encode("ascii")
    assert bytes(RowFormat(line, compact=True)(cols)) == want
    # padded: only a column whose rows differ in width is padded; with one width per column, no byte differs
    same_width = all(len(str(int(cols[:, j].min()))) == len(str(int(cols[:, j].max())))
                     for j, s in enumerate(_specs(line)) if s == "%d")
    padded = bytes(RowFormat(line)(cols))
    if same_width:
        assert padded == want
    assert padded.replace(b" ", b"") == want.replace(b" ", b"")


def test_a_clock_column_over_a_short_span_keeps_every_digit():
    """Host-clock ns over 0.3 s an hour into the uptime: the shared digits are written once per block as text,
    the rest per row; each row still reads its own value."""
    n = 1000
    wait = np.sort(np.random.default_rng(3).integers(3_600_000_000_000, 3_600_300_000_000, n))
    cols = np.zeros((n, len(_specs(STEP_LINE))), np.int64)
    cols[:, 11] = wait                       # WaitGpuClk
    cols[:, 2], cols[:, 3] = wait // 1000, wait % 1000       # ts
    cols[:, 15] = 9_007_199_254_000_000 + np.arange(n)       # ParentId: ids from one base
    text = bytes(RowFormat(STEP_LINE)(cols)).decode("ascii")
    assert text == (STEP_LINE * n) % tuple(cols.ravel().tolist())
    assert f'"WaitGpuClk":{wait[-1]},' in text and '"ParentId":9007199254000999}' in text


@settings(max_examples=60, deadline=None)
@given(seps=st.lists(st.sampled_from(["", ",", ":", '":', ',"a":', "}{"]), min_size=2, max_size=6),
       fracs=st.lists(st.booleans(), min_size=1, max_size=5), bases=st.lists(_BASE, min_size=1, max_size=4),
       spans=st.lists(_SPAN, min_size=1, max_size=4), n=st.sampled_from([64, 100]), seed=st.integers(0, 2**16))
def test_fields_close_to_each_other_or_to_the_row_start_keep_their_neighbours(seps, fracs, bases, spans, n, seed):
    """A field's digits go into the row as 4-byte words whose first one also covers the template bytes before it
    (chrome_text._words): with separators of 0-3 bytes between fields, and a field at the row's start, every
    byte is still that of one % per block (compact), and the padded form differs only in spaces."""
    line = "".join(sep + ("%d.%03d" if fracs[i % len(fracs)] else "%d") for i, sep in enumerate(seps)) + "\n"
    cols = _cols(line, n, bases, spans, seed)
    small = np.random.default_rng(seed).integers(0, 10**6, n)
    cols[:, 0] = small                      # the first field: narrow values mixed with wide ones
    want = ((line * n) % tuple(cols.ravel().tolist())).encode("ascii")
    assert bytes(RowFormat(line, compact=True)(cols)) == want
    padded = bytes(RowFormat(line)(cols))
    assert padded.replace(b" ", b"") == want.replace(b" ", b"")
    assert padded.count(b"\n") == n
