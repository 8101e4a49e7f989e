"""The docs suite (links, the README session) and its timeout. Its helpers live in `mdcheck`."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 60)
