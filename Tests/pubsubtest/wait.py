"""Waiting for a condition instead of sleeping for a guessed time."""

import time


def wait_until(predicate, timeout=5.0, interval=0.05, message="condition", *, raises=True, ignore=()):
    """Polls `predicate` every `interval` seconds until it returns a truthy value, and returns that value. It is
    asked at least once, the last time once `timeout` seconds have passed; then `wait_until` raises AssertionError
    naming `message` and the last value, or with raises=False returns that last (falsy) value, for a test that
    asserts on it with its own message. An exception of a type in `ignore` counts as a falsy answer (None)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            last = predicate()
        except ignore:
            last = None
        if last:
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    if not raises:
        return last
    raise AssertionError(f"{message} not met within {timeout}s (last: {last!r})")
