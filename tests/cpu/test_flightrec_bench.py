"""`slicetrace bench` with the flight recorder: names its files when it wrote some (DUMP=always), and says in one
plain line that a healthy run wrote none (the default), where it said nothing of them at all."""
import pytest

from slicetrace.cli.main import main


@pytest.mark.parametrize("dump", ["failure", "always"])
def test_bench_says_what_the_flight_recorder_wrote(tmp_path, capfd, monkeypatch, dump):
    prefix = str(tmp_path / "fr" / "rec")
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "flightrec")
    monkeypatch.setenv("SLICETRACE_FLIGHTREC_FILE", prefix)
    monkeypatch.setenv("SLICETRACE_FLIGHTREC_DUMP", dump)
    assert main(["bench", "-b", "8", "-e", "64", "-n", "1", "-w", "0"]) == 0
    out = capfd.readouterr().out
    files = sorted(tmp_path.glob("fr/rec_*.json"))
    if dump == "failure":
        assert files == [] and (f"# flight records: none written (SLICETRACE_FLIGHTREC_FILE={prefix!r}; no op failed "
                                f"or ended unfinished, as in a healthy run:") in out, out
    else:
        assert len(files) == 2, files
        run = str(files[0]).rsplit("_", 1)[0]
        assert f"# flight records: {run}_<rank>.json (2 file(s)): slicetrace report {run}\n" in out, out
