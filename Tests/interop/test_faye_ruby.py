"""Faye's own Ruby client (Debian ruby-faye 1.4.0, Faye::Client) against the broker under test.

faye_client.rb runs one scenario and prints JSON lines: every message through the client's extensions
("wire" lines, out and in) and what the client saw (subscribed, message, published, ...). The assertions
are made here, on both: what the client's API delivered and what actually arrived on the wire (the
client filters deliveries by its own subscriptions, so a server that over-delivers is only visible on
the wire).
"""

import json
import os
import shutil
import subprocess
import time

import pytest

# pubsubtest.broker starts the broker under test (PUBSUB_TARGET=pubsub|faye).
from pubsubtest.broker import Broker, target

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "faye_client.rb")

SCRIPT_DEADLINE = 15   # the script gives up (and says so) after this many seconds
PROCESS_LIMIT = 22     # the script is killed after this many seconds
TRANSPORTS = ["websocket", "long-polling"]

pytestmark = pytest.mark.timeout(30)


def _ruby_faye_available():
    ruby = shutil.which("ruby")
    if not ruby:
        return "ruby is not installed"
    probe = subprocess.run([ruby, "-e", "require 'faye'; require 'eventmachine'; require 'faye/websocket'"],
                           capture_output=True, text=True, timeout=20)
    if probe.returncode != 0:
        return f"the faye gem does not load: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def ruby_faye():
    problem = _ruby_faye_available()
    if problem:
        pytest.fail(f"{problem}; run scripts/install-test-deps (Debian ruby-faye)")


class Run:
    """The parsed output of one faye_client.rb run."""

    def __init__(self, broker, transport, scenario, proc, elapsed):
        self.broker = broker
        self.transport = transport
        self.scenario = scenario
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.elapsed = elapsed
        self.events = []
        for line in proc.stdout.splitlines():
            line = line.strip()
            if line:
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    self.events.append({"event": "unparsable", "line": line})

    def of(self, kind, **match):
        return [e for e in self.events
                if e.get("event") == kind and all(e.get(k) == v for k, v in match.items())]

    def wire(self, client, direction):
        return [e["message"] for e in self.of("wire", client=client, dir=direction)]

    def delivered(self, client):
        """Event messages (not replies) that reached `client` on the wire."""
        return [m for m in self.wire(client, "in") if "successful" not in m and "data" in m]

    def sent(self, client, channel):
        return [m for m in self.wire(client, "out") if m.get("channel") == channel]

    def replies(self, client, channel):
        return [m for m in self.wire(client, "in") if m.get("channel") == channel and "successful" in m]

    def context(self):
        """Everything needed to understand a failure: the client's capture and the server's log."""
        return (f"\n--- faye_client.rb {self.transport} {self.scenario}: exit {self.returncode} "
                f"after {self.elapsed:.2f}s, target {self.broker.target}\n{self.stdout}"
                f"--- stderr\n{self.stderr[-4000:]}\n--- server log (tail)\n{self.broker.log()[-4000:]}")


def run_client(broker, transport, scenario):
    env = dict(os.environ)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(["ruby", SCRIPT, broker.url, transport, scenario, str(SCRIPT_DEADLINE)],
                              capture_output=True, text=True, timeout=PROCESS_LIMIT, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"faye_client.rb did not exit within {PROCESS_LIMIT}s\n{out}\n"
                    f"--- server log\n{broker.log()[-4000:]}")
    return Run(broker, transport, scenario, proc, time.monotonic() - t0)


def assert_common(run):
    """What every scenario needs: it finished, used the transport asked for, and every client left cleanly."""
    ctx = run.context()
    done = run.of("done")
    assert done, "no 'done' line: the client crashed" + ctx
    assert done[-1]["ok"] is True, f"scenario failed: {done[-1].get('reason')}" + ctx
    assert run.returncode == 0, ctx
    assert not run.of("error"), ctx

    clients = sorted({e["client"] for e in run.of("wire")})
    assert clients, ctx
    for c in clients:
        hs = run.replies(c, "/meta/handshake")
        assert len(hs) == 1 and hs[0]["successful"] is True, f"handshake of {c}: {hs}" + ctx
        if run.transport == "websocket":
            assert "websocket" in hs[0]["supportedConnectionTypes"], ctx

        connects = run.sent(c, "/meta/connect")
        assert connects, f"client {c} never sent /meta/connect" + ctx
        types = {m.get("connectionType") for m in connects}
        # Faye's client names the transport it actually uses in every /meta/connect.
        assert types == {run.transport}, \
            f"client {c} connected with {sorted(types)}, expected only {run.transport}" + ctx

        used = run.of("transport", client=c)
        expected_class = {"websocket": "Faye::Transport::WebSocket", "long-polling": "Faye::Transport::Http"}
        assert used and used[-1]["class"] == expected_class[run.transport], \
            f"client {c} ended on transport {used}" + ctx

        for m in run.wire(c, "in"):
            if m.get("channel", "").startswith("/meta/"):
                continue
            if "successful" in m:
                assert m.get("successful") is True, f"publish of {c} refused: {m}" + ctx

        disc = run.of("disconnected", client=c)
        assert disc and disc[-1]["status"] == "ok", f"disconnect of {c}: {disc}" + ctx
        replies = run.replies(c, "/meta/disconnect")
        assert replies and replies[-1]["successful"] is True, ctx


