"""The torchrun rendezvous store's failures are slicetrace errors naming MASTER_ADDR:MASTER_PORT and timeout_s,
within timeout_s, not torch's DistNetworkError seconds later."""
import socket
import time

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
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError) as e:
        slicetrace.init("null", timeout_s=2)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert msg.startswith(f"rendezvous: rank 1 of 2 could not connect to the TCPStore at "
                          f"MASTER_ADDR:MASTER_PORT=127.0.0.1:{port} within timeout_s=2"), msg
    assert "MASTER_ADDR and MASTER_PORT" in msg and "\n" not in msg
    assert took < 2 + 1.0, took                     # torch's own retries ran 2-3 s past its timeout


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
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError, match=rf"^rendezvous: rank 0 of 2 hosts the TCPStore at MASTER_ADDR:"
                                               rf"MASTER_PORT=127\.0\.0\.1:{port}, and the other ranks did not all "
                                               rf"connect within timeout_s=1;"):
        slicetrace.init("null", timeout_s=1)
    assert time.monotonic() - t0 < 1 + 1.0
