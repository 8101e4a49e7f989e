"""Issue 13, item 7: the history is bounded by bytes as well as by count (--history-bytes).

Anonymous 1 MB publishes to a channel nobody reads, with the history kept for ever (--history-ttl 0): the
broker's memory stays within the bound, and what the history still holds is still recoverable.
"""

import json
import os
import time

import requests

from hostilekit import MiB, hostile_broker
from pubsubtest.bayeux import handshake, subscribe

HISTORY_BYTES = 16 * MiB
PUBLISHES = int(os.environ.get("HOSTILE_HISTORY_PUBLISHES", "300"))   # the attack is 600


def test_one_megabyte_publishes_nobody_reads_keep_memory_bounded():
    settings = {"history-bytes": HISTORY_BYTES, "history-ttl": 0, "max-request-bytes": 2 * MiB}
    with hostile_broker(settings) as (b, g):
        token = handshake(b, reply=True)["ext"]["position"]
        t0 = time.monotonic()
        done = 0
        with requests.Session() as session:
            for i in range(PUBLISHES):
                body = json.dumps([{"channel": "/nobody/reads", "data": f"{i:08d}" + "x" * (MiB - 8)}])
                r = session.post(b.url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
                assert r.status_code == 200 and r.json()[0]["successful"] is True, (r.status_code, r.text[:200])
                done += 1
                if i % 10 == 0 and g.over_bound():
                    break
        elapsed = time.monotonic() - t0
        g.assert_rss(f"after {done} publishes of 1 MB in {elapsed:.0f}s to a channel nobody reads "
                     f"(--history-bytes {HISTORY_BYTES // MiB} MiB)")
        g.assert_served()
        # What is left of the history still serves a resume: all of it cannot be recovered any more, but the
        # subscription succeeds and says so.
        cid = handshake(b, reply=True)["clientId"]
        reply = subscribe(b, cid, "/nobody/reads", resume=token)
        assert reply["ext"]["resume"]["recovered"] is False, reply
