"""`pubsub bench` smoke tests: tiny scenarios against a live broker, checking that the load generator runs,
counts every expected delivery and loses none. Nothing here is timed: benchmarks live in BENCHMARKS.md."""

import json
import subprocess
import sys
import time

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


@pytest.mark.parametrize("scenario", ["fanout", "rooms"])
def test_centrifuge_protocol_against_a_centrifuge_node(scenario):
    """`--protocol centrifuge` against a real Centrifuge 0.15 node (scripts/centrifuge-node, built from Debian's
    packages): every delivery counted, publishes acknowledged, nothing lost."""
    with Broker(target="centrifuge") as b:
        if scenario == "fanout":
            report = bench(b, "--protocol", "centrifuge", "--scenario", "fanout", "--subscribers", "5",
                           "--messages", "100", "--warmup", "0.2", "--window", "4")
            check_complete(report, 6)
            assert report["expected_deliveries"] >= 500
        else:
            report = bench(b, "--protocol", "centrifuge", "--scenario", "rooms", "--subscribers", "20", "--rooms",
                           "5", "--rooms-per-client", "2", "--publishers", "2", "--batch", "5", "--rate", "200",
                           "--duration", "1", "--warmup", "0.2")
            check_complete(report, 22)
            assert report["expected_deliveries"] > 0
    assert report["config"]["protocol"] == "centrifuge"


@pytest.mark.parametrize("args, message", [
    (["--protocol", "cometd"], "--protocol must be bayeux or centrifuge"),
    (["--protocol", "centrifuge", "--transport", "long-polling"], "--protocol centrifuge speaks WebSocket only"),
    (["--protocol", "centrifuge", "--scenario", "publish"], "--protocol centrifuge has no HTTP publish"),
])
def test_centrifuge_protocol_refuses_what_it_cannot_do(args, message):
    done = subprocess.run([pubsub_bin(), "bench", "--url", "ws://127.0.0.1:1/connection/websocket", *args],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    assert message in done.stderr


def local_addresses(port):
    """The local addresses of the established connections to `port` on this machine (from `ss`)."""
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, timeout=10).stdout
    return {line.split()[-2].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}


def test_workers_over_two_source_addresses():
    with Broker() as b:
        cmd = [pubsub_bin(), "bench", "--url", b.url, "--json", "--quiet", "--server-pid", str(b.pid),
               "--workers", "2", "--subscribers", "10", "--per-address", "5",
               "--source-address", "127.0.0.2", "--source-address", "127.0.0.3",
               "--rate", "10", "--duration", "2", "--warmup", "0.3"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        seen = set()
        while proc.poll() is None:
            seen |= local_addresses(b.port)
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {out}\nstderr: {err}"
    report = json.loads(out)
    # Ten subscribers in two worker processes, five per source address, and this process's publisher.
    check_complete(report, 11)
    assert report["workers"] == 2
    assert {"127.0.0.2", "127.0.0.3"} <= seen, seen
    assert "limit" not in report
    # Every publish reached all ten subscribers; the merged histogram holds every delivery of the window.
    assert report["publishes"] >= 15
    assert report["expected_deliveries"] % 10 == 0
    assert report["expected_deliveries"] >= 10 * report["publishes"]
    assert report["latency"]["count"] >= 10 * report["publishes"]
    assert report["deliveries"] == 10 * report["publishes"]
    assert 0 < report["latency"]["p50_ms"] <= report["latency"]["p99_ms"] <= report["latency"]["max_ms"]
    assert report["bench"]["cpu_seconds"] > 0


@pytest.mark.pubsub_only  # the server's --max-connections is pubsub's (puma has no such flag)
@pytest.mark.parametrize("transport", ["websocket", "long-polling"])
def test_workers_name_the_servers_503_as_the_limit(transport):
    with Broker(extra_args=["--max-connections", "6"]) as b:
        cmd = [pubsub_bin(), "bench", "--url", b.url, "--json", "--quiet", "--transport", transport,
               "--workers", "2", "--subscribers", "12",
               "--rate", "10", "--duration", "0.5", "--warmup", "0", "--drain", "1", "--connect-timeout", "5"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    report = json.loads(done.stdout)
    assert report["connect_failures"] >= 6
    assert report["limit"] == "server-503"
    assert "503" in report["limit_reason"]


def test_workers_refuse_a_plan_past_the_descriptor_limit():
    done = subprocess.run([pubsub_bin(), "bench", "--workers", "1", "--subscribers", "10000000", "--rate", "1"],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "descriptor limit" in lines[0] and "--workers" in lines[0], done.stderr
