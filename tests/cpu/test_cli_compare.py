"""`slicetrace bench --compare gloo` end to end, with and without --rounds (skipped without torch)."""
import json

import pytest

from slicetrace.cli.main import main

pytest.importorskip("torch", reason="torch is not installed: --compare gloo cannot run here")


@pytest.mark.timeout(240)
def test_compare_rounds_prints_the_median_ratio_with_its_interval_and_keeps_it_in_the_json(tmp_path, capfd):
    out = tmp_path / "r.json"
    assert main(["bench", "--compare", "gloo", "--rounds", "2", "-b", "4K", "-e", "8K", "-n", "2", "-w", "1",
                 "--ranks", "2", "--json", str(out)]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert ", compare gloo in 2 ABBA rounds" in lines[0]
    head = next(ln for ln in lines if ln.startswith("#") and "ratio" in ln)
    assert head.endswith("ref_us  ref_bus  ratio [1 ratio: no interval]")      # 2 rounds: one quad
    rows = json.load(open(out))["rows"]
    assert [r["size"] for r in rows] == [4096, 8192] and all(r["wrong"] == 0 for r in rows)
    table = [ln for ln in lines if ln[:1] != "#"]
    for r, ln in zip(rows, table):
        assert r["ratio_quads"] == 1 and r["ratio_ci_coverage_pct"] == 0.0
        # one quad: its ratio is the median, the interval and the spread are that one value
        assert r["ratio_ci95"] == [r["ratio"]] * 2 and r["ratio_iqr"] == [r["ratio"]] * 2
        assert r["ratio"] > 0 and r["time_us"] > 0 and r["ref_time_us"] > 0
        assert ln.split()[-1] == f"{r['ratio']:.2f}"       # one ratio prints no interval
    assert len(table) == 2


@pytest.mark.timeout(240)
def test_compare_rounds_gives_an_interval_from_two_quads_and_one_block_compare_stays_as_it_was(tmp_path, capfd):
    out = tmp_path / "r.json"
    assert main(["bench", "--compare", "gloo", "--rounds", "4", "-b", "4K", "-e", "4K", "-n", "2", "-w", "1",
                 "--ranks", "2", "-c", "0", "--json", str(out)]) == 0
    text = capfd.readouterr().out
    (r,) = json.load(open(out))["rows"]
    lo, hi = r["ratio_ci95"]
    assert r["ratio_quads"] == 2 and r["ratio_ci_coverage_pct"] == 50.0 and lo <= r["ratio"] <= hi
    assert "ratio [50% CI of the median]" in text and f"{r['ratio']:.2f} [{lo:.2f}, {hi:.2f}]" in text
    assert main(["bench", "--compare", "gloo", "-b", "4K", "-e", "4K", "-n", "2", "-w", "1", "--ranks", "2",
                 "-c", "0", "--json", str(out)]) == 0
    lines = capfd.readouterr().out.splitlines()
    (r,) = json.load(open(out))["rows"]
    assert not {"ratio_ci95", "ratio_iqr", "ratio_quads"} & set(r)
    assert lines[0].endswith(", compare gloo (one block each: --rounds 12 for ABBA rounds and an interval)"), lines[0]
    assert next(ln for ln in lines if ln.startswith("#") and "ratio" in ln).endswith("ref_bus  ratio")
    assert r["ratio"] == pytest.approx(r["ref_time_us"] / r["time_us"])       # one block each: the plain ratio
