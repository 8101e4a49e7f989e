"""Hooks for every Python suite (no fixtures here: they would be seen by every folder; a suite's conftest.py
imports the shared ones it uses from pubsubtest.fixtures)."""

import os

import pytest

from pubsubtest.broker import target


def pytest_collection_modifyitems(config, items):
    """Against real Faye (PUBSUB_TARGET=faye), tests of a deliberate difference are skipped, unless
    WIRE_RUN_PUBSUB_ONLY=1 asks to see them fail."""
    if target() != "faye" or os.environ.get("WIRE_RUN_PUBSUB_ONLY") == "1":
        return
    skip = pytest.mark.skip(reason="deliberate difference of pubsub from Faye (pubsub_only)")
    for item in items:
        if "pubsub_only" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    return f"target: {target()}"
