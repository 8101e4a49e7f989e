"""/metrics in Prometheus text (parsed with prometheus_client's parser), moving as messages flow; /healthz and
/readyz; --metrics-port."""

import json
import time

import pytest
import requests
import websocket

from opshelp import (Broker, bayeux, connect, free_port, handshake, metric, post, publish, scrape, subscribe,
                     wait_until)

pytestmark = pytest.mark.timeout(120)

FAMILIES = [
    "pubsub_connections", "pubsub_connections_accepted_total", "pubsub_connections_refused_total",
    "pubsub_clients", "pubsub_sessions", "pubsub_subscriptions", "pubsub_channels", "pubsub_queue_depth",
    "pubsub_messages_published_total", "pubsub_messages_delivered_total", "pubsub_bytes_out_total",
    "pubsub_slow_consumer_drops_total", "pubsub_sessions_expired_total", "pubsub_events_resent_total",
    "pubsub_request_errors_total",
    "pubsub_publish_rate_limited_total", "pubsub_auth_refusals_total", "pubsub_ready", "pubsub_draining",
    "pubsub_tls_certificate_not_after_seconds", "pubsub_tls_reloads_total",
]


@pytest.fixture(scope="module")
def b():
    with Broker(timeout=5) as broker:
        yield broker


def metrics_url(b):
    return f"http://127.0.0.1:{b.port}/metrics"


def test_every_metric_family_is_there_with_help_and_type(b):
    text = requests.get(metrics_url(b), timeout=10).text
    for family in FAMILIES:
        assert f"# TYPE {family} " in text, family
        assert f"# HELP {family} " in text, family
    samples = scrape(metrics_url(b))
    assert metric(samples, "pubsub_ready") == 1.0
    assert metric(samples, "pubsub_draining") == 0.0


