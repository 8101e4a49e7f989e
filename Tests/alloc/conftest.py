"""The allocation-count suite: its timeout, and the counts it measured, printed at the end of the run beside their
thresholds (Tests/alloc/thresholds.json)."""

import sys

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)


def pytest_terminal_summary(terminalreporter):
    module = sys.modules.get("test_allocations")
    if module is None or not module.MEASURED:
        return
    terminalreporter.section(f"allocations ({module.BUILD} build): measured, threshold")
    for name, value in module.MEASURED.items():
        terminalreporter.write_line(f"{name}: {value:.2f}, {module.THRESHOLDS[name]}")
