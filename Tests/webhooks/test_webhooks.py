"""Webhooks against the real binary: a receiver in this process, the broker posting session events to it."""

import base64
import datetime
import os
import signal
import subprocess
import time

import pytest

from pubsubtest.broker import pubsub_bin
from pubsubtest.wait import wait_until
from hookkit import (HOOK_SECRET, HookReceiver, hook_bayeux, hook_broker, hook_free_port, hook_handshake,
                     hook_metric, hook_parse_at, hook_subscribe)


def test_each_event_type_is_posted_signed_with_its_fields():
    with HookReceiver() as receiver, hook_broker([receiver.url]) as b:
        started = datetime.datetime.now(datetime.timezone.utc)
        cid = hook_handshake(b)
        hook_subscribe(b, cid, ["/chat/room", "/jobs/*"])
        hook_subscribe(b, cid, "/jobs/*", unsubscribe=True)
        reply = hook_bayeux(b, [{"channel": "/meta/disconnect", "clientId": cid}])[0]
        assert reply["successful"]
        events = receiver.wait_events(lambda es: any(e["type"] == "disconnect" for e in es))
        assert [(e["type"], e.get("channel"), e.get("reason")) for e in events] == [
            ("handshake", None, None),
            ("subscribe", "/chat/room", None),
            ("subscribe", "/jobs/*", None),
            ("unsubscribe", "/jobs/*", None),
            ("disconnect", None, "client"),
        ]
        for e in events:
            assert e["clientId"] == cid
            assert "user" in e and e["user"] is None
            at = hook_parse_at(e["at"])
            assert started - datetime.timedelta(seconds=1) <= at <= datetime.datetime.now(datetime.timezone.utc)
        for post in receiver.accepted():
            assert post.signature_ok(), post.headers
            assert not post.signature_ok("another secret")
            assert post.headers["Content-Type"] == "application/json"
        assert HOOK_SECRET not in b.log()


def test_batches_hold_at_most_100_events_and_wait_about_a_second():
    with HookReceiver() as receiver, hook_broker([receiver.url]) as b:
        sent = time.monotonic()
        hook_handshake(b)
        receiver.wait_events(lambda es: len(es) == 1)
        first = receiver.accepted()[0]
        # Sent when the batch's first event has waited its second, not before and not much later.
        assert 0.9 <= first.at - sent <= 2.5, first.at - sent
        handshakes = [{"channel": "/meta/handshake", "version": "1.0",
                       "supportedConnectionTypes": ["long-polling"]}] * 250
        replies = hook_bayeux(b, handshakes)
        ids = [r["clientId"] for r in replies]
        events = receiver.wait_events(lambda es: len(es) == 251)
        posts = receiver.accepted()[1:]
        assert all(len(p.events) <= 100 for p in posts), [len(p.events) for p in posts]
        assert [len(p.events) for p in posts][:2] == [100, 100]
        assert [e["clientId"] for e in events[1:]] == ids
        assert all(p.signature_ok() for p in posts)


def test_webhook_events_selects_what_is_posted():
    with HookReceiver() as receiver, hook_broker([receiver.url], extra=["--webhook-events", "subscribe"]) as b:
        cid = hook_handshake(b)
        hook_subscribe(b, cid, "/only")
        hook_bayeux(b, [{"channel": "/meta/disconnect", "clientId": cid}])
        events = receiver.wait_events(lambda es: len(es) >= 1)
        time.sleep(1.5)
        assert [(e["type"], e["channel"]) for e in receiver.events()] == [("subscribe", "/only")]


def test_every_url_gets_every_event():
    with HookReceiver() as one, HookReceiver() as two, hook_broker([one.url, two.url]) as b:
        cid = hook_handshake(b)
        for receiver in (one, two):
            assert [e["clientId"] for e in receiver.wait_events(lambda es: len(es) == 1)] == [cid]


def test_a_refused_post_is_retried_with_the_same_events():
    with HookReceiver(statuses=[500, 503]) as receiver, hook_broker([receiver.url]) as b:
        cid = hook_handshake(b)
        events = receiver.wait_events(lambda es: len(es) == 1, timeout=15)
        assert events[0]["clientId"] == cid
        bodies = [body for _status, body in receiver.answered]
        assert [status for status, _ in receiver.answered] == [500, 503, 200]
        assert bodies[0] == bodies[1] == bodies[2]
        assert hook_metric(b, 'pubsub_webhook_posts_total{result="failed"}') == 2
        assert hook_metric(b, 'pubsub_webhook_posts_total{result="ok"}') == 1


def test_events_wait_for_a_receiver_that_is_down():
    port = hook_free_port()
    url = f"http://127.0.0.1:{port}/hook"
    with hook_broker([url]) as b:
        cid = hook_handshake(b)
        # The first post (after ~1 s) finds nothing listening; it fails by its request timeout (5 s) at the latest.
        wait_until(lambda: hook_metric(b, 'pubsub_webhook_posts_total{result="failed"}') >= 1, 15, 0.2,
                   message="a failed post counted")
        with HookReceiver(port=port) as receiver:
            events = receiver.wait_events(lambda es: len(es) == 1, timeout=15)
            assert events[0]["clientId"] == cid and events[0]["type"] == "handshake"


