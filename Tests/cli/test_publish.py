"""`pubsub publish` end to end against a live broker: argument, stdin, --lines, wrapping, and every error path."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clitools import SECRET, Broker, Listener, clean_env, closed_port, run, signed_ext

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def broker():
    with Broker(timeout=45, secret=SECRET, signature_expiration=3600) as b:
        yield b


@pytest.fixture(scope="module")
def open_broker():
    with Broker(timeout=45) as b:
        yield b


def listen(broker, channel, secret=SECRET):
    listener = Listener(broker)
    reply = listener.subscribe(channel, signed_ext(channel, secret) if secret else None)
    assert reply["successful"] is True, reply
    return listener


def test_publish_argument(broker):
    with listen(broker, "/cli/arg") as l:
        p = run(["publish", "--url", broker.url, "--secret", SECRET, "/cli/arg", '{"text":"hi","n":[1,2.50,null]}'])
        assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
        events = l.wait_events(1)
        assert len(events) == 1 and events[0]["channel"] == "/cli/arg"
        assert events[0]["data"] == {"text": "hi", "n": [1, 2.5, None]}
        # The token is blanked before delivery (key kept, value null), as PrivatePub does.
        assert "private_pub_token" in events[0]["ext"] and events[0]["ext"]["private_pub_token"] is None
        l.assert_quiet(0.5, count=1)


def test_publish_stdin_and_environment(broker):
    with listen(broker, "/cli/stdin") as l:
        env = clean_env(PUBSUB_URL=broker.url, PUBSUB_SECRET=SECRET)
        p = run(["publish", "/cli/stdin"], input='{"from": "stdin"}\n', env=env)
        assert (p.returncode, p.stderr) == (0, "")
        assert [e["data"] for e in l.wait_events(1)] == [{"from": "stdin"}]


def test_publish_lines_in_order(broker):
    n = 1200
    with listen(broker, "/cli/lines") as l:
        body = "".join(json.dumps({"i": i}) + ("\n\n" if i % 100 == 0 else "\n") for i in range(n))
        p = run(["publish", "--lines", "--url", broker.url, "--secret", SECRET, "/cli/lines"], input=body)
        assert (p.returncode, p.stderr) == (0, "")
        events = l.wait_events(n, timeout=20)
        assert [e["data"]["i"] for e in events] == list(range(n))


def test_publish_privatepub_wrapping(broker):
    with listen(broker, "/cli/wrap") as l:
        p = run(["publish", "--privatepub", "--url", broker.url, "--secret", SECRET, "/cli/wrap", '{"a":1}'])
        assert p.returncode == 0, p.stderr
        p = run(["publish", "--eval", "--url", broker.url, "--secret", SECRET, "/cli/wrap"],
                input='alert("hi");\n')
        assert p.returncode == 0, p.stderr
        events = l.wait_events(2)
        assert [e["data"] for e in events] == [{"channel": "/cli/wrap", "data": {"a": 1}},
                                               {"channel": "/cli/wrap", "eval": 'alert("hi");'}]


def test_refusal_prints_the_servers_error(broker):
    with listen(broker, "/cli/refused") as l:
        for args in (["--secret", "wrong"], []):
            p = run(["publish", "--url", broker.url] + args + ["/cli/refused", "1"])
            assert p.returncode == 1, (p.stdout, p.stderr)
            assert p.stderr.strip().splitlines() == ["pubsub: refused by the server: Incorrect token."]
        l.assert_quiet()


def test_lines_partly_refused(open_broker):
    with listen(open_broker, "/cli/partial", secret=None) as l:
        p = run(["publish", "--lines", "--url", open_broker.url, "/cli/partial"], input="1\nnull\n3\n")
        assert p.returncode == 1
        assert "message 2: refused by the server: 402:data:Missing required parameter" in p.stderr
        assert "2 of 3 messages acknowledged" in p.stderr
        assert [e["data"] for e in l.wait_events(2)] == [1, 3]


@pytest.mark.parametrize("args,stdin", [
    (["/cli/bad", "{nope"], None),
    (["/cli/bad", '{"a":1} trailing'], None),
    (["/cli/bad"], "{\"a\":"),
    (["--lines", "/cli/bad"], '{"ok":1}\n{"ok":2}\n[1,2\n{"ok":4}\n'),
    (["/cli/bad"], ""),
])
def test_invalid_json_fails_before_sending(broker, args, stdin):
    with listen(broker, "/cli/bad") as l:
        p = run(["publish", "--url", broker.url, "--secret", SECRET] + args, input=stdin)
        assert p.returncode == 65, (p.stdout, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        if "--lines" in args:
            assert "line 3: invalid JSON" in p.stderr
        l.assert_quiet()


@pytest.mark.parametrize("channel,why", [
    ("/cli/*", "wildcard"), ("/cli/**", "wildcard"), ("/**", "wildcard"),
    ("/meta/handshake", "/meta"), ("no-slash", "invalid channel"), ("/a//b", "invalid channel"),
])
def test_bad_channels_fail_before_connecting(channel, why):
    # The URL points nowhere: reaching the network would give 69, not 64.
    p = run(["publish", "--url", f"http://127.0.0.1:{closed_port()}/faye", channel, "1"])
    assert p.returncode == 64, (p.stdout, p.stderr)
    assert why in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_unreachable_server_fails_fast_with_one_line():
    port = closed_port()
    p = run(["publish", "--url", f"http://127.0.0.1:{port}/faye", "/cli/x", "1"])
    assert p.returncode == 69
    assert p.elapsed < 5
    assert p.stderr.strip().splitlines() == [f"pubsub: cannot connect to 127.0.0.1:{port}: connection refused"]


def test_silent_server_times_out():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        p = run(["publish", "--timeout", "1", "--url", f"http://127.0.0.1:{port}/faye", "/cli/x", "1"])
    assert p.returncode == 75
    assert p.elapsed < 5
    assert "no answer" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_http_error_status(broker):
    p = run(["publish", "--url", broker.url.replace("/faye", "/elsewhere"), "--secret", SECRET, "/cli/x", "1"])
    assert p.returncode == 69
    assert "HTTP 404" in p.stderr


def test_bad_url():
    for url in ["127.0.0.1:9292/faye", "ftp://h/faye", "http://:80/"]:
        p = run(["publish", "--url", url, "/cli/x", "1"])
        assert p.returncode == 64, (url, p.stderr)
        assert "invalid URL" in p.stderr


class RateLimiter:
    """A fake endpoint answering 429 with Retry-After `limited` times, then acknowledging every message."""

    def __init__(self, limited, retry_after="1"):
        self.limited = limited
        self.retry_after = retry_after
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((time.monotonic(), json.loads(body)))
                if len(outer.requests) <= outer.limited:
                    payload = b"Too many requests\n"
                    self.send_response(429)
                    self.send_header("Retry-After", outer.retry_after)
                    self.send_header("Content-Type", "text/plain")
                else:
                    messages = json.loads(body)
                    payload = json.dumps([{"id": m.get("id"), "channel": m["channel"], "successful": True}
                                          for m in messages]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/faye"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_rate_limited_publish_is_retried_after_retry_after():
    with RateLimiter(limited=2, retry_after="1") as fake:
        p = run(["publish", "--url", fake.url, "/cli/limited", '{"a":1}'])
        assert p.returncode == 0, p.stderr
        assert len(fake.requests) == 3
        times = [t for t, _ in fake.requests]
        assert times[1] - times[0] >= 0.9 and times[2] - times[1] >= 0.9
        assert all(body[0]["data"] == {"a": 1} for _, body in fake.requests)


def test_rate_limited_lines_are_each_delivered_once():
    with RateLimiter(limited=1, retry_after="0") as fake:
        body = "".join(f"{i}\n" for i in range(250))
        p = run(["publish", "--lines", "--url", fake.url, "/cli/limited"], input=body)
        assert p.returncode == 0, p.stderr
        acknowledged = [m["data"] for _, b in fake.requests[1:] for m in b]
        # The refused batch is sent again; batches already in flight behind it are not repeated.
        assert sorted(acknowledged) == list(range(250))
        assert fake.requests[0][1] == fake.requests[1][1] or len(acknowledged) == 250


def test_rate_limit_outlasting_the_retries():
    with RateLimiter(limited=1000, retry_after="0") as fake:
        p = run(["publish", "--url", fake.url, "/cli/limited", "1"])
        assert p.returncode == 75
        assert "rate limited" in p.stderr and "HTTP 429" in p.stderr
        assert len(fake.requests) == 6  # the first try and 5 retries


def test_help_documents_the_contract():
    p = run(["publish", "--help"])
    assert p.returncode == 0
    for text in ["--lines", "--privatepub", "--eval", "PUBSUB_URL", "PUBSUB_SECRET", "http://127.0.0.1:9292/faye",
                 "Exit status", "64", "65", "69", "75", "wildcard"]:
        assert text in p.stdout, text


def test_batch_size_sets_messages_per_request():
    with RateLimiter(limited=0) as fake:
        p = run(["publish", "--lines", "--batch-size", "10", "--url", fake.url, "/cli/batches"],
                input="".join(f"{i}\n" for i in range(25)))
        assert p.returncode == 0, p.stderr
        assert [len(body) for _, body in fake.requests] == [10, 10, 5]
        assert [m["data"] for _, body in fake.requests for m in body] == list(range(25))
