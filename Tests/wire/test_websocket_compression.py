"""WebSocket compression (permessage-deflate, RFC 7692) with clients nobody here wrote, and byte for byte.

Two kinds of client:

- Python's `websockets` library, which offers `permessage-deflate; client_max_window_bits` by default (and nothing
  with `compression=None`), compresses every message it sends once the extension is negotiated and inflates what
  the server marks compressed (RSV1). Its handshake response is read for the server's answer.
- A raw socket, which offers what the test says, reads every frame's RSV bits and payload, inflates with Python's
  zlib itself, and sends frames with RSV1 where RFC 7692 and RFC 6455 say a server must fail the connection.

The broker compresses each event of `--websocket-compression-min-bytes` (256) or more once per publish and keeps no
context (`server_no_context_takeover; client_no_context_takeover`); shorter events and replies go uncompressed; a
client's compressed message is inflated within `--max-frame-bytes` (1009 past it, 1007 when it does not inflate).
"""

import json
import os
import time
import zlib

import pytest

from pubsubtest.bayeux import bayeux, publish
from pubsubtest.broker import Broker
from pubsubtest.compression import ANSWER, TAIL, WebSocketSession, deflate_alone, flat, inflate, job_progress
from wirekit import (CLOSE, CONT, HTTP_TIMEOUT, PING, PONG, RSV1, RSV2, RSV3, TEXT, RawWebSocket,
                     server_answers_handshake)

pytestmark = [pytest.mark.pubsub_only, pytest.mark.timeout(120)]

MAX_FRAME = 65536


@pytest.fixture(scope="module")
def deflate_broker():
    """Compression on (the default: no flag given), messages limited to 64 KiB."""
    with Broker(timeout=45, extra_args=["--max-frame-bytes", str(MAX_FRAME)]) as b:
        yield b


def unique(name):
    return f"/compression/{name}/{os.getpid()}{time.monotonic_ns()}"


# ---------------------------------------------------------------- the websockets library

def test_websockets_negotiates_and_receives_a_large_and_a_short_event(deflate_broker):
    with WebSocketSession(deflate_broker) as s:
        assert s.offered and s.offered[0].startswith("permessage-deflate"), s.offered
        assert s.answered == [ANSWER]
        assert s.extensions == ["permessage-deflate"]
        channel = unique("lib")
        s.subscribe(channel)

        large = job_progress(1024)
        assert len(json.dumps(large)) >= 1024
        publish(deflate_broker, channel, large)
        assert s.event(channel)["data"] == large

        short = {"job": "render-42", "percent": 17.5}
        publish(deflate_broker, channel, short)
        assert s.event(channel)["data"] == short

        big = job_progress(40_000)
        publish(deflate_broker, channel, big)
        assert s.event(channel)["data"] == big


def test_websockets_own_compressed_publish_is_accepted_and_delivered_to_a_plain_client(deflate_broker):
    """The library compresses every message it sends once negotiated: the publish itself arrives with RSV1."""
    channel = unique("own")
    with WebSocketSession(deflate_broker) as s, WebSocketSession(deflate_broker, compression=None) as plain:
        assert s.extensions == ["permessage-deflate"] and plain.extensions == [] and plain.answered == []
        s.subscribe(channel)
        plain.subscribe(channel)
        data = job_progress(2048, step=9)
        s.send([{"channel": channel, "clientId": s.cid, "data": data, "id": "own-1"}])
        reply = s.wait(lambda m: m.get("id") == "own-1", what="the publish's reply")
        assert reply["successful"] is True, reply
        assert s.event(channel)["data"] == data
        assert plain.event(channel)["data"] == data


def test_websockets_large_and_short_events_of_one_batch_arrive_in_order(deflate_broker):
    """Compressed and plain events of one flush go in frames of their own; their order is kept."""
    channel = unique("order")
    with WebSocketSession(deflate_broker) as s:
        s.subscribe(channel)
        batch = []
        for n in range(12):
            data = job_progress(1500, step=n) if n % 3 == 0 else {"n": n}
            batch.append({"channel": channel, "data": data})
        replies = bayeux(deflate_broker, batch, timeout=HTTP_TIMEOUT)
        assert all(m.get("successful") for m in replies), replies
        got = [s.event(channel)["data"] for _ in batch]
        assert got == [m["data"] for m in batch]


