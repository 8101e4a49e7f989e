"""`pubsub subscribe` end to end: signed subscriptions, --count, --timeout, --full, WebSocket, refusals."""

import json
import subprocess
import threading
from functools import partial

import pytest

from pubsubtest.bayeux import publish as bayeux_publish
from pubsubtest.wait import wait_until
from clitools import SECRET, Broker, clean_env, closed_port, pubsub_bin, run

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def broker():
    with Broker(timeout=45, secret=SECRET, signature_expiration=3600) as b:
        yield b


class Subscriber:
    """`pubsub subscribe ...` in the background; waits for its "subscribed" line on stderr."""

    def __init__(self, args, env=None):
        self.proc = subprocess.Popen([pubsub_bin(), "subscribe"] + list(args), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env or clean_env())
        self.err_lines = []
        self.out_lines = []
        self.subscribed = threading.Event()
        self._readers = [threading.Thread(target=self._read_err, daemon=True),
                         threading.Thread(target=self._read_out, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_err(self):
        for line in self.proc.stderr:
            self.err_lines.append(line)
            if "subscribed to" in line:
                self.subscribed.set()

    def _read_out(self):
        for line in self.proc.stdout:     # `pubsub subscribe` writes each line at once
            self.out_lines.append(line)

    def wait_subscribed(self, timeout=10):
        assert self.subscribed.wait(timeout), f"not subscribed: {self.err_lines}"

    def finish(self, timeout=15):
        self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(timeout=2)
        return self.proc.returncode, "".join(self.out_lines), "".join(self.err_lines)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


# PrivatePub's publish: the secret as ext.private_pub_token.
publish = partial(bayeux_publish, ext={"private_pub_token": SECRET})


@pytest.mark.parametrize("transport", [[], ["--websocket"]])
def test_count_prints_data_lines_and_exits(broker, transport):
    s = Subscriber(["--url", broker.url, "--secret", SECRET, "--count", "3", "--timeout", "20"] + transport
                   + ["/sub/a", "/sub/wild/*"])
    try:
        s.wait_subscribed()
        publish(broker, "/sub/a", {"n": 1})
        publish(broker, "/sub/wild/x", [2, "two"])
        publish(broker, "/sub/other", {"never": True})
        publish(broker, "/sub/a", "three")
        rc, out, err = s.finish()
    finally:
        s.kill()
    assert rc == 0, err
    assert out.splitlines() == ['{"n":1}', '[2,"two"]', '"three"']
    expected = "websocket" if transport else "long-polling"
    assert f"subscribed to /sub/a, /sub/wild/* ({expected})" in err


def test_full_prints_whole_messages(broker):
    s = Subscriber(["--url", broker.url.replace("http://", "ws://"), "--secret", SECRET, "--count", "1",
                    "--full", "--timeout", "20", "/sub/full"])
    try:
        s.wait_subscribed()
        publish(broker, "/sub/full", {"x": 1})
        rc, out, err = s.finish()
    finally:
        s.kill()
    assert rc == 0, err
    [line] = out.splitlines()
    message = json.loads(line)
    assert message["channel"] == "/sub/full" and message["data"] == {"x": 1}
    assert message["ext"]["private_pub_token"] is None
    assert "(websocket)" in err


def test_timeout_without_count_exits_zero(broker):
    p = run(["subscribe", "--url", broker.url, "--secret", SECRET, "--timeout", "1", "--quiet", "/sub/t"])
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert 0.9 <= p.elapsed < 6


def test_timeout_before_count_is_a_failure(broker):
    p = run(["subscribe", "--url", broker.url, "--secret", SECRET, "--timeout", "1", "--count", "2", "/sub/t"])
    assert p.returncode == 75
    assert "timed out after 1 s with 0 of 2 messages" in p.stderr


def test_sigterm_ends_cleanly(broker):
    s = Subscriber(["--url", broker.url, "--secret", SECRET, "/sub/term"])
    try:
        s.wait_subscribed()
        s.proc.terminate()
        rc, out, err = s.finish(timeout=10)
    finally:
        s.kill()
    assert rc == 0, err


@pytest.mark.parametrize("args,error", [
    (["--secret", "wrong"], "Incorrect signature."),
    ([], "Incorrect signature."),
])
def test_refused_subscription(broker, args, error):
    p = run(["subscribe", "--url", broker.url, "--timeout", "10"] + args + ["/sub/refused"])
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [f"pubsub: refused by the server: {error}"]
    assert p.elapsed < 8


def test_hmac_refused_by_a_privatepub_broker(broker):
    p = run(["subscribe", "--url", broker.url, "--secret", SECRET, "--hmac", "--timeout", "10", "/sub/h"])
    assert p.returncode == 1
    assert "Incorrect signature." in p.stderr


def test_hmac_bound_subscription(tmp_path):
    with Broker(timeout=45, secret=SECRET, extra_args=["--signatures", "hmac", "--require-client-binding"]) as b:
        s = Subscriber(["--url", b.url, "--secret", SECRET, "--hmac", "--count", "1", "--timeout", "20", "/sub/h"])
        try:
            s.wait_subscribed()
            publish(b, "/sub/h", {"strong": True})
            rc, out, err = s.finish()
        finally:
            s.kill()
        assert rc == 0, err
        assert out.splitlines() == ['{"strong":true}']
        # PrivatePub's SHA-1 signature is not accepted in hmac mode.
        p = run(["subscribe", "--url", b.url, "--secret", SECRET, "--timeout", "10", "/sub/h"])
        assert p.returncode == 1 and "Incorrect signature." in p.stderr


def test_unreachable_and_bad_arguments():
    port = closed_port()
    p = run(["subscribe", "--url", f"http://127.0.0.1:{port}/faye", "--timeout", "10", "/sub/x"])
    assert p.returncode == 69 and p.elapsed < 5
    assert p.stderr.strip().splitlines() == [f"pubsub: cannot connect to 127.0.0.1:{port}: connection refused"]
    for channel in ["/meta/connect", "/service/x", "nope"]:
        p = run(["subscribe", "--url", f"http://127.0.0.1:{port}/faye", channel])
        assert p.returncode == 64, (channel, p.stderr)
    p = run(["subscribe", "--url", f"http://127.0.0.1:{port}/faye", "--hmac", "/sub/x"])
    assert p.returncode == 64 and "--hmac needs a secret" in p.stderr


@pytest.mark.parametrize("accept_gaps", [False, True])
def test_a_session_the_broker_ends_is_reported_then_resumed(accept_gaps):
    """A consumer too slow for the publish rate loses its session (queue overflow): subscribe says so on stderr,
    handshakes again and resumes; the 200 events it missed are more than its queue of 5 can recover
    (recovered: false), so it exits with 3, or with --accept-gaps says so and goes on receiving."""
    with Broker(timeout=45, secret=SECRET, signature_expiration=3600, extra_args=["--max-queue", "5"]) as b:
        s = Subscriber(["--url", b.url, "--secret", SECRET, "--timeout", "30", "/slow/feed"]
                       + (["--accept-gaps"] if accept_gaps else []))
        try:
            s.wait_subscribed()
            # One request of 200 events queues them all for the subscriber at once: more than its 5.
            lines = "\n".join(json.dumps({"n": i}) for i in range(200)) + "\n"
            p = run(["publish", "--url", b.url, "--secret", SECRET, "--lines", "--batch-size", "200", "/slow/feed"],
                    input=lines)
            assert p.returncode == 0, p.stderr
            wait_until(lambda: any("recovered: false" in l for l in s.err_lines), 20, raises=False)
            notice = [l for l in s.err_lines if "ended this session" in l]
            assert notice and "Queue overflow" in notice[0], s.err_lines
            gap = [l for l in s.err_lines if "recovered: false" in l]
            assert gap and "/slow/feed" in gap[0], s.err_lines
            if not accept_gaps:
                assert s.proc.wait(15) == 3, s.err_lines
                return
            assert "going on from here" in gap[0], s.err_lines
            # Subscribed again (the gap is told from the resumed subscription's reply): a later event arrives.
            publish(b, "/slow/feed", {"after": True})
            wait_until(lambda: '{"after":true}\n' in s.out_lines, 10, raises=False)
            s.proc.terminate()
            _, out, _ = s.finish()
            assert '{"after":true}' in out.splitlines(), out[-500:]
        finally:
            s.kill()
