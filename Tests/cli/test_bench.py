"""`pubsub bench` smoke tests: tiny scenarios against a live broker, checking that the load generator runs,
counts every expected delivery and loses none. Nothing here is timed: benchmarks live in BENCHMARKS.md."""

import json
import subprocess

import pytest

# pubsubtest.broker starts the broker under test (PUBSUB_TARGET=pubsub|faye).
from pubsubtest.broker import Broker, pubsub_bin

pytestmark = pytest.mark.timeout(90)


def bench(broker, *args):
    """Runs `pubsub bench` against the broker and returns its JSON report."""
    cmd = [pubsub_bin(), "bench", "--url", broker.url, "--json", "--quiet",
           "--server-pid", str(broker.pid), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return json.loads(done.stdout)


def check_complete(report, connections):
    assert report["connected"] == connections
    assert report["connect_failures"] == 0
    assert report["errors"] == 0, report["error_samples"]
    assert report["lost"] == 0
    assert report["extra"] == 0
    assert report["received_deliveries"] == report["expected_deliveries"]


@pytest.mark.parametrize("transport", ["websocket", "long-polling"])
def test_fanout_counts_every_delivery(transport):
    with Broker() as b:
        report = bench(b, "--scenario", "fanout", "--transport", transport, "--subscribers", "5",
                       "--messages", "100", "--warmup", "0.2", "--window", "4")
    check_complete(report, 6)
    assert report["expected_deliveries"] >= 500
    assert report["latency"]["count"] >= 500
    assert report["latency"]["p50_ms"] <= report["latency"]["max_ms"]
    assert report["server"]["cpu_seconds"] >= 0
    assert report["server"]["rss_bytes"] > 0


def test_rooms_at_a_fixed_rate():
    with Broker() as b:
        report = bench(b, "--scenario", "rooms", "--subscribers", "20", "--rooms", "5", "--rooms-per-client", "2",
                       "--publishers", "2", "--batch", "5", "--rate", "200", "--duration", "1", "--warmup", "0.2")
    check_complete(report, 22)
    # 20 clients in 2 of 5 rooms each: 40 memberships, 8 per room on average.
    assert report["expected_deliveries"] > 0
    assert report["publishes"] > 0


def test_idle_reports_memory_per_connection():
    with Broker() as b:
        report = bench(b, "--scenario", "idle", "--subscribers", "20", "--duration", "0.5")
    check_complete(report, 21)
    assert report["expected_deliveries"] == 20
    assert "server_rss_per_connection_bytes" in report


def test_http_publish_ingest():
    with Broker() as b:
        report = bench(b, "--scenario", "publish", "--publishers", "2", "--messages", "200", "--warmup", "0")
    check_complete(report, 2)
    assert report["publishes"] == 200
    assert report["ack_latency"]["count"] == 200