def test_websockets_without_compression_gets_no_extension_and_plain_events(deflate_broker):
    with WebSocketSession(deflate_broker, compression=None) as s:
        assert s.offered == [] and s.answered == [] and s.extensions == []
        channel = unique("none")
        s.subscribe(channel)
        large = job_progress(1024)
        publish(deflate_broker, channel, large)
        assert s.event(channel)["data"] == large


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_compression_off_negotiates_nothing_and_everything_works(make_broker, monkeypatch, how):
    if how == "flag":
        b = make_broker(extra_args=["--websocket-compression", "off"])
    else:
        monkeypatch.setenv("PUBSUB_WEBSOCKET_COMPRESSION", "off")
        b = make_broker()
    channel = unique("off")
    with WebSocketSession(b) as s:
        assert s.offered and s.offered[0].startswith("permessage-deflate"), s.offered
        assert s.answered == [] and s.extensions == []
        s.subscribe(channel)
        large = job_progress(1024)
        publish(b, channel, large)
        assert s.event(channel)["data"] == large
        publish(b, channel, "short")
        assert s.event(channel)["data"] == "short"
        own = job_progress(3000, step=3)
        s.send([{"channel": channel, "clientId": s.cid, "data": own, "id": "own"}])
        assert s.wait(lambda m: m.get("id") == "own")["successful"] is True
        assert s.event(channel)["data"] == own
    # and a raw client's offer gets no answer either; its event comes in a plain frame
    with Raw(b, "permessage-deflate") as raw:
        assert raw.extensions is None
        raw.bayeux_subscribe(channel)
        publish(b, channel, job_progress(1024))
        rsv, payload = raw.event_frame(channel)
        assert rsv == 0 and flat(payload)[0]["data"] == job_progress(1024)


# ---------------------------------------------------------------- a raw socket

