"""Fixtures of the fault suite and its timeout."""

from pubsubtest.browser import browser, page, page_server  # noqa: F401  (fixtures)
from pubsubtest.fixtures import make_broker, redis_server  # noqa: F401  (fixtures)
from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 90)
