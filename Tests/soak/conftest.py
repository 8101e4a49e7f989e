"""The soak suite's timeout, and its figures (bytes per connect, descriptors) printed at the end of the run."""

from pubsubtest.suite import suite_timeout

pytest_collection_modifyitems = suite_timeout(__file__, 120)


def pytest_terminal_summary(terminalreporter):
    from soakkit import FIGURES  # the soak cells that ran fill it (Tests/soak is on sys.path once collected)

    if FIGURES:
        terminalreporter.section("soak: broker RSS growth per connect after warm-up, descriptors")
        for line in FIGURES:
            terminalreporter.write_line(line)
