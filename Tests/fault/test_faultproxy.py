"""The fault proxy itself (pubsubtest.faultproxy), against a small echo-and-push server of the test's own."""

import socket
import threading
import time

import pytest

from pubsubtest.faultproxy import FaultProxy
from pubsubtest.wait import wait_until

pytestmark = pytest.mark.timeout(30)


class Target:
    """A loopback server: echoes what it reads; `push(n)` writes n bytes to every connection without waiting
    (non-blocking, so it reports how much the kernel took); notes how each connection ended."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns = []
        self.ends = []  # "eof" or "reset", one per connection that ended
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(s)
            threading.Thread(target=self._echo, args=(s,), daemon=True).start()

    def _echo(self, s):
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    self.ends.append("eof")
                    s.close()
                    return
                s.sendall(data)
        except ConnectionResetError:
            self.ends.append("reset")
        except OSError:
            self.ends.append("error")

    def push(self, n, timeout=0.5):
        """Writes up to n bytes to the newest connection within `timeout`; returns how many the kernel took."""
        with self.lock:
            s = self.conns[-1]
        sent, deadline = 0, time.monotonic() + timeout
        s.settimeout(0.05)
        while sent < n and time.monotonic() < deadline:
            try:
                sent += s.send(b"p" * min(65536, n - sent))
            except (socket.timeout, BlockingIOError):
                pass
        s.settimeout(None)
        return sent

    def close(self):
        self.listener.close()


@pytest.fixture
def target():
    t = Target()
    yield t
    t.close()


@pytest.fixture
def proxy(target):
    with FaultProxy(("127.0.0.1", target.port)) as p:
        yield p


def connect(proxy):
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=3)
    s.settimeout(3)
    return s


def echo(s, data=b"hello"):
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        got += s.recv(65536)
    return got


def test_forwards_both_ways_and_counts(proxy):
    s = connect(proxy)
    assert echo(s, b"x" * 100000) == b"x" * 100000
    c = proxy.counters()
    assert c["accepted"] == 1 and c["active"] == 1
    assert c["bytes_up"] == 100000 and c["bytes_down"] == 100000
    s.close()
    wait_until(lambda: proxy.counters()["active"] == 0, 5, message="the closed connection gone")


def test_stall_holds_the_targets_bytes_then_passes_them(proxy, target):
    s = connect(proxy)
    assert echo(s) == b"hello"
    assert proxy.stall(1.0) == 1
    taken = target.push(300000)
    assert taken > 64 * 1024, "the target's writes go on into the kernel's buffers during a stall"
    s.settimeout(0.4)
    with pytest.raises(socket.timeout):
        s.recv(1)  # the client sees nothing
    s.settimeout(5)
    got = 0
    while got < taken:
        got += len(s.recv(65536))  # the stall ended by itself: everything arrives
    assert got == taken


def test_reset_sends_rst_both_ways_and_new_connections_work(proxy, target):
    s = connect(proxy)
    assert echo(s) == b"hello"
    proxy.stall()
    target.push(100000)
    assert proxy.reset() == 1
    with pytest.raises(ConnectionResetError):
        s.recv(1)
        s.recv(1)
    wait_until(lambda: target.ends == ["reset"], 5, message="the target saw a reset")
    s2 = connect(proxy)
    assert echo(s2, b"again") == b"again"
    assert proxy.counters()["resets"] == 1


def test_drop_closes_without_reset(proxy, target):
    s = connect(proxy)
    assert echo(s) == b"hello"
    assert proxy.drop() == 1
    assert s.recv(1) == b""  # a FIN: end of stream, no error
    wait_until(lambda: target.ends == ["eof"], 5, message="the target saw the end of the stream")


def test_blackhole_swallows_until_healed(proxy, target):
    s = connect(proxy)
    assert echo(s) == b"hello"
    proxy.blackhole()
    s.sendall(b"lost")
    s2 = connect(proxy)  # accepted during the blackhole: swallowed too
    s2.sendall(b"lost too")
    s.settimeout(0.4)
    s2.settimeout(0.4)
    for sock in (s, s2):
        with pytest.raises(socket.timeout):
            sock.recv(1)
    wait_until(lambda: proxy.counters().get("swallowed", 0) == len(b"lost") + len(b"lost too"), 5,
               message="the bytes swallowed")
    proxy.heal()
    assert proxy.drop() == 2
    s3 = connect(proxy)
    assert echo(s3, b"healed") == b"healed"
