"""`slicetrace diff`: real bench --json files, and copies of them with a planted regression, a wrong result, a missing
row or another setup; the verdict rules (analyze/diff.py) against hypothesis."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from slicetrace.analyze import diff
from slicetrace.analyze.diff import Stats, compare_rows, verdict
from slicetrace.cli.main import main

SIZES = (4096, 8192, 16384)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    """One real sweep, three cycles: three samples per row, so the range rule applies."""
    path = tmp_path_factory.mktemp("diff") / "base.json"
    assert main(["bench", "-b", "4K", "-e", "16K", "-n", "3", "-w", "1", "-N", "3", "--json", str(path)]) == 0
    d = json.loads(path.read_text())
    assert d["complete"] and sorted({r["size"] for r in d["rows"]}) == list(SIZES) and len(d["rows"]) == 9
    return d


def _write(tmp_path, name: str, d: dict) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


def _rows(d: dict, size: int) -> list[dict]:
    return [r for r in d["rows"] if r["size"] == size]


def _diff(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["diff", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _steady(d: dict) -> dict:
    """Each size's samples all equal to its first: any subset of them has the same median and range."""
    d = copy.deepcopy(d)
    for size in SIZES:
        first = _rows(d, size)[0]
        for r in _rows(d, size):
            r.update(busbw=first["busbw"], algbw=first["algbw"], time_us=first["time_us"])
    return d


def _slower(d: dict, size: int, factor: float) -> dict:
    """Every sample of one size well below BASE's slowest sample: beyond the threshold and outside BASE's range."""
    new = copy.deepcopy(d)
    low = min(r["busbw"] for r in _rows(d, size))
    for r in _rows(new, size):
        r["busbw"], r["algbw"] = low * factor, low * factor
        r["time_us"] = r["size"] / (low * factor) / 1e3
    return new


def test_a_run_against_itself_is_the_same_everywhere_and_exits_0(tmp_path, capsys, base):
    p = _write(tmp_path, "base.json", base)
    out = tmp_path / "diff.json"
    rc, text, _ = _diff(capsys, p, p, "--json", str(out))
    assert rc == 0, text
    assert "# 3 rows compared: 0 regression(s), 0 wrong, 0 improved, 0 within noise, 3 same" in text
    assert text.rstrip().endswith("# OK: no regression")
    got = json.loads(out.read_text())
    assert [r["verdict"] for r in got["rows"]] == ["same"] * 3 and not got["failed"]
    assert [r["metrics"]["busbw"]["base"]["samples"] for r in got["rows"]] == [3, 3, 3]