@pytest.fixture(scope="module")
def faye_broker(ruby_faye):
    with Broker() as b:
        yield b


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_subscribe_publish_receive(faye_broker, transport):
    """a and b subscribe to /interop/chat; a publishes, b publishes; each gets both, exactly once."""
    run = run_client(faye_broker, transport, "pubsub")
    assert_common(run)
    ctx = run.context()
    chan = "/interop/chat"
    from_a = {"from": "a", "text": "hello from a"}
    from_b = {"from": "b", "text": "hello from b", "n": [1, 2.5, None, True]}

    for c in ("a", "b"):
        sub = run.replies(c, "/meta/subscribe")
        assert sub and sub[0]["successful"] is True and sub[0]["subscription"] == chan, ctx
        assert {e["channel"] for e in run.of("subscribed", client=c)} == {chan}, ctx

        got = [m["data"] for m in run.delivered(c)]
        assert sorted(got, key=json.dumps) == sorted([from_a, from_b], key=json.dumps), \
            f"client {c} received {got} on the wire" + ctx
        for m in run.delivered(c):
            assert m["channel"] == chan, ctx
        api = [e["data"] for e in run.of("message", client=c)]
        assert sorted(api, key=json.dumps) == sorted([from_a, from_b], key=json.dumps), ctx

    for c, data in (("a", from_a), ("b", from_b)):
        assert [e["data"] for e in run.of("published", client=c)] == [data], ctx


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_wildcard_subscriptions(faye_broker, transport):
    """/room/* gets one level below /room only; /deep/** gets every level below /deep."""
    run = run_client(faye_broker, transport, "wildcard")
    assert_common(run)
    ctx = run.context()

    subs = {m["subscription"] for m in run.replies("a", "/meta/subscribe") if m["successful"]}
    assert subs == {"/room/*", "/deep/**"}, ctx

    published = [e["channel"] for e in run.of("published", client="b")]
    assert len(published) == 7, f"b's publishes acknowledged: {published}" + ctx

    wire = sorted((m["channel"], m["data"]["n"]) for m in run.delivered("a"))
    assert wire == [("/deep/a/b/c", 5), ("/room/last", 7), ("/room/lobby", 1)], \
        f"a received on the wire: {wire}" + ctx
    api = sorted((e["subscription"], e["channel"]) for e in run.of("message", client="a"))
    assert api == [("/deep/**", "/deep/a/b/c"), ("/room/*", "/room/last"), ("/room/*", "/room/lobby")], ctx
    assert run.delivered("b") == [], ctx


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unsubscribe_stops_delivery(faye_broker, transport):
    """After a successful /meta/unsubscribe nothing more is delivered on that channel."""
    run = run_client(faye_broker, transport, "unsubscribe")
    assert_common(run)
    ctx = run.context()
    topic, sentinel = "/interop/topic", "/interop/sentinel"

    unsub_sent = run.sent("a", "/meta/unsubscribe")
    assert [m["subscription"] for m in unsub_sent] == [topic], ctx
    unsub = run.replies("a", "/meta/unsubscribe")
    assert len(unsub) == 1 and unsub[0]["successful"] is True and unsub[0]["subscription"] == topic, ctx

    wire = [(m["channel"], m["data"]["n"]) for m in run.delivered("a")]
    assert (topic, 1) in wire, ctx
    assert (topic, 2) not in wire, f"delivered after the unsubscribe was acknowledged: {wire}" + ctx
    assert sorted(wire) == [(sentinel, 3), (topic, 1)], f"a received on the wire: {wire}" + ctx
    assert [e["data"]["n"] for e in run.of("published", client="b")] == [1, 2, 3], ctx
