"""The timeout of the suite that checks the test configuration itself."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)