def test_overflow_of_the_queue_is_dropped_and_counted():
    port = hook_free_port()  # nothing listens: nothing leaves the queue
    with hook_broker([f"http://127.0.0.1:{port}/hook"], extra=["--webhook-queue", "5"]) as b:
        handshakes = [{"channel": "/meta/handshake", "version": "1.0",
                       "supportedConnectionTypes": ["long-polling"]}] * 20
        assert all(r["successful"] for r in hook_bayeux(b, handshakes))
        assert hook_metric(b, 'pubsub_webhook_events_dropped_total{reason="queue_full"}') == 15
        assert hook_metric(b, f'pubsub_webhook_queue_depth{{url="http://127.0.0.1:{port}"}}') == 5
        # The broker itself is unaffected: publishing and handshaking go on.
        assert hook_handshake(b)


def test_an_expired_session_is_a_disconnect_with_reason_expired():
    with HookReceiver() as receiver, hook_broker([receiver.url], timeout=1) as b:
        cid = hook_handshake(b)
        events = receiver.wait_events(lambda es: any(e["type"] == "disconnect" for e in es), timeout=10)
        end = [e for e in events if e["type"] == "disconnect"]
        assert end == [{"type": "disconnect", "clientId": cid, "user": None, "reason": "expired", "at": end[0]["at"]}]


def test_a_client_dropped_for_overflow_is_a_disconnect_with_reason_overflow():
    with HookReceiver() as receiver, hook_broker([receiver.url], extra=["--max-queue", "2"]) as b:
        slow = hook_handshake(b)
        hook_subscribe(b, slow, "/firehose")
        for i in range(3):
            assert hook_bayeux(b, [{"channel": "/firehose", "data": i}])[0]["successful"]
        events = receiver.wait_events(lambda es: any(e["type"] == "disconnect" for e in es))
        assert [(e["clientId"], e["reason"]) for e in events if e["type"] == "disconnect"] == [(slow, "overflow")]


def test_queued_events_are_flushed_when_the_broker_drains():
    with HookReceiver() as receiver:
        b = hook_broker([receiver.url])
        b.start()
        try:
            cid = hook_handshake(b)
            stopped = time.monotonic()
            os.killpg(b.pid, signal.SIGTERM)
            receiver.wait_events(lambda es: [e["clientId"] for e in es] == [cid], timeout=10)
            post = receiver.accepted()[0]
            assert post.signature_ok()
            # Flushed by the drain, not by the batch's one-second wait.
            assert post.at - stopped < 0.8, post.at - stopped
            b._proc.wait(timeout=10)
            assert b.returncode == 0, b.log()
        finally:
            b.stop()


@pytest.mark.parametrize("args, message", [
    (["--webhook", "ftp://example.com/hook", "--webhook-secret", "s"], "http"),
    (["--webhook", "http://127.0.0.1:1/hook", "--webhook-secret", "s", "--webhook-events", "subscribe,bogus"],
     "bogus"),
    (["--webhook", "http://127.0.0.1:1/hook"], "--webhook-secret"),
    (["--webhook", "http://127.0.0.1:1/hook", "--webhook-secret", "s", "--webhook-queue", "0"], "--webhook-queue"),
])
def test_a_bad_webhook_flag_is_one_line_and_a_failure(args, message):
    result = subprocess.run([pubsub_bin(), "serve", "--port", "0"] + args, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "s3cr" not in result.stderr


def test_pubsub_webhook_environment_takes_comma_separated_urls():
    with HookReceiver() as one, HookReceiver() as two:
        env = dict(os.environ, PUBSUB_WEBHOOK=f"{one.url}, {two.url}", PUBSUB_WEBHOOK_SECRET=HOOK_SECRET)
        port = hook_free_port()
        proc = subprocess.Popen([pubsub_bin(), "serve", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            class Where:
                url = f"http://127.0.0.1:{port}/faye"
            cid = wait_until(lambda: hook_handshake(Where), 20, interval=0.1, ignore=(OSError,),
                             message="a handshake answered")
            for receiver in (one, two):
                receiver.wait_events(lambda es: [e["clientId"] for e in es] == [cid])
                assert receiver.accepted()[0].signature_ok()
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def test_a_drain_with_the_receiver_down_ends_within_its_bound_and_says_what_it_dropped():
    port = hook_free_port()
    b = hook_broker([f"http://127.0.0.1:{port}/hook"])
    b.start()
    try:
        hook_handshake(b)
        hook_handshake(b)
        stopped = time.monotonic()
        os.killpg(b.pid, signal.SIGTERM)
        b._proc.wait(timeout=15)
        # The drain posts for at most 5 s (no post outlives it), then the queue is dropped.
        assert time.monotonic() - stopped < 7.5
        assert b.returncode == 0, b.log()
        log = b.log()
        assert "webhook batch given up" in log or "webhook events dropped at shutdown" in log, log
        assert "pubsub.webhook.events=2" in log, log
        assert HOOK_SECRET not in log
    finally:
        b.stop()


def test_user_info_in_the_url_is_sent_as_basic_auth_and_never_printed():
    with HookReceiver() as receiver:
        url = receiver.url.replace("http://", "http://hooks:pa55word@")
        with hook_broker([url], extra=["--log-level", "debug"]) as b:
            cid = hook_handshake(b)
            receiver.wait_events(lambda es: [e["clientId"] for e in es] == [cid])
            post = receiver.accepted()[0]
            assert post.headers["Authorization"] == "Basic " + base64.b64encode(b"hooks:pa55word").decode()
            assert post.signature_ok()
            assert "pa55word" not in b.log()
