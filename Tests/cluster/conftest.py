"""The cluster suite's timeout (three nodes and a redis-server per test)."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)
