"""The operations suite's timeout. Its helpers live in `opshelp`."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)
