"""What `slicetrace bench` says of the flight recorder's files: their names when the run wrote some, a plain line
(not an error) when it wrote none, as a healthy run does, and a note when its variable is set but it is not loaded."""
from __future__ import annotations

import pytest

from slicetrace.cli.main import _unwritten_files
from slicetrace.cli.outputs import dump_files, flightrec_note
from slicetrace.config import Settings
from slicetrace.errors import SliceTraceError

VAR = "SLICETRACE_FLIGHTREC_FILE='fr/rec'"


def _file(path, whole=True):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[{"name": "x"}\n' + ("]\n" if whole else ""))


def test_none_written_is_a_plain_line_saying_why(tmp_path):
    prefix = str(tmp_path / "fr" / "rec")           # its folder not even made: a healthy run leaves none
    assert flightrec_note(prefix, {}, 2, False, False, VAR) == (
        f"# flight records: none written ({VAR}; no op failed or ended unfinished, as in a healthy run: "
        f"SLICETRACE_FLIGHTREC_DUMP=always writes one at every close)")
    assert flightrec_note(prefix, {}, 2, True, True, VAR) == (      # the run failed: not called healthy
        f"# flight records: none written ({VAR}; the run failed outside any op its recorders saw (e.g. at start-up))")


def test_none_written_with_dump_always_is_an_error_unless_the_run_failed(tmp_path):
    with pytest.raises(SliceTraceError, match=r"^SLICETRACE_FLIGHTREC_FILE='fr/rec' with SLICETRACE_FLIGHTREC_DUMP="
                                              r"always: the run wrote no flight record there"):
        flightrec_note(str(tmp_path / "rec"), {}, 2, True, False, VAR)


def test_the_files_written_are_named_with_report_partial_when_some_ranks_wrote_none(tmp_path):
    old = tmp_path / "rec_5_0.json"
    _file(old)                                      # an earlier run's, unchanged: not this run's
    before = dump_files(str(tmp_path), "rec")
    _file(tmp_path / "rec_9_1.json")                # only the rank that saw the failure wrote
    prefix = str(tmp_path / "rec")
    assert flightrec_note(prefix, before, 2, False, True, VAR) == (
        f"# flight records: {tmp_path}/rec_9_<rank>.json (1 file(s)): slicetrace report {tmp_path}/rec_9 --partial")
    _file(tmp_path / "rec_9_0.json")
    assert flightrec_note(prefix, before, 2, True, False, VAR) == (
        f"# flight records: {tmp_path}/rec_9_<rank>.json (2 file(s)): slicetrace report {tmp_path}/rec_9")


def test_a_record_left_incomplete_is_an_error_unless_the_run_failed(tmp_path):
    _file(tmp_path / "rec_9_0.json", whole=False)
    prefix = str(tmp_path / "rec")
    with pytest.raises(SliceTraceError, match=r"1 of the 1 flight record file\(s\) this run wrote are incomplete"):
        flightrec_note(prefix, {}, 1, False, False, VAR)
    assert flightrec_note(prefix, {}, 1, False, True, VAR).endswith(
        f"(1 file(s), cut short when the run failed: {tmp_path}/rec_9_0.json): slicetrace report {tmp_path}/rec_9")


def test_its_variable_set_without_the_plugin_is_noted_its_default_is_not(monkeypatch):
    monkeypatch.delenv("SLICETRACE_PROFILER_PLUGIN", raising=False)
    monkeypatch.delenv("SLICETRACE_FLIGHTREC_FILE", raising=False)
    assert _unwritten_files(Settings(), ["linkstats"]) == []
    monkeypatch.setenv("SLICETRACE_FLIGHTREC_FILE", "fr/rec")
    s = Settings.from_env()
    assert _unwritten_files(s, ["flightrec"]) == []
    assert _unwritten_files(s, []) == [
        "# SLICETRACE_FLIGHTREC_FILE='fr/rec' is set, but this run loads no profiler plugin (SLICETRACE_PROFILER_PLUGIN"
        " unset), not the flightrec plugin that writes its files, so none are written: add flightrec to "
        "SLICETRACE_PROFILER_PLUGIN"]
