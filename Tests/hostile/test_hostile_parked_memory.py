"""A parked long poll keeps none of its request: not the headers, not the URI, not the body (a slice of the
whole receive buffer it was read into). Clients sending large cookies or padded connects would otherwise hold
that much of the broker's memory for as long as each connect is parked."""

import json
import resource
import time

import pytest

from hostilekit import KiB, close_all, hostile_broker, metric_value, raw_socket, rss
from pubsubtest.bayeux import connect, handshake
from pubsubtest.wait import wait_until

pytestmark = pytest.mark.timeout(180)

CLIENTS = 1500
PAD = 3 * KiB           # a header and a connect field of this size each: ~6 KiB of request per client
PER_CLIENT_BOUND = 14 * KiB  # ~10.7 KiB in a debug build; 18.5 KiB when the request was kept


def parked_connect(port, cid):
    body = json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "long-polling",
                        "ext": {"pad": "x" * PAD}}]).encode()
    return (f"POST /faye HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"X-Padding: {'y' * PAD}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def test_parked_long_polls_keep_no_request_memory():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < CLIENTS + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, CLIENTS + 500), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= CLIENTS + 200, "descriptor limit too low for the test"
    with hostile_broker(timeout=120) as (b, g):
        cids = [handshake(b) for _ in range(CLIENTS)]
        for cid in cids:
            connect(b, cid)  # answered at once: the next connect is the one held
        parked_before = metric_value(b, "pubsub_clients")
        time.sleep(0.5)
        before = rss(b.pid)
        sockets = []
        try:
            for cid in cids:
                s = raw_socket(b)
                sockets.append(s)
                s.sendall(parked_connect(b.port, cid))
            parked = wait_until(lambda: metric_value(b, "pubsub_clients") - parked_before >= CLIENTS, 30, 0.2,
                                raises=False)
            assert parked, f"{metric_value(b, 'pubsub_clients') - parked_before} of {CLIENTS} connects parked"
            time.sleep(1)
            per_client = (rss(b.pid) - before) / CLIENTS
            assert per_client < PER_CLIENT_BOUND, (
                f"{per_client / KiB:.1f} KiB of broker memory per parked long poll with a ~{2 * PAD // KiB} KiB "
                f"request (bound {PER_CLIENT_BOUND // KiB} KiB): the request is kept while the connect waits")
            g.assert_served("while parked long polls wait")
        finally:
            close_all(sockets)
