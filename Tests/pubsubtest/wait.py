"""Waiting for a condition instead of sleeping for a guessed time."""

import time


def wait_until(predicate, timeout=5.0, interval=0.05, message="condition"):
    """Polls `predicate` until it returns a truthy value, and returns that value; raises AssertionError (naming
    `message` and the last value) when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{message} not met within {timeout}s (last: {last!r})")
