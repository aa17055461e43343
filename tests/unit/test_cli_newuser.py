"""What a new user met on a first hour with the command line: each answer says what it is, without a traceback."""
import pytest

from slicetrace import __version__
from slicetrace.cli.main import main


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"slicetrace {__version__}\n"


@pytest.mark.parametrize("func, shift, where", [
    ("all_reduce", 2, "x starts 8 bytes before out's start"),       # x = buf[:4], out = buf[2:6]: "-8 bytes from"
    ("all_reduce", -999, "x starts 3,996 bytes after out's start"),
])
def test_an_overlap_says_where_x_starts_in_words(func, shift, where):
    import numpy as np
    import slicetrace
    from slicetrace.errors import UsageError
    buf = np.zeros(4000, dtype=np.float32)
    x, out = buf[1000:2000], buf[1000 + shift:2000 + shift]
    with slicetrace.init(backend="null") as comm:
        with pytest.raises(UsageError, match=f"^{func}: x and out overlap without being in place \\({where}\\); "):
            getattr(comm, func)(x, out)


@pytest.mark.parametrize("call", ["all_reduce", "barrier"])
def test_a_collective_inside_a_group_names_what_a_group_takes(call):
    """It said 'only send/recv may be grouped', though all_to_all is taken there too (NCCL's groups take all)."""
    import numpy as np
    import slicetrace
    from slicetrace.errors import UsageError
    with slicetrace.init(backend="null") as comm:
        with pytest.raises(UsageError, match=f"^{call} inside comm.group\\(\\): only send, recv and all_to_all may be "
                                             f"grouped; call collectives outside the group$"):
            with comm.group():
                getattr(comm, call)(*([np.ones(4, np.float32)] if call != "barrier" else []))
        with comm.group():
            got = comm.all_to_all(np.arange(4, dtype=np.float32))
        assert got.tolist() == [0, 1, 2, 3]             # one rank: its own block back


def test_bare_slicetrace_lists_its_commands(capsys):
    """Before: argparse's 'the following arguments are required: cmd'."""
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: slicetrace ") and "required" not in err
    assert all(f"    {cmd} " in err for cmd in ("bench", "config", "report", "convert")), err
