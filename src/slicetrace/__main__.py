"""`python -m slicetrace`: the `slicetrace` command, where its console script is not installed (PYTHONPATH=src)."""
import sys

from .cli.main import main

if __name__ == "__main__":          # spawned ranks import this module too: only the command runs the command
    sys.exit(main())
