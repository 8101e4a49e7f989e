"""The cluster suite's timeout (three nodes and a redis-server per test) and its shared fixture."""

from pubsubtest.fixtures import redis_server  # noqa: F401  (fixtures)
from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)
