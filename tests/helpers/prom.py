"""A strict reader of the Prometheus text exposition format (0.0.4, what node_exporter's textfile collector reads),
for the linkstats tests: every rule the format and the naming conventions state is checked, character by character,
rather than trusting a regex on one line."""
from __future__ import annotations

import math
import re

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
_UNESCAPE_LABEL = {"\\": "\\", '"': '"', "n": "\n"}
_UNESCAPE_HELP = {"\\": "\\", "n": "\n"}
# units that are not base units (Prometheus names carry seconds and bytes)
_NOT_BASE = {"ns", "us", "ms", "nanoseconds", "microseconds", "milliseconds", "minutes", "hours", "kb", "mb", "gb",
             "kib", "mib", "gib", "bits", "percent"}


class PromError(AssertionError):
    """The text breaks a rule of the format; the message names the line."""


def _unescape(text: str, table: dict, where: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text) or text[i + 1] not in table:
                raise PromError(f"{where}: invalid escape {text[i:i + 2]!r}")
            out.append(table[text[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _labels(text: str, where: str) -> tuple[tuple[str, str], ...]:
    """'a="x",b="y"' (what is inside the braces) -> (("a", "x"), ("b", "y")), each value unescaped."""
    pairs, i = [], 0
    while i < len(text):
        eq = text.find("=", i)
        if eq < 0:
            raise PromError(f"{where}: label without '=' in {text[i:]!r}")
        name = text[i:eq]
        if not _LABEL.match(name) or name.startswith("__"):
            raise PromError(f"{where}: bad label name {name!r}")
        if text[eq + 1:eq + 2] != '"':
            raise PromError(f"{where}: label {name} value not quoted")
        j, raw = eq + 2, []
        while True:                     # to the closing quote, skipping escaped characters
            if j >= len(text):
                raise PromError(f"{where}: label {name} value not closed")
            if text[j] == "\\":
                raw.append(text[j:j + 2])
                j += 2
                continue
            if text[j] == '"':
                break
            raw.append(text[j])
            j += 1
        pairs.append((name, _unescape("".join(raw), _UNESCAPE_LABEL, f"{where}: label {name}")))
        i = j + 1
        if i < len(text):
            if text[i] != ",":
                raise PromError(f"{where}: expected ',' after label {name}, got {text[i]!r}")
            i += 1
            if i == len(text):          # a trailing comma is allowed by the Go parser; we never write one
                raise PromError(f"{where}: trailing ',' in labels")
    names = [k for k, _ in pairs]
    if len(set(names)) != len(names):
        raise PromError(f"{where}: a label given twice: {names}")
    return tuple(pairs)


def _value(text: str, where: str) -> float:
    if text in ("NaN", "+Inf", "-Inf", "Inf"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        raise PromError(f"{where}: bad value {text!r}")
    return float(text)


def parse(text: str) -> dict[str, dict]:
    """name -> {"help": str, "type": str, "samples": {labels tuple (sorted): value}} of one exposition; raises
    PromError on: no trailing newline, blank lines, HELP or TYPE twice or after the family's samples, a family's
    samples not together, bad names or escapes, a duplicate series, a timestamp (the textfile collector refuses
    them), counters not named *_total or negative, a sample of a family with no HELP or TYPE."""
    if not text.endswith("\n"):
        raise PromError("the text does not end with a newline")
    fams: dict[str, dict] = {}
    closed: set[str] = set()            # families whose samples ended: no more of them, no HELP/TYPE either
    current = None
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n} ({line[:80]!r})"
        if not line:
            raise PromError(f"{where}: blank line")
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[0] == "#" and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not _NAME.match(name):
                    raise PromError(f"{where}: bad metric name {name!r}")
                fam = fams.setdefault(name, {"help": None, "type": None, "samples": {}})
                if name in closed or fam["samples"]:
                    raise PromError(f"{where}: {parts[1]} after the samples of {name}")
                key = parts[1].lower()
                if fam[key] is not None:
                    raise PromError(f"{where}: second {parts[1]} for {name}")
                arg = parts[3] if len(parts) == 4 else ""
                if key == "type" and arg not in _TYPES:
                    raise PromError(f"{where}: unknown type {arg!r}")
                fam[key] = arg if key == "type" else _unescape(arg, _UNESCAPE_HELP, where)
                if current is not None and current != name:
                    closed.add(current)
                current = name
            continue                    # any other '#' line is a comment
        brace = line.find("{")
        if brace >= 0:
            end = line.rfind("}")
            if end < brace:
                raise PromError(f"{where}: '{{' not closed")
            name, labels, rest = line[:brace], _labels(line[brace + 1:end], where), line[end + 1:]
        else:
            name, _, rest = line.partition(" ")
            labels, rest = (), " " + rest
        if not _NAME.match(name):
            raise PromError(f"{where}: bad metric name {name!r}")
        fields = rest.split(" ")
        if fields[0] != "" or len(fields) != 2:
            raise PromError(f"{where}: expected one space then a value (no timestamp), got {rest!r}")
        value = _value(fields[1], where)
        if name in closed:
            raise PromError(f"{where}: samples of {name} not together")
        if current is not None and current != name:
            closed.add(current)
        current = name
        fam = fams.get(name)
        if fam is None or fam["help"] is None or fam["type"] is None:
            raise PromError(f"{where}: {name} has no HELP and TYPE before its samples")
        key = tuple(sorted(labels))
        if key in fam["samples"]:
            raise PromError(f"{where}: duplicate series {name}{dict(key)}")
        if fam["type"] == "counter" and not (value >= 0 and math.isfinite(value)):
            raise PromError(f"{where}: counter value {value}")
        fam["samples"][key] = value
    for name, fam in fams.items():
        if _NOT_BASE & set(name.split("_")):
            raise PromError(f"{name}: a unit that is not a base unit (seconds, bytes)")
        if (fam["type"] == "counter") != name.endswith("_total"):
            raise PromError(f"{name}: counters, and only they, end in _total (type {fam['type']})")
        if fam["help"] is None or fam["type"] is None:
            raise PromError(f"{name}: HELP and TYPE both given once")
    return fams


def series(fams: dict, name: str, *keys: str) -> dict:
    """The samples of one family as {tuple of the values of `keys`: value}, summed over the other labels (PromQL's
    `sum by (keys)`)."""
    out: dict = {}
    for lab, v in fams[name]["samples"].items():
        k = tuple(dict(lab)[k] for k in keys)
        out[k] = out.get(k, 0) + v
    return out
