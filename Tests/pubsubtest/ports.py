"""Loopback ports for the servers the tests start."""

import socket


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port() -> int:
    """A loopback port with nothing listening: connecting to it is refused."""
    return free_port()
