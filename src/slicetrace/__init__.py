"""slicetrace: per-slice timing inside collective communication (NCCL PR #2316's KernelStep events, in Python)."""
from typing import Any

from .errors import (BackendError, CommTimeoutError, CompileError, ConfigError, LaunchError, MismatchError,
                     PeerError, PluginError, SliceTraceError, TraceFormatError, UsageError)

__version__ = "0.1.0"
__all__ = ["Communicator", "Settings", "init", "launch", "SliceTraceError", "ConfigError", "UsageError",
           "MismatchError", "LaunchError", "BackendError", "CompileError", "PeerError", "CommTimeoutError", "PluginError",
           "TraceFormatError", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so importing a low layer (slicetrace.plan, a backend) does not import the whole runtime, and launch()'s
    # store server (its initializer in launch_signals) starts without numpy: ~0.25 s less per launch
    if name == "Settings":
        from .config import Settings
        return Settings
    if name == "Communicator":
        from .api import Communicator
        return Communicator
    if name in ("init", "launch"):
        from .launcher import init, launch
        return init if name == "init" else launch
    raise AttributeError(f"module 'slicetrace' has no attribute {name!r}")
