"""pytest's hooks and fixtures for the wire suites. The helpers live in `wirekit` (a module name no other test
folder uses), so that test modules import them by a name that another folder's conftest.py cannot shadow."""

from wirekit import (  # noqa: F401  (pytest finds hooks and fixtures by name in this module)
    broker,
    make_broker,
    pool,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_report_header,
    short_broker,
)
