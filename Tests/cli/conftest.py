"""The CLI suite's timeout. Its helpers live in `clitools`."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 60)
