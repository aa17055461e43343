"""Imports point only down the layers of docs/internals.md (DESIGN section 6)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "slicetrace"
BASE = {"errors"}
LOW = BASE | {"config", "config_rules", "rendezvous"}
CONTRACTS = {"stamps.layout", "events.abi"}
BACKEND = LOW | {"stamps.layout", "plan", "backend.base", "backend.procs", "backend.segment", "backend.opsig",
                   "backend.signals"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "backend": set(), "events": set(), "stamps": set(),     # package __init__ files
    "config_values": BASE | {"events.abi"},     # event type names in SLICETRACE_PROFILE_EVENT_MASK
    "config_rules": BASE | {"config_values"},   # what each setting accepts
    "config": BASE | {"events.abi", "config_values", "config_rules"},
    "rendezvous": BASE,
    "stamps.layout": BASE,
    "events.abi": BASE,
    "plan": BASE | {"config"},
    "backend.signals": set(),
    "backend.procs": LOW,
    "backend.segment": BASE | {"backend.signals"},
    "backend.opsig": LOW | {"plan", "backend.base", "backend.segment", "events.abi"},   # FUNC_NAMES: ops by name
    "backend.base": BACKEND - {"backend.segment", "backend.opsig"},
    "backend.null": BACKEND,
    "backend.cpu": BACKEND,
    "backend.cuda": BACKEND,
    "stamps.scratch": set(),
    "stamps.waits": set(),
    "stamps.ctrl": set(),
    "stamps.pairing": BASE | {"stamps.layout"},
    "stamps.batches": BASE | {"stamps.layout", "stamps.scratch", "stamps.pairing"},
    "stamps.drain": BASE | {"stamps.layout", "stamps.scratch", "stamps.pairing", "stamps.waits", "stamps.batches",
                            "stamps.ctrl"},
    "events.plugin": BASE | {"config", "events.abi"},
    "events.loading": BASE | {"events.plugin"},
    "events.ops": BASE | {"events.abi", "events.plugin", "stamps.layout"},
    "events.emit": BASE | {"events.abi", "events.ops"},
    "events.runs": BASE | {"events.abi", "events.ops", "events.emit", "stamps.layout"},
    "events.accounts": BASE | {"events.ops"},
    "events.proxy": BASE | {"events.abi", "events.ops", "events.emit"},   # the host's ProxyCtrl mixin
    "events.host": BASE | {"config", "events.abi", "events.plugin", "events.ops", "events.emit", "events.runs",
                           "events.accounts", "events.proxy", "stamps.layout"},
    "events.synthetic": BASE | {"config", "events.abi", "events.plugin", "events.ops", "events.host", "stamps.layout",
                                "plan"},
    "sinks": BASE | {"config", "events.abi", "events.plugin", "plan"},     # plan.traffic: busbw factors, msg sizes
    "analyze": BASE | {"events.abi", "plan"},
    "session": LOW | CONTRACTS | {"plan", "backend.base", "backend.signals", "stamps.drain", "events.loading",
                                  "events.host"},
    "api_checks": BASE | {"backend.base", "events.abi"},
    "api_p2p": BASE | {"plan", "backend.base", "events.abi", "events.host", "api_checks"},
    "api_profiling": BASE | {"api_checks"},
    "api": LOW | CONTRACTS | {"plan", "backend.base", "events.host", "session", "api_checks", "api_p2p",
                              "api_profiling"},
    "launch_signals": {"backend.signals"},      # SIGTERM's exit handler
    "launch_checks": LOW | {"api_checks", "backend.cpu", "events.loading"},   # /dev/shm, plugins: before spawning
    "launch_report": {"launch_signals", "backend.procs"},         # how ranks ended, and asking stuck ones to close
    "launcher": LOW | {"api", "api_checks", "launch_checks", "launch_signals", "launch_report"},
    "cli": None,                 # the top: may import anything
    "__main__": {"cli"},         # python -m slicetrace
    "__init__": LOW | {"api", "launcher"},
}


def _group(mod: str) -> str:
    best = ""
    for g in ALLOWED:
        if (mod == g or mod.startswith(g + ".")) and len(g) > len(best):
            best = g
    if not best:
        raise AssertionError(f"module slicetrace.{mod} is in no layer of tests/unit/test_layers.py")
    return best


def _imports(path: Path, mod: str) -> set[str]:
    pkg = mod.split(".")[:-1] if path.name != "__init__.py" else mod.split(".")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                full = ".".join(base + ([node.module] if node.module else []))
                names = [full] if node.module else [".".join(base + [a.name]) for a in node.names]
            elif node.module and node.module.startswith("slicetrace"):
                names = [node.module[len("slicetrace."):]] if node.module != "slicetrace" else \
                    [a.name for a in node.names]
            else:
                continue
            out.update(n for n in names if n)
        elif isinstance(node, ast.Import):
            out.update(a.name[len("slicetrace."):] for a in node.names if a.name.startswith("slicetrace."))
    return out


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        mod = ".".join(parts[:-1]) if parts[-1] == "__init__" and len(parts) > 1 else ".".join(parts)
        yield path, mod


@pytest.mark.parametrize("path,mod", list(_modules()), ids=lambda v: str(v) if isinstance(v, str) else "")
def test_imports_point_down(path: Path, mod: str) -> None:
    group = _group(mod)
    allowed = ALLOWED[group]
    if allowed is None:
        return
    bad = sorted(i for i in _imports(path, mod) if _group(i) != group and _group(i) not in allowed)
    assert not bad, f"slicetrace.{mod} (layer {group!r}) imports {bad}; allowed: {sorted(allowed)}"


def test_the_walker_sees_a_violation(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("from ..backend.cpu import worker\nfrom .layout import STAMP_DTYPE\n")
    assert _imports(f, "stamps.drain") == {"backend.cpu", "stamps.layout"}
    assert _group("backend.cpu.worker") not in ALLOWED["stamps.drain"]


def test_only_config_reads_the_environment() -> None:
    readers = [str(p.relative_to(SRC)) for p, _ in _modules()
               if "os.environ" in p.read_text() or "getenv(" in p.read_text()]
    assert readers == ["config.py"], readers
