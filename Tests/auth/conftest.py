"""The auth suites' timeout. Their helpers live in `authkit` and are imported by each test module."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)
