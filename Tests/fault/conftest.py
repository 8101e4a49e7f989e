"""Fixtures of the fault suite, its timeout, and its figures (per client: acknowledged, delivered, silent and
announced losses, duplicates, out of order) printed at the end of the run."""

from pubsubtest.browser import browser, page, page_server  # noqa: F401  (fixtures)
from pubsubtest.fixtures import make_broker, redis_server  # noqa: F401  (fixtures)
from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 90)


def pytest_terminal_summary(terminalreporter):
    # The fault tests that ran fill FIGURES (Tests/fault is on sys.path once collected).
    try:
        from faultkit import FIGURES, table
    except ImportError:
        return
    if FIGURES:
        terminalreporter.section("fault: acknowledged events, and what each client's application got")
        for r in FIGURES:
            terminalreporter.write_line(r.line())
        terminalreporter.write_line("")
        for line in table(FIGURES).splitlines():
            terminalreporter.write_line(line)
