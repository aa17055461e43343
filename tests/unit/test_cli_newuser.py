"""What a new user met on a first hour with the command line: each answer says what it is, without a traceback."""
import pytest

from slicetrace import __version__
from slicetrace.cli.main import main


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"slicetrace {__version__}\n"
