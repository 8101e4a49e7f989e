"""The webhook suite's timeout. Its helpers live in `hookkit` and are imported by each test module."""

from pubsubtest.fixtures import redis_server  # noqa: F401  (fixtures)
from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 90)
