"""Fixtures of the wire suites and their timeout. The helpers live in `wirekit` (a module name no other test folder
uses), so that test modules import them by a name that another folder's conftest.py cannot shadow."""

from pubsubtest.fixtures import make_broker, pool  # noqa: F401  (fixtures)
from pubsubtest.suite import suite_timeout
from wirekit import broker, short_broker  # noqa: F401  (fixtures)

pytest_collection_modifyitems = suite_timeout(__file__, 90)
