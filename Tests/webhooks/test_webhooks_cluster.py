"""Webhooks of two nodes sharing a real Redis: each event is posted once, by the node where it happened."""

import time

from hookkit import HookReceiver, hook_bayeux, hook_broker, hook_handshake, hook_subscribe
from pubsubtest.redis import wait_ready


def test_two_nodes_post_each_event_once(redis_server):
    with HookReceiver() as receiver:
        args = ["--engine", "redis", "--redis-url", redis_server.url, "--redis-prefix", "hooks:", "--max-queue", "2"]
        a = hook_broker([receiver.url], extra=args, timeout=1)
        b = hook_broker([receiver.url], extra=args, timeout=1)
        with a, b:
            wait_ready(a)
            wait_ready(b)
            c1 = hook_handshake(a)
            hook_subscribe(b, c1, ["/room", "/jobs/**"])
            hook_subscribe(a, c1, "/room", unsubscribe=True)
            c2 = hook_handshake(b)
            assert hook_bayeux(a, [{"channel": "/meta/disconnect", "clientId": c2}])[0]["successful"]
            # c3's queue lives on a (its home); publishes through b overflow it there.
            c3 = hook_handshake(a)
            hook_subscribe(a, c3, "/fire")
            for i in range(3):
                assert hook_bayeux(b, [{"channel": "/fire", "data": i}])[0]["successful"]

            def ended(events):
                return any(e["type"] == "disconnect" and e["clientId"] == c1 for e in events)

            # c1 never connects: it expires after 2 × 1 s and one node's sweep removes it.
            try:
                receiver.wait_events(ended, timeout=30, what="c1 expired")
            except AssertionError as e:
                raise AssertionError(f"{e}\n--- node a:\n{a.log()[-4000:]}\n--- node b:\n{b.log()[-4000:]}")
            time.sleep(1.5)  # a duplicate from the other node would arrive by now
            events = receiver.events()

            def of(cid):
                return [(e["type"], e.get("channel"), e.get("reason")) for e in events if e["clientId"] == cid]

            # Each node posts its own batches, so the receiver sees them in any order: `at` orders them (to the
            # millisecond: equal stamps are possible).
            c1_events = [e for e in events if e["clientId"] == c1]
            first = next(e for e in c1_events if e["type"] == "handshake")
            last = next(e for e in c1_events if e["type"] == "disconnect")
            assert all(first["at"] <= e["at"] <= last["at"] for e in c1_events)

            assert sorted(of(c1), key=str) == sorted([
                ("handshake", None, None), ("subscribe", "/room", None), ("subscribe", "/jobs/**", None),
                ("unsubscribe", "/room", None), ("disconnect", None, "expired")], key=str)
            assert sorted(of(c2), key=str) == sorted([("handshake", None, None), ("disconnect", None, "client")],
                                                     key=str)
            assert sorted(of(c3), key=str) == sorted([
                ("handshake", None, None), ("subscribe", "/fire", None), ("disconnect", None, "overflow")], key=str)
            assert all(p.signature_ok() for p in receiver.accepted())


def test_events_carry_the_user_on_every_node(redis_server):
    """With JWT, each event names the session's user, whichever node posts it: the node that handled a subscribe
    for a session living on another node, the sweep's node for an expiry, the home node for an overflow. A
    repeated subscribe is reported once, and an unsubscribe only for the channels the session had."""
    import jwt

    key = "k" * 40

    def handshake_as(node, user):
        """A handshake with a token for `user` (allowed every channel): the clientId and the token."""
        token = jwt.encode({"sub": user, "exp": int(time.time()) + 600, "channels": ["/**"], "publish": ["/**"]},
                           key, algorithm="HS256")
        return hook_handshake(node, token=token), token

    with HookReceiver() as receiver:
        args = ["--engine", "redis", "--redis-url", redis_server.url, "--redis-prefix", "hookusers:",
                "--max-queue", "2", "--jwt-key", key]
        a = hook_broker([receiver.url], extra=args, timeout=1)
        b = hook_broker([receiver.url], extra=args, timeout=1)
        with a, b:
            wait_ready(a)
            wait_ready(b)
            alice, _ = handshake_as(a, "alice")
            hook_subscribe(b, alice, ["/room"])
            # Subscribing again to a held channel is not reported again, on either node; an unsubscribe reports
            # only the channels the session had.
            hook_subscribe(a, alice, ["/room", "/room"])
            hook_subscribe(b, alice, ["/room", "/never"], unsubscribe=True)
            hook_subscribe(a, alice, ["/room"], unsubscribe=True)
            bob, bob_token = handshake_as(a, "bob")
            hook_subscribe(a, bob, "/fire")
            for i in range(3):
                assert hook_bayeux(b, [{"channel": "/fire", "data": i, "clientId": bob, "ext": {"token": bob_token}}
                                       ])[0]["successful"]
            carol, _ = handshake_as(b, "carol")
            assert hook_bayeux(a, [{"channel": "/meta/disconnect", "clientId": carol}])[0]["successful"]

            def ended(events):
                return any(e["type"] == "disconnect" and e["clientId"] == alice for e in events)

            receiver.wait_events(ended, timeout=30, what="alice expired")
            time.sleep(1.5)
            events = receiver.events()
            users = {alice: "alice", bob: "bob", carol: "carol"}
            ours = [e for e in events if e["clientId"] in users]  # (the launcher's readiness check handshakes too)
            for e in ours:
                assert e["user"] == users[e["clientId"]], e
            seen = [(e["type"], e.get("reason"), e["user"]) for e in ours]
            assert ("subscribe", None, "alice") in seen and ("unsubscribe", None, "alice") in seen
            alices = [(e["type"], e.get("channel")) for e in ours if e["clientId"] == alice]
            assert alices.count(("subscribe", "/room")) == 1, alices
            assert alices.count(("unsubscribe", "/room")) == 1, alices
            assert ("unsubscribe", "/never") not in alices, alices
            assert ("disconnect", "expired", "alice") in seen
            assert ("disconnect", "overflow", "bob") in seen
            assert ("disconnect", "client", "carol") in seen
