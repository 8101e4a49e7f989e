"""The interop suite's timeout (Faye's Ruby client and aiocometd-ng against the broker)."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 60)
