"""`slicetrace bench`: flags beat SLICETRACE_* variables, errors name where a value came from (the flag or the
variable), and torchrun's variables, which bench does not use, do not matter to it."""
import json
import sys

import pytest

from slicetrace.cli.main import main

SMALL = ["-b", "4K", "-e", "4K", "-n", "1", "-w", "0"]


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch):
    for var in ("SLICETRACE_BACKEND", "SLICETRACE_TIMEOUT", "SLICETRACE_PROFILER_PLUGIN"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("raw", ["0", "soon"])
def test_a_flag_beats_the_variable_it_sets(tmp_path, capsys, monkeypatch, raw):
    """-T 5 with SLICETRACE_TIMEOUT=0 failed on the variable, though init(timeout_s=5) ran with it. (-T 30 here: the
    ranks' set-up runs under it, and a loaded machine may start one rank seconds after the other.)"""
    monkeypatch.setenv("SLICETRACE_TIMEOUT", raw)
    out = tmp_path / "r.json"
    assert main(["bench", *SMALL, "-T", "30", "--json", str(out)]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["settings"]["timeout_s"] == 30.0


@pytest.mark.timeout(120)
def test_profile_beats_an_event_mask_variable_that_would_not_parse(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLICETRACE_PROFILE_EVENT_MASK", "Colll")
    assert main(["bench", *SMALL, "--profile", "Coll", "--trace", str(tmp_path / "t")]) == 0, capsys.readouterr().err
    assert list((tmp_path / "t").glob("trace_*_*.json"))


def test_without_the_flag_the_variables_value_is_refused_naming_it(capsys, monkeypatch):
    monkeypatch.setenv("SLICETRACE_TIMEOUT", "0")
    assert main(["bench", *SMALL]) == 2
    assert "SLICETRACE_TIMEOUT='0': timeout_s=0.0 must be > 0" in capsys.readouterr().err


def test_a_test_backend_from_the_environment_names_the_variable_not_a_flag(capsys, monkeypatch):
    monkeypatch.setenv("SLICETRACE_BACKEND", "null")
    assert main(["bench", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "SLICETRACE_BACKEND='null': bench runs 'cpu' or 'cuda'" in err and "--backend" not in err


@pytest.mark.parametrize("argv,env,want", [
    (["--backend", "cuda"], None, "slicetrace: error: --backend cuda: no usable CUDA device"),
    ([], "cuda", "slicetrace: error: SLICETRACE_BACKEND='cuda': no usable CUDA device"),
    ([], "CUDA", "slicetrace: error: SLICETRACE_BACKEND='cuda': no usable CUDA device"),
])
def test_no_cuda_device_names_where_the_backend_came_from(capsys, monkeypatch, argv, env, want):
    monkeypatch.setitem(sys.modules, "cupy", None)          # import cupy fails, as on a host without it
    if env:
        monkeypatch.setenv("SLICETRACE_BACKEND", env)
    assert main(["bench", *SMALL, *argv]) == 2
    assert capsys.readouterr().err.startswith(want)


def test_compare_names_where_the_other_backend_came_from(capsys, monkeypatch):
    monkeypatch.setenv("SLICETRACE_BACKEND", "cuda")
    assert main(["bench", *SMALL, "--compare", "gloo"]) == 2
    assert "--compare gloo runs beside --backend cpu, not SLICETRACE_BACKEND='cuda'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_bench_runs_whatever_torchruns_variables_hold(tmp_path, capsys, monkeypatch):
    """bench starts its own ranks: `RANK= slicetrace bench` or MASTER_PORT=auto failed in every rank."""
    for k, v in {"RANK": "", "WORLD_SIZE": "x", "LOCAL_RANK": "-1", "MASTER_ADDR": "", "MASTER_PORT": "auto"}.items():
        monkeypatch.setenv(k, v)
    assert main(["bench", *SMALL]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("ops,want", [
    ("all,all_reduce", "--op 'all,all_reduce': 'all' runs every op (all_reduce, all_gather, reduce_scatter, "
                       "broadcast, reduce, all_to_all, send_recv); give it alone, or list ops"),
    ("all_reduce,all_reduce", "--op 'all_reduce,all_reduce' names all_reduce more than once; give each op once"),
    ("broadcast, all_gather,broadcast", "names broadcast more than once"),
    ("all_reduce,scan", "--op ['scan']: each must be one of"),
])
def test_op_lists_are_refused_clearly(capsys, ops, want):
    assert main(["bench", *SMALL, "--op", ops]) == 2
    err = capsys.readouterr().err
    assert want in err and err.count("\n") == 1


def test_bench_help_gives_every_flags_default(capsys):
    # -d, -o, -r and --op ran with float, sum, 0 and all_reduce, and -T with 60 s, and their help did not say so
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split()).split("options:", 1)[1]     # not the usage line
    for flag, default in (("-d DATATYPE, --datatype DATATYPE", "(default float)"),
                          ("-o REDOP, --redop REDOP", "(default sum)"), ("-r ROOT, --root ROOT", "(default 0)"),
                          ("--op OPS", "(default all_reduce)"),
                          ("-T TIMEOUT, --timeout TIMEOUT", "(default: SLICETRACE_TIMEOUT, else 60)")):
        assert default in text.split(flag, 1)[1].split(" -", 1)[0], flag
