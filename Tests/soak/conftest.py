"""The soak suite's timeout, and its figures (heap and RSS growth per connect, descriptors) printed at the end of
the run."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)


def pytest_terminal_summary(terminalreporter):
    # The soak cells that ran fill FIGURES (Tests/soak is on sys.path once collected).
    from soakkit import FIGURES, table

    if FIGURES:
        terminalreporter.section("soak: broker heap and RSS growth per connect after warm-up (bytes), descriptors")
        for line in table(FIGURES).splitlines():
            terminalreporter.write_line(line)
