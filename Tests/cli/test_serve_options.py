"""`pubsub serve` options with a fixed set of values (--engine, --websocket-compression, --log-level,
--signatures) take them from the flag or from its PUBSUB_* variable alike, and refuse anything else with one
error line naming the choices and the usage exit status, before opening a port."""

import subprocess

import pytest

from clitools import clean_env
from pubsubtest.broker import pubsub_bin
from pubsubtest.ports import closed_port

CASES = [
    ("--engine", "PUBSUB_ENGINE", "mongo", ["memory", "redis"]),
    ("--websocket-compression", "PUBSUB_WEBSOCKET_COMPRESSION", "maybe", ["on", "off"]),
    ("--log-level", "PUBSUB_LOG_LEVEL", "loud", ["trace", "critical"]),
    ("--signatures", "PUBSUB_SIGNATURES", "md5", ["privatepub", "hmac", "both"]),
]


def serve(args, **env):
    return subprocess.run([pubsub_bin(), "serve", "--port", str(closed_port()), "--secret", "s", *args],
                          capture_output=True, text=True, timeout=15, env=clean_env(**env))


@pytest.mark.parametrize("flag,variable,bad,choices", CASES, ids=[c[0] for c in CASES])
def test_a_value_outside_the_choices_is_refused_from_the_flag_and_from_the_variable(flag, variable, bad, choices):
    for p in (serve([flag, bad]), serve([], **{variable: bad})):
        assert p.returncode == 64, p.stderr
        first = p.stderr.splitlines()[0]
        assert first.startswith("Error: ") and f"'{bad}'" in first or "one of the following" in first, p.stderr
        assert all(choice in p.stderr for choice in choices), p.stderr
        assert "listening on" not in p.stderr


def start(port, **env):
    """`pubsub serve` on `port` until it says where it listens; returns the process and its log lines so far."""
    p = subprocess.Popen([pubsub_bin(), "serve", "--port", str(port), "--secret", "s", "--signatures", "hmac"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=clean_env(**env))
    lines = []
    for line in p.stderr:
        lines.append(line)
        if "listening on" in line or "cannot listen" in line:
            break
    return p, "".join(lines)


def test_a_flag_is_set_by_its_variable_with_1_true_or_yes():
    port = closed_port()
    first, log = start(port, PUBSUB_REUSE_PORT="yes", PUBSUB_REQUIRE_CLIENT_BINDING="true")
    second = None
    try:
        assert "listening on" in log and "bound to the clientId" in log, log
        # --reuse-port from its variable: a second broker shares the port.
        second, log = start(port, PUBSUB_REUSE_PORT="1")
        assert "listening on" in log, log
    finally:
        for p in (first, second):
            if p is not None:
                p.terminate()
                p.wait(timeout=15)
