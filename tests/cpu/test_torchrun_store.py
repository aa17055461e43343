"""The torchrun rendezvous store's failures are slicetrace errors naming MASTER_ADDR:MASTER_PORT and timeout_s,
within timeout_s, not torch's DistNetworkError seconds later."""
import os
import socket
import subprocess
import sys
import threading
import types

import pytest

import slicetrace
from slicetrace.errors import CommTimeoutError, PeerError
from slicetrace.rendezvous import TorchStore


def _torch():
    return pytest.importorskip("torch.distributed", reason="torch is not installed: no TCPStore to connect")


def _clear(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(var, raising=False)


def _closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def test_no_store_at_master_addr_is_a_timeout_error_naming_it_within_timeout_s(monkeypatch):
    _torch()
    _clear(monkeypatch)
    port = _closed_port()
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(CommTimeoutError) as e:
        slicetrace.init("null", timeout_s=2)
    msg = str(e.value)
    assert msg.startswith(f"rendezvous: rank 1 of 2 could not connect to the TCPStore at "
                          f"MASTER_ADDR:MASTER_PORT=127.0.0.1:{port} within timeout_s=2"), msg
    assert "MASTER_ADDR and MASTER_PORT" in msg and "\n" not in msg


@pytest.mark.timeout(60)
def test_rank_0_that_cannot_host_the_store_says_so(monkeypatch):
    """Outside torchrun rank 0 hosts the store: a port another program holds is named, not a C++ error."""
    _torch()
    _clear(monkeypatch)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
            monkeypatch.setenv(k, v)
        with pytest.raises(PeerError) as e:
            slicetrace.init("null", timeout_s=2)
    msg = str(e.value)
    assert msg.startswith(f"rendezvous: rank 0 of 2 could not host the TCPStore at "
                          f"MASTER_ADDR:MASTER_PORT=127.0.0.1:{port}"), msg
    assert "\n" not in msg


class _Gone:
    """A torch store whose server has gone: every call raises as torch's do."""

    def set(self, key, value):
        raise RuntimeError("Connection reset by peer\nException raised from recvBytes at socket.cpp:1 (frames...)")

    def check(self, keys):
        raise RuntimeError("Broken pipe\nException raised from sendBytes (frames...)")


def test_a_store_that_went_away_is_a_peer_error_naming_it():
    s = TorchStore(_Gone(), "MASTER_ADDR:MASTER_PORT=h:1")
    with pytest.raises(PeerError, match=r"^rendezvous: the store at MASTER_ADDR:MASTER_PORT=h:1 failed \(torch: "
                                        r"RuntimeError: Connection reset by peer\); did rank 0"):
        s.set("k", b"v")
    with pytest.raises(PeerError, match=r"\(torch: RuntimeError: Broken pipe\)") as e:
        s.get("k", 1.0)
    assert "frames" not in str(e.value)


@pytest.mark.timeout(60)
def test_rank_0_whose_peers_never_connect_says_which_store_and_timeout(monkeypatch):
    _torch()
    _clear(monkeypatch)
    port = _closed_port()
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(CommTimeoutError, match=rf"^rendezvous: rank 0 of 2 hosts the TCPStore at MASTER_ADDR:"
                                               rf"MASTER_PORT=127\.0\.0\.1:{port}, and the other ranks did not all "
                                               rf"connect within timeout_s=1;"):
        slicetrace.init("null", timeout_s=1)


def _fake_tcpstore(monkeypatch, cls) -> None:
    """torch.distributed.TCPStore is cls for this test; without torch, a stand-in torch.distributed holds it."""
    try:
        import torch.distributed as dist
    except ImportError:
        dist, torch = types.ModuleType("torch.distributed"), types.ModuleType("torch")
        torch.distributed = dist
        monkeypatch.setitem(sys.modules, "torch", torch)
        monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setattr(dist, "TCPStore", cls, raising=False)


@pytest.mark.parametrize("server, want", [
    (False, "rendezvous: rank 1 of 2 could not connect to the TCPStore at MASTER_ADDR:MASTER_PORT=127.0.0.1:29999 "
            "within timeout_s=0.2; is rank 0 (or torchrun's agent) running, and do MASTER_ADDR and MASTER_PORT name "
            "its host and port?"),
    (True, "rendezvous: rank 0 of 2 hosts the TCPStore at MASTER_ADDR:MASTER_PORT=127.0.0.1:29999, and the other "
           "ranks did not all connect within timeout_s=0.2; did every rank start, with the same MASTER_ADDR and "
           "MASTER_PORT?")])
def test_a_connect_that_torch_retries_past_timeout_s_is_given_up_at_timeout_s(monkeypatch, server, want):
    """torch's connect retries for seconds past its own timeout, then raises: the error is ours, at timeout_s
    (no torch error in it: the connect was still running), not torch's once it gives up."""
    release = threading.Event()

    class Retrying:
        def __init__(self, *a, **kw):
            release.wait(10)
            raise RuntimeError("The client socket has timed out after 10000ms while trying to connect")
    _fake_tcpstore(monkeypatch, Retrying)
    try:
        with pytest.raises(CommTimeoutError) as e:
            TorchStore.connect("127.0.0.1", 29999, 1 - server, 2, server, 0.2)
    finally:
        release.set()                       # the connect thread ends
    assert str(e.value) == want


_EXIT_AFTER_TIMEOUT = """
import time, slicetrace
class SlowTeardown:         # the interpreter's teardown outlasts torch's connect retries, as a big program's can
    def __del__(self):
        time.sleep(4)
try:
    slicetrace.init("null", timeout_s=1)
except slicetrace.CommTimeoutError as e:
    print("caught:", str(e).split(" to the")[0])
keep = SlowTeardown()
"""


@pytest.mark.timeout(120)
def test_a_process_that_exits_after_a_store_timeout_exits_cleanly(monkeypatch):
    """torch's connect, left running in its thread past timeout_s, returned into a finalizing interpreter:
    'terminate called without an active exception', SIGABRT (exit status -6 / 134) in place of the program's own."""
    _torch()
    _clear(monkeypatch)
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_closed_port()), "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-c", _EXIT_AFTER_TIMEOUT], env=env, capture_output=True, text=True,
                       timeout=90)
    assert p.stdout == "caught: rendezvous: rank 1 of 2 could not connect\n", (p.stdout, p.stderr[-2000:])
    assert p.returncode == 0 and "terminate called" not in p.stderr, (p.returncode, p.stderr[-2000:])
