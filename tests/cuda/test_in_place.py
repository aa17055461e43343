"""In place on the cuda backend, laid out as nccl-tests does (all_gather's input is this rank's block of the
output, reduce_scatter's output this rank's block of the input, the others one buffer), checked by the bench."""
from __future__ import annotations

import json

import pytest


@pytest.mark.cuda
def test_bench_in_place_every_collective_matches_numpy(gpu, kcache, tmp_path, monkeypatch):
    from slicetrace.cli.main import main
    monkeypatch.setenv("SLICETRACE_CACHE_DIR", kcache)
    out = tmp_path / "ip.json"
    assert main(["bench", "--backend", "cuda", "--ranks", "2", "--op", "all", "--inplace", "-b", "12", "-e", "12M",
                 "-f", "32", "-n", "2", "-w", "1", "-d", "float32", "--json", str(out)]) == 0
    rows = json.load(open(out))["rows"]
    assert len(rows) == 7 * 5 and all(r["wrong"] == 0 for r in rows)
    assert {r["op"] for r in rows if r["inplace"]} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                       "reduce"}
