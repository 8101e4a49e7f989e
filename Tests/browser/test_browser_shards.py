"""The browser client on a broker spread over the three masters of a Redis Cluster (`--redis-shards 3`).

Each shard has its own positions: an event's `ext.position` names its shard by its epoch, and the handshake's has
one part per shard (`2.…~2.…~2.…`). A `/**` subscription gets events from every shard; the client keeps one part
per shard, each from the last event of that shard, so that after a lost session its `ext.resume` covers every
shard and the broker answers `recovered: true` with exactly the events published meanwhile.
"""

import json
import os
import shutil
import time

import pytest

from pubsubtest.bayeux import bayeux, publish_all
from pubsubtest.redis import wait_ready
from test_browser_client import TIMEOUT

pytestmark = pytest.mark.skipif(
    not os.environ.get("CI") and not (shutil.which("redis-server") and shutil.which("redis-cli")),
    reason="redis-server is not installed (scripts/install-test-deps); required when CI is set")

CHANNELS = [f"/c{i}/x" for i in range(12)]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>pubsub client over shards</title>
<script src="{broker}/client.js"></script>
</head><body><pre id="out"></pre>
<script>
window.received = [];
window.positions = [];
window.handshakes = [];
window.sentResumes = [];
window.resumes = [];
// While `holdHandshake` is set, a new handshake waits: the test publishes while the page has no session.
window.holdHandshake = false;
var held = [];
window.releaseHandshake = function () {{
  holdHandshake = false;
  held.splice(0).forEach(function (send) {{ send(); }});
}};
// retry: 1 s, so that the lost session is noticed soon.
var client = new Faye.Client({broker_json}, {{timeout: 10, retry: 1}});
client.addExtension({{
  outgoing: function (message, callback) {{
    if (message.channel === '/meta/subscribe') sentResumes.push((message.ext && message.ext.resume) || null);
    if (message.channel === '/meta/handshake' && holdHandshake) held.push(function () {{ callback(message); }});
    else callback(message);
  }},
  incoming: function (message, callback) {{
    if (message.channel === '/meta/handshake' && message.successful) handshakes.push(message.ext.position);
    if (message.channel.indexOf('/meta/') !== 0) positions.push([message.channel, message.ext.position]);
    callback(message);
  }}
}});
{setup}
client.bind('resume', function (channel, answer) {{ resumes.push([channel, answer]); }});
client.subscribe('/**', function (data) {{
  received.push(data);
  document.getElementById('out').textContent += JSON.stringify(data) + '\\n';
}}).then(function () {{ window.subscribed = true; }}, function (e) {{ window.subscribeError = String(e); }});
</script></body></html>
"""


def epoch(position):
    return position.split(".")[1]


def publish_round(broker, n):
    for ch in CHANNELS:
        publish_all(broker, ch, {"ch": ch, "n": n})


@pytest.mark.parametrize("transport", ["websocket", "cross-origin-long-polling"])
def test_wildcard_resumes_over_every_shard(page, page_server, make_redis_cluster, make_broker, transport):
    cluster = make_redis_cluster(masters=3, replicas=0)
    b = make_broker(timeout=10, extra_args=["--engine", "redis", "--redis-cluster", cluster.seeds,
                                            "--redis-shards", "3", "--history-size", "1000"])
    wait_ready(b)
    setup = "" if transport == "websocket" else "client.disable('websocket');"
    html = PAGE.format(broker=b.url, broker_json=json.dumps(b.url), setup=setup)
    page.navigate(page_server.add(f"/shards-{transport}.html", html))
    page.wait_for("window.subscribed || window.subscribeError", what="the subscription")
    assert page.evaluate("window.subscribeError || null") is None
    assert page.evaluate("client.getTransport()") == transport
    start = page.evaluate("handshakes[0]")
    assert start.count("~") == 2, start

    # Events on channels of every shard, each carrying its own shard's position.
    publish_round(b, 0)
    publish_round(b, 1)
    page.wait_for(f"received.length >= {2 * len(CHANNELS)}", what="the events before the session is lost")
    positions = page.evaluate("positions")
    last = {}
    for _, position in positions:
        assert "~" not in position, position
        last[epoch(position)] = position
    assert sorted(last) == sorted(epoch(p) for p in start.split("~")), "the channels span every shard"

    # The broker forgets the session (as after an expiry or an overflow); events go on on every shard meanwhile.
    page.evaluate("holdHandshake = true")
    first_id = page.evaluate("client.getClientId()")
    assert bayeux(b, [{"channel": "/meta/disconnect", "clientId": first_id}], timeout=TIMEOUT)[0]["successful"] is True
    publish_round(b, 2)
    publish_round(b, 3)
    page.evaluate("releaseHandshake()")
    page.wait_for(f"client.getClientId() && client.getClientId() !== {json.dumps(first_id)}", timeout=30,
                  what="a new handshake")
    page.wait_for("resumes.length >= 1", timeout=15, what="the answer to the resume")

    assert page.evaluate("resumes") == [["/**", {"recovered": True, "missed": 2 * len(CHANNELS)}]]
    # The resume sent covers every shard: the first handshake's parts, each replaced by its shard's last event.
    expected = "~".join(last[epoch(part)] for part in start.split("~"))
    # The broker closes the WebSocket of the session it ended, which the client first takes for a broken connection:
    # its next connect, refused, may carry a resume from the same position, before the new session's.
    sent = page.evaluate("sentResumes")
    assert sent[0] is None and sent[1:] in ([expected], [expected, expected]), sent
    page.wait_for(f"received.length >= {4 * len(CHANNELS)}", timeout=15, what="the missed events")

    publish_round(b, 4)
    page.wait_for(f"received.length >= {5 * len(CHANNELS)}", timeout=15, what="live events after the resume")
    time.sleep(0.5)
    received = page.evaluate("received")
    assert len(received) == 5 * len(CHANNELS), received
    for ch in CHANNELS:
        assert [d["n"] for d in received if d["ch"] == ch] == [0, 1, 2, 3, 4], ch
