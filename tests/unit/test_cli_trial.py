"""What a user trial of the command line found: report's text piped to a file, convert's hint for several runs,
bench's trace variable without the plugin that writes it."""
from slicetrace.cli.main import main
from tests.cpu.test_cli import _trace_files


def test_report_piped_keeps_every_digit_of_its_tables_and_each_finding_on_one_line(tmp_path, capsys):
    """Piped (`slicetrace report traces > r.txt`), rich drew 80 columns: a 1 MiB slice's bytes read "1,048,…" and
    each finding was split over lines, so `grep` of one missed the rest of it."""
    prefix = _trace_files(tmp_path / "tr", 7)
    for f in (tmp_path / "tr").iterdir():
        f.write_text(f.read_text().replace('"Size": 4096', '"Size": 16777216'))
    assert main(["report", prefix]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert "│ 16,777,216 │" in out, out
    assert any(line.startswith("slow links: not judged, 2 link(s) in this trace and the check compares each with the "
                               "median of 3 or more") for line in out.splitlines()), out
