"""The relay suites' timeout. Their fixtures live in `relaykit` and are imported by each test module."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 180)
