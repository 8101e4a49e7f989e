"""Fixtures for the cluster suite: one redis-server and three `pubsub serve --engine redis` nodes.

redis-server must be installed (scripts/install-test-deps does it); a missing one fails the suite, never skips it.
"""

import pytest

from cluster_helpers import Broker, RedisServer, wait_ready


@pytest.fixture
def redis_server():
    r = RedisServer()
    r.start()
    yield r
    r.stop()


@pytest.fixture
def nodes(redis_server):
    """Three nodes sharing one Redis."""
    started = []
    try:
        for _ in range(3):
            b = Broker(timeout=10, extra_args=["--engine", "redis", "--redis-url", redis_server.url,
                                                "--log-level", "info"])
            b.start()
            started.append(b)
        for b in started:
            wait_ready(b)
        yield started
    finally:
        for b in started:
            b.stop()


