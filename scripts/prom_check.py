#!/usr/bin/env python3
"""linkstats .prom files through the tests' strict Prometheus reader (tests/helpers/prom.py): each file's metric
families and its per-direction link bytes. Run from the repository root: `PYTHONPATH=src:. python
scripts/prom_check.py DIR/st_*.prom`; a file the reader refuses fails the run."""
import sys

from tests.helpers.prom import parse, series

for f in sys.argv[1:]:
    with open(f, encoding="utf-8") as fh:
        fams = parse(fh.read())
    print(f, "families", len(fams), "bytes by direction", series(fams, "slicetrace_link_bytes_total", "direction"))
