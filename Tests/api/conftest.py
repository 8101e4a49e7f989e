"""The API suites' browser fixtures and timeout. Their other helpers live in `apikit` and are imported by each test
module."""

from pubsubtest.browser import browser, page, screenshot  # noqa: F401  (fixtures)
from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)
