"""How config reads a variable's text: booleans, strict integers, byte sizes, event masks and seconds, each
parser with what it accepts (for config's error messages). Reads no environment (config does)."""
from __future__ import annotations

import re
from typing import Any, Callable

from .events.abi import INT_TEXT, parse_mask


def as_bool(v: str) -> bool:
    if v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if v.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(v)


def as_int(v: str) -> int:
    t = v.strip()
    if not INT_TEXT.fullmatch(t):           # what the README promises, no more
        raise ValueError(f"{v!r} is not a decimal (no leading zero) or 0x hex integer")
    return int(t, 0)


def as_bytes(v: str) -> int:
    """An integer, or one with a binary suffix K, M or G (64K = 65536), as the bench's -b/-e take."""
    t = v.strip().upper()
    if not t.startswith("0X"):               # hex digits include B
        for i, suffix in enumerate("KMG"):
            if t.endswith((suffix, suffix + "B")):
                return as_int(t[:t.rindex(suffix)]) << (10 * (i + 1))
    return as_int(t)


def as_mask(v: str) -> int:
    return parse_mask(v)        # its integers as strict as as_int's, from a keyword or the CLI too


_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def as_seconds(v: str) -> float:
    """Decimal seconds, as the README says ('2.5'): float() also took '1_0', '1e3', 'inf' and non-ASCII digits."""
    t = v.strip()
    if not _SECONDS.fullmatch(t):
        raise ValueError(v)
    return float(t)


# what each parser accepts, for its error message
FORMATS: dict[Callable[[str], Any], str] = {
    as_bool: "one of 0/1/true/false/yes/no/on/off (any case; empty = off)",
    as_int: "an integer, decimal or 0x hex",
    as_bytes: "bytes: an integer, or one with a binary suffix K, M or G (e.g. 65536, 64K, 4M)",
    as_seconds: "a number of seconds, e.g. 60 or 2.5",
    as_mask: "an integer, decimal or 0x hex, e.g. 65606 or 0x10046, or event type names joined by '|' or ',', "
             "e.g. Coll|P2p|KernelCh|KernelStep (the same mask)",
}