class Raw(RawWebSocket):
    """wirekit's raw WebSocket with the Bayeux side of these tests: JSON sent plain or compressed, every data frame
    read inflated when it has RSV1, and data frames (text, ping) passed over on the way to a close."""

    MASK = b"\x5a\x13\xc4\x7e"
    SKIPPED_BEFORE_CLOSE = (TEXT, PING)

    def __init__(self, b, offer=None, timeout=HTTP_TIMEOUT):
        super().__init__(b, offer, timeout)
        self.cid = None
        self.frames = []     # (rsv, opcode, payload) of every data frame read, in order

    def send_json(self, messages, compressed=False):
        text = json.dumps(messages).encode()
        if compressed:
            self.send(TEXT, deflate_alone(text), rsv=RSV1)
        else:
            self.send(TEXT, text)

    def messages(self, timeout=HTTP_TIMEOUT):
        """The Bayeux messages of the next data frame (inflated when RSV1), with (rsv, wire size)."""
        while True:
            frame = self.recv_frame(timeout)
            assert frame is not None, "the connection ended"
            fin, rsv, opcode, payload, size = frame
            if opcode == PING:
                self.send(PONG, payload)
                continue
            assert fin and opcode == TEXT, f"expected one whole text frame, got {frame[:3]} {payload[:100]!r}"
            self.frames.append((rsv, opcode, payload, size))
            text = inflate(payload) if rsv & RSV1 else payload
            return flat(text), rsv, payload, size

    def wait(self, predicate, timeout=HTTP_TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            msgs, rsv, payload, size = self.messages(max(0.01, deadline - time.monotonic()))
            for m in msgs:
                if m.get("channel") == "/meta/connect" and m.get("successful") is True:
                    self.send_json([{"channel": "/meta/connect", "clientId": self.cid,
                                     "connectionType": "websocket"}])
                if predicate(m):
                    return m, rsv, payload, size

    def bayeux_subscribe(self, channel):
        self.send_json([{"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["websocket"]}])
        hs, rsv, _, _ = self.wait(lambda m: m.get("channel") == "/meta/handshake")
        assert hs["successful"] is True and rsv == 0, (hs, rsv)
        self.cid = hs["clientId"]
        self.send_json([{"channel": "/meta/connect", "clientId": self.cid, "connectionType": "websocket"},
                        {"channel": "/meta/subscribe", "clientId": self.cid, "subscription": channel}])
        reply, rsv, _, _ = self.wait(lambda m: m.get("channel") == "/meta/subscribe")
        assert reply["successful"] is True and rsv == 0, (reply, rsv)

    def event_frame(self, channel):
        """(rsv, payload as sent) of the frame that carries the next event on `channel`, checked to carry it alone."""
        m, rsv, payload, size = self.wait(lambda m: m.get("channel") == channel and "successful" not in m)
        self.last_size = size
        text = inflate(payload) if rsv & RSV1 else payload
        assert len(flat(text)) == 1, f"the event's frame holds more than the event: {text[:300]!r}"
        return rsv, text


def test_raw_large_event_is_one_compressed_frame_that_zlib_inflates(deflate_broker):
    channel = unique("raw-large")
    with Raw(deflate_broker, "permessage-deflate") as raw:
        assert raw.extensions == ANSWER
        raw.bayeux_subscribe(channel)
        data = job_progress(1024)
        publish(deflate_broker, channel, data)
        m, rsv, payload, size = raw.wait(lambda m: m.get("channel") == channel and "successful" not in m)
        assert rsv == RSV1, f"the event's frame has RSV bits {rsv:#x}, not RSV1"
        # zlib.decompressobj(-15) of the payload with 00 00 ff ff appended is the event's JSON, on its own
        d = zlib.decompressobj(-15)
        text = d.decompress(payload + TAIL)
        assert d.unused_data == b"" and not d.eof
        event = json.loads(text)
        event = event[0] if isinstance(event, list) else event
        assert len(flat(text)) == 1
        assert event["channel"] == channel and event["data"] == data
        assert len(payload) < len(text) / 2, (len(payload), len(text))
        # The replies of that socket (handshake, connect, subscribe) all came uncompressed.
        assert all(r == 0 for r, *_ in raw.frames[:-1]), raw.frames[:-1]


def test_raw_short_event_and_replies_are_not_compressed(deflate_broker):
    channel = unique("raw-short")
    with Raw(deflate_broker, "permessage-deflate") as raw:
        assert raw.extensions == ANSWER
        raw.bayeux_subscribe(channel)
        data = {"job": "render-42", "percent": 42.5}
        publish(deflate_broker, channel, data)
        rsv, text = raw.event_frame(channel)
        assert len(text) < 256, len(text)
        assert rsv == 0, f"a {len(text)}-byte event came with RSV bits {rsv:#x}"
        assert flat(text)[0]["data"] == data
        # a publish over the socket: its reply (short) is plain, the large event it publishes compressed
        big = job_progress(1500)
        raw.send_json([{"channel": channel, "clientId": raw.cid, "data": big, "id": "pub"}])
        reply, rsv_reply, _, _ = raw.wait(lambda m: m.get("id") == "pub" and "successful" in m)
        assert reply["successful"] is True and rsv_reply == 0, (reply, rsv_reply)
        rsv, text = raw.event_frame(channel)
        assert rsv == RSV1 and flat(text)[0]["data"] == big


def test_raw_events_of_one_flush_each_keep_a_frame_of_their_own_in_order(deflate_broker):
    """Events that go out together are written as one buffer (small frames copied after each other) with the large
    ones written on their own between them: every event still has its own frame, with its own RSV bits, in order."""
    channel = unique("raw-batch")
    noise = os.urandom(4500).hex()  # 9,000 bytes that deflate cannot shrink below the copied frames' limit
    with Raw(deflate_broker, "permessage-deflate") as raw:
        raw.bayeux_subscribe(channel)
        batch = []
        for n in range(9):
            data = [{"n": n}, job_progress(1500, step=n), {"n": n, "noise": noise}][n % 3]
            batch.append({"channel": channel, "data": data})
        replies = bayeux(deflate_broker, batch, timeout=HTTP_TIMEOUT)
        assert all(m.get("successful") for m in replies), replies
        for n, message in enumerate(batch):
            rsv, text = raw.event_frame(channel)
            assert flat(text)[0]["data"] == message["data"], n
            assert rsv == (0 if n % 3 == 0 else RSV1), (n, rsv)
            if n % 3 == 2:
                assert raw.last_size > 2048, raw.last_size


def test_raw_a_backlog_past_the_copy_limit_keeps_every_frame_in_order(deflate_broker):
    """At most 16 KiB of small frames are copied into one write; a backlog past that goes out as the shared frames
    themselves, after the copied ones: every event still arrives alone in its frame, in order."""
    channel = unique("raw-backlog")
    with Raw(deflate_broker, "permessage-deflate") as raw:
        raw.bayeux_subscribe(channel)
        batch = [{"channel": channel, "data": job_progress(1500, step=n)} for n in range(80)]
        replies = bayeux(deflate_broker, batch, timeout=HTTP_TIMEOUT)
        assert all(m.get("successful") for m in replies), replies
        sizes = 0
        for n, message in enumerate(batch):
            rsv, text = raw.event_frame(channel)
            assert rsv == RSV1 and flat(text)[0]["data"] == message["data"], n
            sizes += raw.last_size
        assert sizes > 2 * 16384, sizes  # more than the copy limit went out, whatever the writes' sizes


def test_raw_events_around_the_minimum_size(make_broker):
    """--websocket-compression-min-bytes N: events shorter than N bytes are sent plain, N bytes or more compressed."""
    b = make_broker(extra_args=["--websocket-compression-min-bytes", "2048"])
    channel = unique("raw-min")
    with Raw(b, "permessage-deflate") as raw:
        assert raw.extensions == ANSWER
        raw.bayeux_subscribe(channel)
        sizes = {}
        for n, size in enumerate([1024, 1900, 2100, 4096]):
            data = job_progress(size, step=n)
            publish(b, channel, data)
            rsv, text = raw.event_frame(channel)
            assert flat(text)[0]["data"] == data
            sizes[len(text)] = rsv
        for length, rsv in sizes.items():
            assert rsv == (RSV1 if length >= 2048 else 0), sizes


@pytest.mark.parametrize("offer", [
    "permessage-deflate; server_max_window_bits=10",
    "permessage-deflate; server_max_window_bits=14",
    "permessage-deflate; unknown_parameter",
    "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
    "permessage-deflate; client_max_window_bits=7",
    "x-webkit-deflate-frame",
])
def test_raw_declined_offer_gets_no_extension_and_plain_frames(deflate_broker, offer):
    channel = unique("raw-declined")
    with Raw(deflate_broker, offer) as raw:
        assert raw.extensions is None, f"offer {offer!r} answered with {raw.extensions!r}"
        raw.bayeux_subscribe(channel)
        data = job_progress(1024)
        publish(deflate_broker, channel, data)
        rsv, text = raw.event_frame(channel)
        assert rsv == 0 and flat(text)[0]["data"] == data


@pytest.mark.parametrize("offer", [
    "permessage-deflate",
    "permessage-deflate; client_max_window_bits",
    "permessage-deflate; server_max_window_bits=15; client_max_window_bits=10",
    'permessage-deflate; server_max_window_bits="15"',
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
    "permessage-deflate; server_max_window_bits=10, permessage-deflate",
    "x-webkit-deflate-frame, permessage-deflate; client_max_window_bits",
])
def test_raw_accepted_offer_gets_the_one_answer(deflate_broker, offer):
    channel = unique("raw-accepted")
    with Raw(deflate_broker, offer) as raw:
        assert raw.extensions == ANSWER, f"offer {offer!r} answered with {raw.extensions!r}"
        raw.bayeux_subscribe(channel)
        data = job_progress(1024)
        publish(deflate_broker, channel, data)
        rsv, text = raw.event_frame(channel)
        assert rsv == RSV1 and flat(text)[0]["data"] == data


def test_raw_compressed_publish_within_the_limit_is_accepted_even_fragmented(deflate_broker):
    """A compressed message whose inflated size is under --max-frame-bytes (64 KiB) is taken, also when its
    compressed bytes come in two frames (RSV1 on the first only, RFC 7692 section 6.1)."""
    channel = unique("raw-publish")
    with Raw(deflate_broker, "permessage-deflate") as raw:
        raw.bayeux_subscribe(channel)
        data = job_progress(60_000)
        text = json.dumps([{"channel": channel, "clientId": raw.cid, "data": data, "id": "big"}]).encode()
        assert 60_000 < len(text) < MAX_FRAME
        raw.send(TEXT, deflate_alone(text), rsv=RSV1)
        reply, _, _, _ = raw.wait(lambda m: m.get("id") == "big" and "successful" in m)
        assert reply["successful"] is True, reply
        _, got = raw.event_frame(channel)
        assert flat(got)[0]["data"] == data

        data2 = job_progress(5000, step=2)
        body = deflate_alone(json.dumps([{"channel": channel, "clientId": raw.cid, "data": data2,
                                          "id": "frag"}]).encode())
        half = len(body) // 2
        raw.send(TEXT, body[:half], fin=False, rsv=RSV1)
        raw.send(CONT, body[half:])
        reply, _, _, _ = raw.wait(lambda m: m.get("id") == "frag" and "successful" in m)
        assert reply["successful"] is True, reply
        _, got = raw.event_frame(channel)
        assert flat(got)[0]["data"] == data2


def spaces_message(length):
    """A publish of exactly `length` bytes of JSON, nearly all spaces (it deflates to a few hundred bytes)."""
    text = json.dumps([{"channel": "/x", "data": " " * (length - 31)}]).encode()
    assert len(text) == length
    return text


def test_raw_compressed_message_inflating_to_exactly_the_limit_is_accepted(deflate_broker):
    with Raw(deflate_broker, "permessage-deflate") as raw:
        raw.send(TEXT, deflate_alone(spaces_message(MAX_FRAME)), rsv=RSV1)
        msgs, rsv, _, _ = raw.messages()
        assert msgs == [{"channel": "/x", "successful": True}], msgs


@pytest.mark.parametrize("inflated", [MAX_FRAME + 1, MAX_FRAME + 4096, 100_000, 2 * MAX_FRAME, 16 * MAX_FRAME])
def test_raw_compressed_message_inflating_past_the_limit_is_closed_with_1009(deflate_broker, inflated):
    """--max-frame-bytes 65536 bounds the inflated message as it bounds a plain one (65,537 plain bytes get 1009)."""
    with Raw(deflate_broker, "permessage-deflate") as raw:
        assert raw.extensions == ANSWER
        body = deflate_alone(spaces_message(inflated))
        assert len(body) < 1024 * (inflated // MAX_FRAME + 1), len(body)
        raw.send(TEXT, body, rsv=RSV1)
        first = raw.recv_frame()
        assert first is not None and first[2] == CLOSE, (
            f"a compressed message of {len(body)} bytes inflating to {inflated} bytes (limit {MAX_FRAME}) was "
            f"answered with {first and first[3][:100]!r} instead of close 1009")
        assert int.from_bytes(first[3][:2], "big") == 1009, first
    server_answers_handshake(deflate_broker)


def test_raw_plain_message_past_the_limit_is_closed_with_1009(deflate_broker):
    """The reference for the compressed case: the same message uncompressed, one byte over the limit."""
    with Raw(deflate_broker, "permessage-deflate") as raw:
        raw.send(TEXT, spaces_message(MAX_FRAME + 1))
        assert raw.recv_close_code() == 1009
    server_answers_handshake(deflate_broker)


def test_raw_corrupt_compressed_message_is_closed_with_1007(deflate_broker):
    with Raw(deflate_broker, "permessage-deflate") as raw:
        # BFINAL=1, BTYPE=11: a reserved block type, which no inflater accepts
        raw.send(TEXT, b"\x07" + os.urandom(64), rsv=RSV1)
        assert raw.recv_close_code() == 1007
    server_answers_handshake(deflate_broker)


def test_raw_compressed_message_inflating_to_invalid_utf8_is_closed_with_1007(deflate_broker):
    with Raw(deflate_broker, "permessage-deflate") as raw:
        raw.send(TEXT, deflate_alone(b'[{"channel":"/x","data":"\xff\xfe"}]'), rsv=RSV1)
        assert raw.recv_close_code() == 1007
    server_answers_handshake(deflate_broker)


def test_raw_rsv1_on_a_continuation_frame_is_closed_with_1002(deflate_broker):
    with Raw(deflate_broker, "permessage-deflate") as raw:
        body = deflate_alone(json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                          "supportedConnectionTypes": ["websocket"]}]).encode())
        raw.send(TEXT, body[:5], fin=False, rsv=RSV1)
        raw.send(CONT, body[5:], rsv=RSV1)
        assert raw.recv_close_code() == 1002
    server_answers_handshake(deflate_broker)


@pytest.mark.parametrize("opcode", [PING, PONG, CLOSE], ids=["ping", "pong", "close"])
def test_raw_rsv1_on_a_control_frame_is_closed_with_1002(deflate_broker, opcode):
    with Raw(deflate_broker, "permessage-deflate") as raw:
        raw.send(opcode, (1000).to_bytes(2, "big") if opcode == CLOSE else b"hi", rsv=RSV1)
        assert raw.recv_close_code() == 1002
    server_answers_handshake(deflate_broker)


@pytest.mark.parametrize("offer", [None, "permessage-deflate; server_max_window_bits=10"], ids=["no-offer", "declined"])
def test_raw_rsv1_without_negotiation_is_closed_with_1002(deflate_broker, offer):
    with Raw(deflate_broker, offer) as raw:
        assert raw.extensions is None
        raw.send(TEXT, deflate_alone(b'[{"channel":"/meta/handshake","version":"1.0"}]'), rsv=RSV1)
        assert raw.recv_close_code() == 1002
    server_answers_handshake(deflate_broker)


@pytest.mark.parametrize("rsv", [RSV2, RSV3], ids=["rsv2", "rsv3"])
def test_raw_rsv2_and_rsv3_are_closed_with_1002_even_when_negotiated(deflate_broker, rsv):
    with Raw(deflate_broker, "permessage-deflate") as raw:
        assert raw.extensions == ANSWER
        raw.send(TEXT, b'[{"channel":"/meta/handshake","version":"1.0"}]', rsv=rsv)
        assert raw.recv_close_code() == 1002
    server_answers_handshake(deflate_broker)


def test_raw_bytes_on_the_wire_for_a_1kib_event_are_within_10_percent_of_zlib_alone(deflate_broker):
    """The compressed frame of a 1 KiB job-progress event against zlib (wbits -15, sync flush, tail removed) on the
    very text the broker sent, alone; and the whole frame (header included) against the plain frame."""
    channel = unique("raw-ratio")
    with Raw(deflate_broker, "permessage-deflate") as raw:
        raw.bayeux_subscribe(channel)
        data = job_progress(1024)
        publish(deflate_broker, channel, data)
        m, rsv, payload, size = raw.wait(lambda m: m.get("channel") == channel and "successful" not in m)
        assert rsv == RSV1
        text = inflate(payload)
        alone = deflate_alone(text)
        plain_frame = len(text) + (4 if len(text) > 125 else 2)
        report = (f"event {len(text)} B; wire payload {len(payload)} B (frame {size} B); zlib alone {len(alone)} B; "
                  f"payload/zlib {len(payload) / len(alone):.3f}; frame/plain frame {size / plain_frame:.3f}")
        print(report)
        assert 1024 <= len(text) < 1400, report
        assert abs(len(payload) - len(alone)) <= 0.10 * len(alone), report
        assert size <= 1.10 * (len(alone) + 4), report
        assert size < 0.6 * plain_frame, report