def test_a_planted_regression_fails_with_its_size_and_change(tmp_path, capsys, base):
    new = _write(tmp_path, "new.json", _slower(base, 8192, 0.5))
    out = tmp_path / "diff.json"
    rc, text, _ = _diff(capsys, _write(tmp_path, "base.json", base), new, "--json", str(out))
    assert rc == 1, text
    line = next(ln for ln in text.splitlines() if " 8192 " in ln and not ln.startswith("#"))
    assert "regression" in line
    rows = {r["size"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows[8192]["verdict"] == "regression" and rows[8192]["metrics"]["busbw"]["change_pct"] < -50
    assert rows[4096]["verdict"] == rows[16384]["verdict"] == "same"
    assert "# FAILED: regression in NEW" in text
    # the same drop the other way round is an improvement, which passes
    rc, text, _ = _diff(capsys, new, _write(tmp_path, "base.json", base))
    assert rc == 0 and "1 improved" in text, text


def test_a_drop_below_the_threshold_or_inside_the_range_is_no_regression(tmp_path, capsys, base):
    steady, new = _steady(base), _steady(base)      # ranges of one point: the threshold alone decides
    for r in _rows(new, 4096):
        r["busbw"] *= 0.97                          # 3 % slower: under the default 5 %
    p, n = _write(tmp_path, "b.json", steady), _write(tmp_path, "n.json", new)
    assert _diff(capsys, p, n)[0] == 0
    rc, text, _ = _diff(capsys, p, n, "--threshold", "1")
    assert rc == 1 and "1 regression(s)" in text, text
    # the median 20 % down but one sample still at BASE's best: the ranges overlap, within noise
    noisy = _slower(steady, 16384, 0.8)
    best = _rows(steady, 16384)[0]
    _rows(noisy, 16384)[0].update(busbw=best["busbw"], time_us=best["time_us"])
    rc, text, _ = _diff(capsys, p, _write(tmp_path, "noisy.json", noisy))
    assert rc == 0 and "1 within noise" in text, text


def test_a_wrong_result_in_new_fails_whatever_the_speed(tmp_path, capsys, base):
    new = copy.deepcopy(base)
    _rows(new, 16384)[1]["wrong"] = 7
    rc, text, _ = _diff(capsys, _write(tmp_path, "b.json", base), _write(tmp_path, "n.json", new))
    assert rc == 1
    assert "1 wrong" in text and "# FAILED: wrong result in NEW" in text
    line = next(ln for ln in text.splitlines() if " 16384 " in ln)
    assert "WRONG" in line and " 7 " in line


def test_rows_on_one_side_only_are_listed_not_errors(tmp_path, capsys, base):
    new = copy.deepcopy(base)
    new["rows"] = [r for r in new["rows"] if r["size"] != 4096]
    extra = {**_rows(base, 16384)[0], "size": 32768, "count": 8192, "wrong": 2}
    new["rows"].append(extra)
    rc, text, _ = _diff(capsys, _write(tmp_path, "b.json", base), _write(tmp_path, "n.json", new))
    assert "# only in BASE: all_reduce 4096 B float sum, 2 ranks, cpu, 3 samples" in text
    assert "# only in NEW: all_reduce 32768 B float sum, 2 ranks, cpu, 1 sample, 2 wrong" in text
    assert rc == 1, text        # a new row's wrong result fails too; without it, the missing row alone passes
    extra["wrong"] = 0
    assert _diff(capsys, _write(tmp_path, "b.json", base), _write(tmp_path, "n.json", new))[0] == 0


def test_a_different_setup_is_a_warning_naming_each_difference_and_an_error_with_strict(tmp_path, capsys, base):
    new = copy.deepcopy(base)
    new["bench"]["iters"], new["settings"]["nchannels"], new["settings"]["timeout_s"] = 20, 4, 5.0
    p, n = _write(tmp_path, "b.json", base), _write(tmp_path, "n.json", new)
    rc, text, _ = _diff(capsys, p, n)
    assert rc == 0
    warn = next(ln for ln in text.splitlines() if ln.startswith("# warning: the runs are set up differently"))
    assert "-n (iters) 3 -> 20" in warn and "settings.nchannels 0 -> 4" in warn
    assert "timeout" not in warn                # a wait's limit does not change what is measured
    rc, _, err = _diff(capsys, p, n, "--strict")
    assert rc == 2 and "--strict" in err and "-n (iters) 3 -> 20" in err


def test_an_incomplete_run_is_compared_with_a_warning_and_an_empty_one_is_refused(tmp_path, capsys, base):
    new = _steady(base)
    new.update(complete=False, incomplete="interrupted (Ctrl-C)", rows=new["rows"][:4])
    p, n = _write(tmp_path, "b.json", _steady(base)), _write(tmp_path, "n.json", new)
    rc, text, _ = _diff(capsys, p, n)
    assert rc == 0 and f"# warning: NEW {n}: interrupted (Ctrl-C) (4 row(s)): the run did not complete" in text
    assert "# 3 rows compared" in text          # 4 rows of a 3-cycle sweep: every size has a sample
    new["rows"] = []
    rc, text, err = _diff(capsys, p, _write(tmp_path, "empty.json", new))
    assert rc == 2 and "have no row in common" in err and "the run did not complete" in text


def test_a_folder_or_glob_pools_its_files_rows(tmp_path, capsys, base):
    folder = tmp_path / "runs"
    folder.mkdir()
    one = copy.deepcopy(base)
    one["rows"] = one["rows"][:3]               # cycle 0 only: one sample per size
    for i in range(3):
        _write(folder, f"run{i}.json", one)
    out = tmp_path / "d.json"
    rc, text, _ = _diff(capsys, str(folder), str(folder / "run*.json"), "--json", str(out))
    assert rc == 0, text
    got = json.loads(out.read_text())
    assert len(got["base"]["files"]) == len(got["new"]["files"]) == 3
    assert {r["metrics"]["busbw"]["new"]["samples"] for r in got["rows"]} == {3}


def test_overhead_and_compare_columns_have_their_own_verdicts(tmp_path, capsys, base):
    b, n = copy.deepcopy(base), copy.deepcopy(base)
    for d, ovh, ratio in ((b, 4.0, 0.95), (n, 10.0, 0.95)):
        for r in d["rows"]:
            r.update(overhead_pct=ovh, ratio=ratio, ref_busbw=r["busbw"] / ratio)
    out = tmp_path / "d.json"
    rc, text, _ = _diff(capsys, _write(tmp_path, "b.json", b), _write(tmp_path, "n.json", n), "--json", str(out))
    assert rc == 1 and "overhead +4.0% -> +10.0% (+6.0 pt, regression)" in text, text
    row = json.loads(out.read_text())["rows"][0]
    assert row["metrics"]["overhead_pct"]["verdict"] == "regression"
    assert row["metrics"]["busbw"]["verdict"] == "same" and row["metrics"]["ratio"]["verdict"] == "same"
    for r in n["rows"]:
        r.update(overhead_pct=8.0, ratio=0.5)
    rc, text, _ = _diff(capsys, _write(tmp_path, "b.json", b), _write(tmp_path, "n.json", n))
    assert rc == 1 and "(+4.0 pt, same)" in text and "ratio 0.95 -> 0.50 (-47.4%, regression)" in text, text


def test_zero_byte_rows_compare_by_time(tmp_path, capsys, base):
    b, n = copy.deepcopy(base), copy.deepcopy(base)
    for d, t in ((b, 10.0), (n, 30.0)):
        for r in _rows(d, 4096):
            r.update(size=0, count=0, busbw=0.0, algbw=0.0, time_us=t)
    rc, text, _ = _diff(capsys, _write(tmp_path, "b.json", b), _write(tmp_path, "n.json", n))
    line = next(ln for ln in text.splitlines() if ln.split()[:2] == ["all_reduce", "0"])
    assert rc == 1 and "+200.0%" in line and "regression" in line and "compared by time" in line, text


@pytest.mark.parametrize("content, said", [
    ("not json", "is not JSON"),
    ("[1, 2]", "is a JSON list"),
    ('[{"name": "AllReduce", "ph": "b"}]', "is a Chrome trace"),
    ('{"rows": []}', "is JSON with keys ['rows']"),
])
def test_a_file_that_is_no_bench_json_is_refused_naming_it(tmp_path, capsys, base, content, said):
    bad = tmp_path / "x.json"
    bad.write_text(content)
    rc, _, err = _diff(capsys, str(bad), _write(tmp_path, "b.json", base))
    assert rc == 2 and f"BASE {str(bad)!r} {said}" in err and "`slicetrace bench --json FILE` (or all by `slicetrace report --json FILE`)" in err, err


def test_bad_arguments_are_refused_with_what_is_accepted(tmp_path, capsys, base):
    p = _write(tmp_path, "b.json", base)
    rc, _, err = _diff(capsys, p, str(tmp_path / "nothere.json"))
    assert rc == 2 and "NEW" in err and "no such file, folder, or files matching it as a glob" in err
    rc, _, err = _diff(capsys, p, p, "--threshold", "-3")
    assert rc == 2 and "--threshold -3 must be a percentage >= 0 and < 100" in err
    rc, _, err = _diff(capsys, p, p, "--json", p)
    assert rc == 2 and "is one of the inputs" in err
    broken = copy.deepcopy(base)
    del broken["rows"][2]["busbw"]
    rc, _, err = _diff(capsys, p, _write(tmp_path, "n.json", broken))
    assert rc == 2 and "row 2 lacks ['busbw']" in err, err
    broken["rows"][2]["busbw"] = None
    rc, _, err = _diff(capsys, p, _write(tmp_path, "n.json", broken))
    assert rc == 2 and "row 2 has busbw None; a number >= 0 is accepted" in err, err


def test_the_exit_statuses_in_diff_help_are_those_the_readme_gives(capsys):
    with pytest.raises(SystemExit):
        main(["diff", "--help"])
    epilog = capsys.readouterr().out.split("exit status:")[1]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = readme[readme.index("## `slicetrace diff`"):].split("\nExit status: ")[1].split("\n\n")[0]
    codes = lambda text: set(re.findall(r"\b([0-9]) (?:no|a|refused)\b", text))    # noqa: E731
    assert codes(epilog) == codes(line) == {"0", "1", "2"}


# the rules by themselves
_samples = st.lists(st.integers(1, 1000), min_size=1, max_size=6)


@settings(deadline=None)
@given(_samples, _samples, st.integers(0, 50), st.integers(-4, 4))
def test_verdict_rules(b, n, pct, exp):
    sb, sn, t = Stats.of(b), Stats.of(n), pct / 100
    v = verdict(sb, sn, t)
    # the threshold: nothing within it is a change; a regression is below it, an improvement above
    assert (v == "same") == (abs(sn.median - sb.median) <= t * sb.median)
    assert v != "regression" or sn.median < sb.median * (1 - t)
    assert v != "improved" or sn.median > sb.median * (1 + t)
    # the range rule: only with >= 3 samples a side, and only when the ranges overlap
    assert (v == "noise") == (v != "same" and len(b) >= 3 and len(n) >= 3 and sb.lo <= sn.hi and sn.lo <= sb.hi)
    # a scale (a power of two: exact) changes nothing; lower-is-better swaps the directions
    k = 2.0 ** exp
    assert verdict(Stats.of([x * k for x in b]), Stats.of([x * k for x in n]), t) == v
    swap = {"regression": "improved", "improved": "regression"}
    assert verdict(sb, sn, t, higher_better=False) == swap.get(v, v)


_keys = st.sets(st.tuples(st.sampled_from(["all_reduce", "broadcast"]), st.sampled_from([0, 4096, 8192]),
                          st.booleans()), max_size=6)


@settings(deadline=None)
@given(_keys, _keys)
def test_rows_match_by_their_key_and_the_rest_are_listed_by_side(bk, nk):
    def rows(keys, tag):
        return [{"backend": "cpu", "op": op, "size": size, "type": "float32", "redop": "none", "inplace": ip,
                 "root": -1, "ranks": 2, "busbw": 1.0, "time_us": 5.0, "wrong": 0, "tag": tag}
                for op, size, ip in keys]
    got = compare_rows(rows(bk, "b"), rows(nk, "n"), 0.05)
    key = lambda r: (r["op"], r["size"], r["inplace"])     # noqa: E731
    assert {key(r) for r in got["rows"]} == bk & nk
    assert {key(r) for r in got["only_base"]} == bk - nk and {key(r) for r in got["only_new"]} == nk - bk
    assert all(r["verdict"] == "same" for r in got["rows"]) and not got["failed"]
    order = [(r["op"], r["inplace"], r["size"]) for r in got["rows"]]
    assert order == sorted(order)                  # bench's order: op, ..., then size
    assert diff.KEY[1:] == ("op", "size", "type", "redop", "inplace", "root", "ranks")


def test_json_to_standard_output_moves_the_table_to_stderr(tmp_path, capsys, base):
    p = _write(tmp_path, "b.json", base)
    rc, out, err = _diff(capsys, p, p, "--json", "-")
    got = json.loads(out)
    assert rc == 0 and got["threshold_pct"] == 5.0 and len(got["rows"]) == 3 and "# OK: no regression" in err


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """`slicetrace report --json` of a real 2-rank traced sweep: two links, 0->1 and 1->0."""
    folder = tmp_path_factory.mktemp("diffrep")
    assert main(["bench", "-b", "64K", "-e", "256K", "-n", "3", "-w", "1", "--trace", str(folder / "tr")]) == 0
    assert main(["report", str(folder / "tr"), "--json", str(folder / "r.json")]) == 0
    d = json.loads((folder / "r.json").read_text())
    assert sorted((ln["src"], ln["dst"]) for ln in d["links"]) == [(0, 1), (1, 0)]
    return d


def test_report_files_compare_by_link_gbps_and_wait_share(tmp_path, capsys, report, base):
    p = _write(tmp_path, "r.json", report)
    out = tmp_path / "d.json"
    rc, text, _ = _diff(capsys, p, p, "--json", str(out))
    assert rc == 0 and "# 2 rows compared: 0 regression(s)" in text, text
    got = json.loads(out.read_text())
    assert got["kind"] == "report" and got["key"] == ["src", "dst"]
    assert {(r["src"], r["dst"]): r["verdict"] for r in got["rows"]} == {(0, 1): "same", (1, 0): "same"}
    slow = copy.deepcopy(report)
    ln = next(ln for ln in slow["links"] if ln["src"] == 1)
    ln["gbps"] /= 2
    rc, text, _ = _diff(capsys, p, _write(tmp_path, "slow.json", slow))
    line = next(ln for ln in text.splitlines() if ln.split()[:1] == ["1->0"])
    assert rc == 1 and "-50.0%" in line and "regression" in line, text
    # the same speed, but the link's ends wait longer: the wait share rises by more than 5 points
    idle, waits = copy.deepcopy(report), copy.deepcopy(report)
    for d, share in ((idle, 0.0), (waits, 0.5)):        # waits of 0 %, then 50 % of the link's time
        ln = next(ln for ln in d["links"] if ln["src"] == 0)
        ln.update(send_credit_wait_us=ln["send_transfer_us"] * share, recv_data_wait_us=0.0)
    rc, text, _ = _diff(capsys, _write(tmp_path, "idle.json", idle), _write(tmp_path, "waits.json", waits))
    line = next(ln for ln in text.splitlines() if ln.split()[:1] == ["0->1"])
    assert rc == 1 and "regression" in line and "+33.3pt" in line, text
    # a link on one side only is listed; bench and report files do not mix
    one = copy.deepcopy(report)
    one["links"] = [ln for ln in one["links"] if ln["src"] == 0]
    rc, text, _ = _diff(capsys, p, _write(tmp_path, "one.json", one))
    assert rc == 0 and "# only in BASE: link 1->0, 1 sample" in text, text
    rc, _, err = _diff(capsys, p, _write(tmp_path, "b.json", base))
    assert rc == 2 and "report --json files and NEW" in err and "bench --json files" in err, err


@pytest.mark.parametrize("key, value", [("gbps", "fast"), ("gbps", -3.0), ("send_transfer_us", None),
                                        ("recv_data_wait_us", float("inf"))])
def test_a_report_link_whose_numbers_are_not_numbers_is_refused_naming_it(tmp_path, capsys, report, key, value):
    bad = copy.deepcopy(report)
    bad["links"][1][key] = value
    rc, _, err = _diff(capsys, _write(tmp_path, "r.json", report), _write(tmp_path, "bad.json", bad))
    nullable = " or null" if key != "send_transfer_us" else ""
    assert rc == 2 and f"NEW {str(tmp_path / 'bad.json')!r}: links[1] has {key} {value!r}; a number >= 0{nullable} is " \
                       f"accepted" in err, err
    ok = copy.deepcopy(report)          # null where report writes it (a link it could not time) still compares
    ok["links"][1].update(gbps=None, recv_data_wait_us=None)
    rc, _, err = _diff(capsys, _write(tmp_path, "r.json", report), _write(tmp_path, "ok.json", ok))
    assert rc == 0, err
