"""Helpers of the CLI suite: run the pubsub binary, and watch a broker over a WebSocket."""

import hashlib
import hmac
import json
import os
import subprocess
import time

from pubsubtest.broker import Broker, pubsub_bin  # noqa: F401  (re-exported for the test modules)
from pubsubtest.ports import closed_port  # noqa: F401  (re-exported for the test modules)
from pubsubtest.websocket import BayeuxListener

SECRET = "secret"
RUN_TIMEOUT = 30     # no CLI run of this suite may take longer
QUIET = 1.0          # seconds watched for "nothing arrives"


def clean_env(**extra):
    """The test's environment without PUBSUB_* (so a developer's settings cannot leak in), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUBSUB_") and k not in ("RAILS_ENV", "RACK_ENV")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, *, input=None, env=None, timeout=RUN_TIMEOUT):
    """Run `pubsub ARGS...`; returns CompletedProcess with text stdout/stderr and `elapsed`."""
    t0 = time.monotonic()
    p = subprocess.run([pubsub_bin()] + list(args), input=input, capture_output=True, text=True,
                       env=env if env is not None else clean_env(), timeout=timeout)
    p.elapsed = time.monotonic() - t0
    return p


def now_ms():
    return int(round(time.time() * 1000))


def sha1_sign(channel, ts, secret=SECRET):
    return hashlib.sha1(f"{secret}{channel}{ts}".encode()).hexdigest()


def hmac_sign(channel, ts, client_id="", secret=SECRET):
    text = f"subscribe\n{channel}\n{ts}\n{client_id}"
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def signed_ext(channel, secret=SECRET, ts=None):
    ts = now_ms() if ts is None else ts
    return {"private_pub_signature": sha1_sign(channel, ts, secret), "private_pub_timestamp": ts}


class Listener(BayeuxListener):
    """The shared threaded WebSocket client (pubsubtest.websocket), handshaken and listening: `subscribe` returns
    the server's reply, events are collected as they come, connects are renewed as their replies arrive."""

    def __init__(self, broker, timeout=10):
        super().__init__(broker, timeout=timeout)
        self.handshake()
        self.listen()

    def assert_quiet(self, seconds=QUIET, count=0):
        """Watch for `seconds`: no events beyond the first `count` arrive."""
        time.sleep(seconds)
        with self.cond:
            assert len(self.events) == count, self.events
