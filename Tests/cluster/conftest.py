"""The cluster suite's timeout (three nodes and a redis-server per test) and its shared fixtures."""

import pytest

from pubsubtest.fixtures import redis_server  # noqa: F401  (fixtures)
from pubsubtest.redis import RedisCluster
from pubsubtest.suite import suite_timeout


@pytest.fixture
def redis_cluster():
    """A Redis Cluster of three masters, each with a replica, on loopback."""
    cluster = RedisCluster(masters=3, replicas=1)
    cluster.start()
    yield cluster
    cluster.stop()


pytest_collection_modifyitems = suite_timeout(__file__, 120)
