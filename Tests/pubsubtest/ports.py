"""Loopback ports for the servers the tests start.

A port from the kernel's ephemeral range (`ip_local_port_range`) can be taken by any outgoing connection between
the moment a test picks it and the moment its server binds it: with thousands of connections churning, a server
then fails to start. The ports handed out here lie below that range, where no outgoing connection lands. Each is
held by this test process for its whole life, with a one-byte lock at offset `port` of one shared lock file
(`fcntl.lockf`, released by the kernel when the process ends), so that two test processes never hand out the same
port, and one process hands out each port once before it starts over.
"""

import fcntl
import os
import random
import socket
import tempfile
import threading

LOCK_FILE = os.path.join(tempfile.gettempdir(), "pubsub-test-ports.lock")
POOL_SIZE = 12768  # 20000-32767 when the ephemeral range starts at 32768, Linux's default
LOWEST = 10000


def ephemeral_range(path="/proc/sys/net/ipv4/ip_local_port_range"):
    """The kernel's (low, high) range for outgoing connections' local ports (Linux's default when unreadable)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def pool():
    """The ports `free_port` hands out: up to POOL_SIZE ports just below the ephemeral range, none below LOWEST.
    (When the range starts too low to leave room, the ports just above it.)"""
    low, high = ephemeral_range()
    if low - LOWEST >= 1000:
        return range(max(LOWEST, low - POOL_SIZE), low)
    return range(high + 1, min(65536, high + 1 + POOL_SIZE))


class _Ports:
    def __init__(self):
        self.lock = threading.Lock()
        self.ports = pool()
        self.next = random.randrange(len(self.ports))  # processes started together do not contend port by port
        self.handed = set()
        self.held = set()
        self.fd = None

    def _lock_file(self):
        if self.fd is None:
            try:
                self.fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
            except PermissionError:  # another user's file: a lock file of this user's own
                self.fd = os.open(f"{LOCK_FILE}.{os.getuid()}", os.O_RDWR | os.O_CREAT, 0o600)
        return self.fd

    def _hold(self, port):
        """Takes the port's lock for this process (kept until it ends); False when another process holds it."""
        if port in self.held:
            return True
        try:
            fcntl.lockf(self._lock_file(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
        except OSError:
            return False
        self.held.add(port)
        return True

    def take(self):
        with self.lock:
            for _ in range(2 * len(self.ports)):
                if len(self.handed) >= len(self.ports):
                    self.handed.clear()  # every port handed out once: start over (each is probed again)
                port = self.ports[self.next]
                self.next = (self.next + 1) % len(self.ports)
                if port in self.handed:
                    continue
                self.handed.add(port)
                if self._hold(port) and bindable(port):
                    return port
            raise RuntimeError(f"no free loopback port in {self.ports.start}-{self.ports.stop - 1}")


def bindable(port) -> bool:
    """Whether a listener could bind `port` on loopback now (nothing listening, no connection left on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


_ports = _Ports()


def free_port() -> int:
    """A loopback TCP port for a server a test starts: outside the ephemeral range, free when handed out, and
    handed out to no other test in this process or any other running this module."""
    return _ports.take()


def closed_port() -> int:
    """A loopback port with nothing listening: connecting to it is refused."""
    return free_port()
