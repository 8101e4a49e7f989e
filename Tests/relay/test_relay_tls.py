"""The document feeds over TLS: `relay-fake <kind> --tls-cert --tls-key` with a certificate made by openssl here,
trusted by `pubsub relay <kind> --feed-ca-file` (events arrive) or not (a loud certificate error, no event, no crash)."""

import json
import os
import ssl
import tempfile
import time
import urllib.request

import pytest

from pubsubtest.broker import pubsub_bin
from pubsubtest.tls import make_authority
from relaykit import SECRET, Lines, events, start_fake, start_subscriber, broker, workdir  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def certificates():
    """A private certificate authority and a server certificate it signed for 127.0.0.1."""
    with tempfile.TemporaryDirectory(prefix="pubsub-relay-certs-") as d:
        yield make_authority(d, authority="pubsub relay test CA")


def start_tls_fake(kind, certificates, *args):
    return start_fake(kind, "--tls-cert", certificates["server.pem"], "--tls-key", certificates["server.key"], *args)


def control(certificates, port, method, path, body=None):
    """A control request to a fake over https, trusting the test authority."""
    context = ssl.create_default_context(cafile=certificates["ca.pem"])
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return json.loads(response.read() or b"{}")


# wss:// goes to localhost: WSClient sends the host as SNI, which TLS forbids for an IP address.
# Per source: the fake's extra arguments, how to add one document, the relay's source arguments, the channels.
SOURCES = {
    "couchdb": (
        [],
        lambda c, port, i: control(c, port, "PUT", f"/db/d{i}", {"n": i}),
        lambda port: ["--db-url", f"https://127.0.0.1:{port}/db", "--heartbeat", "500"],
        "/changes/db/*",
    ),
    "blip": (
        [],
        lambda c, port, i: control(c, port, "POST", f"/_fake/docs?id=d{i}"),
        lambda port: ["--sg-url", f"wss://relay:pw@localhost:{port}/db"],
        "/changes/db/*",
    ),
    "simperium": (
        ["--app", "app1", "--token", "relay-token=relay@example.com"],
        lambda c, port, i: control(c, port, "POST", "/_fake/put", {"bucket": "notes", "id": f"d{i}", "data": {"n": i}}),
        lambda port: ["--app-id", "app1", "--token", "relay-token", "--bucket", "notes",
                      "--simperium-url", f"wss://localhost:{port}"],
        "/changes/notes/*",
    ),
}


def start_relay(kind, port, broker, workdir, *extra):
    return Lines([pubsub_bin(), "relay", kind, *SOURCES[kind][2](port),
                  "--checkpoint", os.path.join(workdir, "checkpoint"), "--url", broker.url, "--secret", SECRET,
                  *extra])


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_feed_over_tls_with_its_authority_trusted(kind, certificates, broker, workdir):
    fake_args, add, _, pattern = SOURCES[kind]
    fake, port = start_tls_fake(kind, certificates, *fake_args)
    sub = start_subscriber(broker, pattern)
    relay = start_relay(kind, port, broker, workdir, "--feed-ca-file", certificates["ca.pem"])
    try:
        add(certificates, port, 0)
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the first event")
        add(certificates, port, 1)
        sub.wait_for(lambda: len(sub.lines()) >= 2, 30, "the live event")
        assert [m["data"]["id"] for m in events(sub)] == ["d0", "d1"]
    finally:
        relay.stop()
        sub.stop()
        fake.stop()
    assert relay.proc.returncode == 0, relay.errors()


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_an_untrusted_certificate_is_reported_loudly_without_an_event_or_a_crash(kind, certificates, broker, workdir):
    fake_args, add, _, pattern = SOURCES[kind]
    fake, port = start_tls_fake(kind, certificates, *fake_args)
    add(certificates, port, 0)
    sub = start_subscriber(broker, pattern)
    relay = start_relay(kind, port, broker, workdir)
    try:
        relay.wait_for(lambda: "TLS certificate verification failed" in relay.errors(), 30, "the certificate error")
        time.sleep(1)
        assert sub.lines() == []
        # CouchDB and Simperium stop with the error (exit 69); BLIP keeps retrying and logs it at error level.
        assert relay.proc.poll() in (None, 69), relay.errors()
        if relay.proc.poll() is None:
            assert any(" error " in line and "TLS certificate" in line for line in relay.err), relay.errors()
        else:
            assert "--feed-ca-file" in relay.errors()
    finally:
        relay.stop()
        sub.stop()
        fake.stop()
    assert relay.proc.returncode >= 0, relay.errors()


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_an_unreadable_feed_ca_file_is_one_line_and_exit_64(kind, broker, workdir):
    missing = os.path.join(workdir, "missing.pem")
    relay = start_relay(kind, 1, broker, workdir, "--feed-ca-file", missing)
    relay.proc.wait(timeout=30)
    relay.stop()
    assert relay.proc.returncode == 64, relay.errors()
    lines = [line for line in relay.err if line.strip()]
    assert len(lines) == 1 and "--feed-ca-file" in lines[0] and missing in lines[0], lines


def test_feed_ca_file_in_a_configuration_file(certificates, broker, workdir):
    fake, port = start_tls_fake("couchdb", certificates)
    config = os.path.join(workdir, "relay.json")
    with open(config, "w") as f:
        json.dump({"url": broker.url, "secret": SECRET, "feeds": [{
            "name": "docs", "source": "couchdb", "checkpoint": os.path.join(workdir, "checkpoint"),
            "db_url": f"https://127.0.0.1:{port}/db", "heartbeat": 500, "feed_ca_file": certificates["ca.pem"],
        }]}, f)
    sub = start_subscriber(broker, "/changes/db/*")
    relay = Lines([pubsub_bin(), "relay", "run", config])
    try:
        control(certificates, port, "PUT", "/db/d0", {"n": 0})
        sub.wait_for(lambda: len(sub.lines()) >= 1, 30, "the event")
        assert [m["data"]["id"] for m in events(sub)] == ["d0"]
    finally:
        relay.stop()
        sub.stop()
        fake.stop()
