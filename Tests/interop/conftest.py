"""Interop tests: clients written by others (Faye's Ruby client, aiocometd-ng) against the broker under test.

The broker comes from Tests/wire/broker.py; PUBSUB_TARGET=faye runs the same tests against real Faye 1.4.0.
"""

import os
import sys

WIRE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "wire")
if WIRE not in sys.path:
    sys.path.insert(0, WIRE)

import pytest  # noqa: E402

from broker import target  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "pubsub_only: deliberate difference of pubsub from Faye")


def pytest_collection_modifyitems(config, items):
    if target() != "faye":
        return
    skip = pytest.mark.skip(reason="deliberate difference of pubsub from Faye (pubsub_only)")
    for item in items:
        if "pubsub_only" in item.keywords and "/interop/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


def pytest_report_header(config):
    return f"interop target: {target()}"
