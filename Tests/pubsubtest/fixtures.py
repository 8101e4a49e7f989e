"""pytest fixtures that several suites use. A suite's conftest.py imports the ones it wants, so that they are seen
by that folder's tests only:

    from pubsubtest.fixtures import make_broker, pool  # noqa: F401  (fixtures)
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from .broker import Broker
from .redis import RedisCluster, RedisServer


def _started(kind):
    """The body of a factory fixture: yields `make(**kwargs)`, which makes a `kind` and starts it; every one made is
    stopped after the test."""
    started = []

    def make(**kwargs):
        thing = kind(**kwargs)
        thing.start()
        started.append(thing)
        return thing

    yield make
    for thing in started:
        thing.stop()


@pytest.fixture
def make_broker():
    """Factory for servers with special settings (`make_broker(timeout=2, extra_args=[...])`); every one is
    stopped after the test. A server can be restarted on its port with `restart()`."""
    yield from _started(Broker)


@pytest.fixture
def pool():
    """Thread pool for requests that are held open (long-polls) while the test goes on."""
    ex = ThreadPoolExecutor(max_workers=8)
    yield ex
    ex.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def redis_server():
    """A redis-server of its own for the test, stopped (and its folder removed) afterwards."""
    r = RedisServer()
    r.start()
    yield r
    r.stop()


@pytest.fixture
def make_redis_cluster():
    """Factory for Redis Clusters on loopback (`make_redis_cluster(masters=3, replicas=0)`, see RedisCluster); every
    one is stopped (and its folders removed) after the test."""
    yield from _started(RedisCluster)
