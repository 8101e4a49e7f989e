"""Test support shared by the Python suites of Tests/, importable as `pubsubtest` (the repository's pytest.ini puts
Tests/ on the path):

    broker    Broker: `pubsub serve` (or real Faye, PUBSUB_TARGET=faye) on a free loopback port; pubsub_bin()
    ports     free_port(), closed_port(): ports below the ephemeral range, held by the test process
    wait      wait_until(predicate, timeout, interval, message): the predicate's truthy value, or AssertionError
              (raises=False: its last value)
    bayeux    bayeux(broker or url, messages): POST, assert HTTP 200, the parsed replies; handshake, connect,
              subscribe, publish: one message each, with its id, ext, and whether the reply is asserted;
              publish_all: a back end's batch of events on one channel; post_form: PrivatePub's form publish
    websocket BayeuxWebSocket (a Bayeux client), BayeuxListener (the same read by a thread of its own), and the raw
              WebSocket (RFC 6455 byte for byte): upgrade_request(), frame(), RawWebSocket
    metrics   scrape(), metric(): the broker's /metrics; held(), wait_held(): the long-poll connects it holds
    process   Lines: a process whose output lines are collected, killed with SIGKILL or stopped with SIGTERM
    fixtures  make_broker, pool, redis_server, make_redis_cluster
    suite     suite_timeout(): a folder's timeout, declared in its conftest.py
    redis     RedisServer, Sentinel, RedisCluster (masters with replicas, redis-cli --cluster create), wait_ready()
    tls       make_authority(), make_self_signed(): throwaway certificates made with openssl
    postgres  PostgresCluster (wal_level=logical; wal2json=True, auth="scram-sha-256"|"md5", tls=True, settings),
              needs_postgres() and needs_wal2json() (the skip marks)
    browser   headless Chromium fixtures (browser, page, page_server, screenshot) over cdp
    faultproxy  FaultProxy: a loopback TCP proxy that stalls, blackholes, resets (RST, and holds down) and drops
              its connections on demand (between clients and broker, or broker and Redis); with
              record=True, the message lists its clients sent
    compression  permessage-deflate: job_progress() events, deflate_alone()/inflate() with zlib, and
              WebSocketSession, a Bayeux client over the `websockets` library (compression negotiated or not)
"""
