"""What a suite's conftest.py declares about its folder.

Every folder of Tests/ runs in one pytest call (scripts/test) under the one configuration of the repository's
pytest.ini, so a folder cannot have its own pytest.ini: pytest would read only one of them. A folder whose tests
need longer than the default timeout says so in its conftest.py:

    from pubsubtest.suite import suite_timeout

    pytest_collection_modifyitems = suite_timeout(__file__, 180)
"""

import os

import pytest


def suite_timeout(conftest_file, seconds):
    """A `pytest_collection_modifyitems` hook giving every test under the folder of `conftest_file` a timeout of
    `seconds`, unless the test has its own `@pytest.mark.timeout`. The hook sees the items of the whole run
    (pytest calls collection hooks of every conftest.py with all items), so it picks those under its folder."""
    folder = os.path.dirname(os.path.abspath(conftest_file)) + os.sep

    def pytest_collection_modifyitems(config, items):
        for item in items:
            if str(item.path).startswith(folder) and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(seconds))

    return pytest_collection_modifyitems
