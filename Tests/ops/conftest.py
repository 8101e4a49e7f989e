"""Fixtures of the operations suite: systemd notifications, socket activation, drain, metrics, TLS, limits,
and the files of Deploy/."""

import pytest

from opshelp import NotifySocket


@pytest.fixture
def notify():
    n = NotifySocket()
    yield n
    n.close()
