"""The hostile-client suite's timeout. No fixtures: tests start what they need with `hostile_broker(...)`."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 90)