def test_counters_and_gauges_move_when_messages_flow(b):
    before = scrape(metrics_url(b))
    ws = websocket.create_connection(b.ws_url, timeout=10)
    ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["websocket"]}]))
    wcid = json.loads(ws.recv())[0]["clientId"]
    ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": wcid, "subscription": "/m/**"}]))
    ws.recv()
    ws.send(json.dumps([{"channel": "/meta/connect", "clientId": wcid, "connectionType": "websocket"}]))
    ws.recv()
    cid = handshake(b.url)
    subscribe(b.url, cid, "/m/a")
    connect(b.url, cid)

    during = scrape(metrics_url(b))
    assert metric(during, "pubsub_clients", transport="websocket") == 1.0
    assert metric(during, "pubsub_sessions") == metric(before, "pubsub_sessions") + 2
    assert metric(during, "pubsub_subscriptions") == metric(before, "pubsub_subscriptions") + 2
    assert metric(during, "pubsub_channels") >= 2

    for i in range(10):
        publish(b.url, "/m/a", {"i": i})
    received = 0
    ws.settimeout(5)
    while received < 10:
        received += len(json.loads(ws.recv()))
    after = scrape(metrics_url(b))
    assert metric(after, "pubsub_messages_published_total") == metric(before, "pubsub_messages_published_total") + 10
    # Each publish went to both subscribers.
    assert metric(after, "pubsub_messages_delivered_total") == metric(before, "pubsub_messages_delivered_total") + 20
    assert metric(after, "pubsub_bytes_out_total") > metric(before, "pubsub_bytes_out_total") + 10 * 20
    # The long-poll client has not connected since: its ten events wait in its queue.
    assert metric(after, "pubsub_queue_depth") == 10.0
    assert metric(after, "pubsub_connections") >= 1
    connect(b.url, cid)
    assert metric(scrape(metrics_url(b)), "pubsub_queue_depth") == 0.0
    ws.close()
    wait_until(lambda: metric(scrape(metrics_url(b)), "pubsub_clients", transport="websocket") == 0.0, 5,
               message="websocket gauge back to 0")


def test_a_held_long_poll_counts_as_a_client_of_its_transport(b):
    from concurrent.futures import ThreadPoolExecutor
    cid = handshake(b.url)
    connect(b.url, cid)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(connect, b.url, cid, timeout=15)
        wait_until(lambda: metric(scrape(metrics_url(b)), "pubsub_clients", transport="long-polling") == 1.0, 5,
                   message="long-polling gauge at 1")
        publish(b.url, "/elsewhere", {})
        held.result(timeout=10)
    wait_until(lambda: metric(scrape(metrics_url(b)), "pubsub_clients", transport="long-polling") == 0.0, 10,
               message="long-polling gauge back to 0")


def test_slow_consumer_drops_are_counted():
    with Broker(timeout=5, extra_args=["--max-queue", "3"]) as small:
        url = f"http://127.0.0.1:{small.port}/metrics"
        cid = handshake(small.url)
        subscribe(small.url, cid, "/q")
        for i in range(3):
            publish(small.url, "/q", {"i": i})
        samples = scrape(url)
        assert metric(samples, "pubsub_queue_depth") == 3.0
        assert metric(samples, "pubsub_slow_consumer_drops_total") == 0.0
        publish(small.url, "/q", {"i": 3})
        samples = scrape(url)
        assert metric(samples, "pubsub_slow_consumer_drops_total") == 1.0
        assert metric(samples, "pubsub_queue_depth") == 0.0
        assert metric(samples, "pubsub_sessions") == 0.0
        assert metric(samples, "pubsub_bayeux_errors_total", code="409") == 0.0
        reply = connect(small.url, cid)
        assert reply[0]["error"].startswith("409:"), reply
        assert metric(scrape(url), "pubsub_bayeux_errors_total", code="409") == 1.0


def test_request_errors_are_counted_by_kind(b):
    before = scrape(metrics_url(b))
    r = requests.post(b.url, data="{not json", headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400
    r = requests.post(b.url, data=b"x" * (2 << 20), headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 413
    reply = bayeux(b.url, [{"channel": "/meta/connect", "clientId": "nobody", "connectionType": "long-polling"}])
    assert reply[0]["error"].startswith("401:")
    after = scrape(metrics_url(b))
    for kind in ("bad_request", "payload_too_large"):
        assert (metric(after, "pubsub_request_errors_total", kind=kind)
                == metric(before, "pubsub_request_errors_total", kind=kind) + 1), kind
    assert (metric(after, "pubsub_bayeux_errors_total", code="401")
            == metric(before, "pubsub_bayeux_errors_total", code="401") + 1)


def test_health_and_readiness_on_the_broker_port(b):
    r = requests.get(f"http://127.0.0.1:{b.port}/healthz", timeout=10)
    assert (r.status_code, r.text) == (200, "ok\n")
    r = requests.get(f"http://127.0.0.1:{b.port}/readyz", timeout=10)
    assert (r.status_code, r.text) == (200, "ready\n")


def test_auth_refusals_are_counted_by_reason():
    with Broker(timeout=5, secret="s3cret") as b:
        url = f"http://127.0.0.1:{b.port}/metrics"
        reply = bayeux(b.url, [{"channel": "/x", "data": 1}])
        assert reply[0]["successful"] is False
        reply = bayeux(b.url, [{"channel": "/x", "data": 1, "ext": {"private_pub_token": "wrong"}}])
        assert reply[0]["successful"] is False
        cid = handshake(b.url)
        reply = bayeux(b.url, [{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/x",
                                "ext": {"private_pub_signature": "00", "private_pub_timestamp": 1}}])
        assert reply[0]["successful"] is False
        samples = scrape(url)
        assert metric(samples, "pubsub_auth_refusals_total", reason="bad_token") == 2.0
        assert metric(samples, "pubsub_auth_refusals_total", reason="bad_signature") == 1.0
        assert metric(samples, "pubsub_auth_refusals_total", reason="expired_signature") == 0.0


def test_a_metrics_port_takes_metrics_off_the_broker_port():
    metrics_port = free_port()
    with Broker(timeout=5, extra_args=["--metrics-port", str(metrics_port)]) as b:
        handshake(b.url)
        samples = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        assert metric(samples, "pubsub_sessions") == 1.0
        assert requests.get(f"http://127.0.0.1:{b.port}/metrics", timeout=10).status_code == 404
        for port in (b.port, metrics_port):
            assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
            assert requests.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200
        assert requests.get(f"http://127.0.0.1:{metrics_port}/faye", timeout=10).status_code == 404
