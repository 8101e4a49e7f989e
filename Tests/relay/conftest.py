import os
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "wire"))
sys.path.insert(0, HERE)

from broker import Broker  # noqa: E402  (found through the path set above)
from relaykit import SECRET  # noqa: E402


@pytest.fixture
def broker():
    """A broker whose publishers must present SECRET, as the relay does."""
    with Broker(secret=SECRET) as b:
        yield b


@pytest.fixture
def workdir(request):
    """A temporary directory for checkpoints and configuration files, named after the suite."""
    suite = request.module.__name__.rpartition(".")[2].removeprefix("test_").replace("_", "-")
    with tempfile.TemporaryDirectory(prefix=f"pubsub-{suite}-") as d:
        yield d
