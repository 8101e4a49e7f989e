"""Bad input over real sockets: malformed and hostile requests, frames and a seeded fuzz.

Every test ends by checking that the server still answers a handshake."""

import json
import os
import random
import time
import urllib.parse

import pytest
import requests
import websocket

from wirekit import (ALL6, ANY_CLIENT_ID, ANY_ERROR, ERROR_RE, HTTP_TIMEOUT, SHORT_TIMEOUT, WS, advice_ok,
                      connect_msg, connect_now, handshake, handshake_msg, post, post_raw, publish,
                      raw_http, server_answers_handshake, subscribe)
from pubsubtest.broker import target
from pubsubtest.websocket import upgrade_request

pytestmark = pytest.mark.timeout(120)


def assert_bad_request(r):
    assert r.status_code == 400, (r.status_code, r.text[:200])
    assert r.headers["Content-Type"].split(";")[0].strip() == "text/plain", r.headers
    assert r.text == "Bad request"


def assert_error_reply(reply):
    assert isinstance(reply, dict), reply
    assert reply.get("successful") is False, reply
    assert isinstance(reply.get("error"), str) and ERROR_RE.match(reply["error"]), reply


# ------------------------------------------------------------------ malformed JSON over HTTP

MALFORMED = [
    b"{nope",
    b'[{"channel":',
    b'{"channel":"/a","data":1}}',
    b'[{"channel":"/a","data":1},]',
    b"{'channel':'/a','data':1}",
    b'[{"channel":"/a","data":NaN}]',
    b'[{"channel":"/a","data":Infinity}]',
    b'{"channel":"/a","data":1} x',
    b'{"channel":"/a","data":1}{"channel":"/a","data":2}',
    b'{"channel":"/a","data":"unterminated}',
    b'{"channel":"/a","data":"\\x41"}',
    b'{"channel":"/a","data":tru}',
    b"[" * 1000,
    b"[" * 100000,
    b"]",
    b"\x00\x01\x02",
    b"   ",
]


@pytest.mark.parametrize("body", MALFORMED, ids=[f"m{i}" for i in range(len(MALFORMED))])
def test_malformed_json(broker, body):
    assert_bad_request(post_raw(broker, body))
    server_answers_handshake(broker)


def test_utf8_bom_is_rejected(broker):
    """Faye (its JSON parser, Oj) answers a body that starts with a UTF-8 byte order mark with 400."""
    assert_bad_request(post_raw(broker, b'\xef\xbb\xbf{"channel":"/a","data":1}'))
    server_answers_handshake(broker)


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain"])
def test_malformed_form_bodies(broker, content_type):
    for body in ["foo=bar", "message=%7Bnope", "message=%22hi%22", "message=", "message=%FF%FE"]:
        r = post_raw(broker, body, content_type=content_type)
        assert_bad_request(r)
    server_answers_handshake(broker)


@pytest.mark.parametrize("body", [b'"hi"', b"1", b"-1.5e3", b"true", b"false", b"null", b'"[]"'])
def test_top_level_scalars(broker, body):
    assert_bad_request(post_raw(broker, body))
    r = requests.get(broker.url, params={"message": body.decode()}, timeout=HTTP_TIMEOUT)
    assert_bad_request(r)
    server_answers_handshake(broker)


def test_nested_arrays_are_flattened(broker):
    reply = post(broker, b'[[{"channel":"/flat","data":1,"id":"a"}],[[{"channel":"/flat","data":2,"id":"b"}]]]')
    assert reply == [{"id": "a", "channel": "/flat", "successful": True},
                     {"id": "b", "channel": "/flat", "successful": True}]
    assert post(broker, b"[[],[[]]]") == []
    server_answers_handshake(broker)


@pytest.mark.pubsub_only
@pytest.mark.parametrize("body,objects", [
    (b"[1]", 0),
    (b"[null]", 0),
    (b"[true, false]", 0),
    (b"[[1]]", 0),
    (b'[{"channel":"/ne","data":1,"id":"ok"}, 2, "three"]', 1),
    (b'[4, {"channel":"/ne","data":1,"id":"ok"}]', 1),
], ids=["int", "null", "bools", "nested", "mixed-after", "mixed-before"])
def test_non_object_elements(broker, body, objects):
    """Faye (Ruby) never answers these; pubsub answers each element with an error reply."""
    elements = [e for e in json.loads(body) for e in (e if isinstance(e, list) else [e])]
    reply = post(broker, body, timeout=5)
    assert len(reply) == len(elements), reply
    ok = [r for r in reply if r.get("id") == "ok"]
    assert ok == [{"id": "ok", "channel": "/ne", "successful": True}] * objects, reply
    errors = [r for r in reply if r.get("id") != "ok"]
    assert len(errors) == len(elements) - objects
    for r in errors:
        assert_error_reply(r)
    server_answers_handshake(broker)


@pytest.mark.parametrize("body,objects", [
    (b'["x"]', 0),
    (b'["", "abc"]', 0),
    (b'[{"channel":"/ne","data":1,"id":"ok"}, "s"]', 1),
], ids=["one", "two", "mixed"])
def test_string_elements(broker, body, objects):
    """Faye (Ruby) answers a string element with an error reply (402:data:Missing required parameter)."""
    reply = post(broker, body, timeout=5)
    assert len(reply) == len(json.loads(body)), reply
    assert [r for r in reply if r.get("id") == "ok"] == [{"id": "ok", "channel": "/ne", "successful": True}] * objects
    errors = [r for r in reply if r.get("id") != "ok"]
    assert len(errors) == len(reply) - objects
    for r in errors:
        assert_error_reply(r)
    server_answers_handshake(broker)


@pytest.mark.pubsub_only
def test_non_object_elements_over_websocket(broker):
    with WS(broker) as w:
        w.send("[1]")
        reply = w.recv(timeout=5)
        assert len(reply) == 1
        assert_error_reply(reply[0])
        w.send('[{"channel":"/ne","data":1,"id":"ok"},"x"]')
        reply = w.recv(timeout=5)
        assert len(reply) == 2, reply
        assert {"id": "ok", "channel": "/ne", "successful": True} in reply
        assert_error_reply([r for r in reply if r.get("id") != "ok"][0])
    server_answers_handshake(broker)


def test_wrong_field_types_are_answered(broker):
    """Valid JSON objects with odd field types get a reply (whatever it says), never a hang."""
    cid = handshake(broker)
    odd = [
        {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": [], "id": "a"},
        {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["x", None], "id": "b"},
        {"channel": "/meta/subscribe", "clientId": cid, "subscription": [], "id": "c"},
        {"channel": "/meta/unsubscribe", "clientId": cid, "subscription": [], "id": "d"},
        {"channel": "/odd", "data": {"nested": {"deep": [1, {"x": None}]}}, "id": "e"},
        {"channel": "/odd", "data": "", "id": "f"},
        {"channel": "/odd", "data": 0, "id": "g"},
        {"channel": "/odd", "data": False, "id": "h"},
        {"channel": "/odd", "data": [], "id": "i"},
        {"channel": "/odd", "data": {}, "id": "j"},
        {"channel": "/odd", "data": 1, "id": 5},
        {"channel": "/odd", "data": 1, "id": "x" * 1000},
        {"channel": "/odd", "data": 1, "ext": "not-an-object", "id": "k"},
        {"channel": "/odd", "data": 1, "advice": {"timeout": "soon"}, "id": "l"},
        {},
    ]
    for msg in odd:
        reply = post(broker, [msg], timeout=5)
        assert len(reply) == 1, (msg, reply)
        assert reply[0].get("successful") in (True, False), (msg, reply)
    server_answers_handshake(broker)


def test_error_strings_follow_the_grammar(broker):
    cid = handshake(broker)
    reply = post(broker, [
        {"channel": "/meta/handshake", "id": "1"},
        {"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["a", "b"], "id": "2"},
        {"channel": "/meta/connect", "clientId": "nope", "connectionType": "long-polling", "id": "3"},
        {"channel": "/meta/connect", "clientId": cid, "id": "4"},
        {"channel": "/meta/subscribe", "clientId": cid, "subscription": "/meta/x", "id": "5"},
        {"channel": "/meta/subscribe", "clientId": cid, "subscription": "x", "id": "6"},
        {"channel": "/meta/unknown", "id": "7"},
        {"channel": "/p", "id": "8"},
        {"data": 1, "id": "9"},
        {"channel": "/meta/disconnect", "id": "10"},
    ])
    assert len(reply) == 10
    for r in reply:
        assert_error_reply(r)
    server_answers_handshake(broker)


def test_control_characters_in_channel(broker):
    reply = post(broker, b'[{"channel":"/a\\u0000","data":"x","id":"nul"},'
                         b'{"channel":"/a\\tb","data":"x","id":"tab"}]')
    assert reply == [{"id": "nul", "channel": "/a\u0000", "successful": False, "error": "405:/a\u0000:Invalid channel"},
                     {"id": "tab", "channel": "/a\tb", "successful": False, "error": "405:/a\tb:Invalid channel"}]
    server_answers_handshake(broker)


@pytest.mark.pubsub_only
def test_newline_in_channel_is_invalid(broker):
    """PROTOCOL.md 4.2 allows no newline in a channel name. Faye's grammar regexes use Ruby's
    line anchors (^ $), so Faye accepts "/a\nb" and "x\n/b"; pubsub follows the grammar."""
    cid = handshake(broker)
    reply = post(broker, [{"channel": "/a\nb", "data": "x", "id": "nl"},
                          {"channel": "/meta/subscribe", "clientId": cid, "subscription": "x\n/b", "id": "s"}])
    assert reply == [{"id": "nl", "channel": "/a\nb", "successful": False, "error": "405:/a\nb:Invalid channel"},
                     {"id": "s", "clientId": cid, "channel": "/meta/subscribe", "successful": False,
                      "subscription": "x\n/b", "error": "405:x\n/b:Invalid channel"}]
    server_answers_handshake(broker)


def test_odd_but_valid_strings_are_delivered(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/str")
    connect_now(broker, cid)
    data = ["\u0000", "\U0001F600", "\u00e9\u2028\u2029", "\\", '"', "\ufeff"]
    for i, d in enumerate(data):
        publish(broker, "/str", d, id=f"s{i}")
    events = connect_now(broker, cid, "c1")
    assert events == [{"channel": "/str", "data": d, "id": f"s{i}"} for i, d in enumerate(data)]
    server_answers_handshake(broker)


# ------------------------------------------------------------------ encodings

INVALID_UTF8 = [
    b'{"channel":"/a","data":"\xff\xfe"}',
    b'{"channel":"/a","data":"\xc0\xaf"}',           # overlong "/"
    b'{"channel":"/a","data":"\xed\xa0\x80"}',       # encoded surrogate
    b'{"channel":"/a","data":"\xe2\x82"}',           # truncated sequence
    b'{"channel":"/a","data":"\xf4\x90\x80\x80"}',   # above U+10FFFF
    b'{"channel":"/a\x80","data":1}',
]


@pytest.mark.parametrize("body", INVALID_UTF8, ids=[f"u{i}" for i in range(len(INVALID_UTF8))])
def test_invalid_utf8(broker, body):
    assert_bad_request(post_raw(broker, body))
    form = b"message=" + urllib.parse.quote_from_bytes(body).encode()
    assert_bad_request(post_raw(broker, form, content_type="application/x-www-form-urlencoded"))
    server_answers_handshake(broker)


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udc00", b"\\ud800x"])
def test_lone_surrogate_escapes(broker, escape):
    assert_bad_request(post_raw(broker, b'{"channel":"/a","data":"' + escape + b'","id":"s"}'))
    server_answers_handshake(broker)


def test_surrogate_pair_escape(broker):
    reply = post(broker, b'{"channel":"/a","data":"\\ud83d\\ude00","id":"s"}')
    assert reply == [{"id": "s", "channel": "/a", "successful": True}]
    server_answers_handshake(broker)


# ------------------------------------------------------------------ sizes and depth (pubsub limits)

def _publish_of_size(n, channel="/big"):
    """A JSON publish message of exactly n bytes."""
    skeleton = json.dumps({"channel": channel, "data": "", "id": "big"}, separators=(",", ":"))
    pad = n - len(skeleton)
    assert pad >= 0
    body = json.dumps({"channel": channel, "data": "x" * pad, "id": "big"}, separators=(",", ":"))
    assert len(body) == n
    return body.encode()


@pytest.mark.pubsub_only
def test_request_body_limit(make_broker):
    b = make_broker(timeout=SHORT_TIMEOUT, extra_args=("--max-request-bytes", "4096"))
    r = post_raw(b, _publish_of_size(4096))
    assert r.status_code == 200, r.text
    assert r.json() == [{"id": "big", "channel": "/big", "successful": True}]
    r = post_raw(b, _publish_of_size(4097))
    assert r.status_code == 413, (r.status_code, r.text[:200])
    r = post_raw(b, _publish_of_size(20000))
    assert r.status_code == 413
    # a chunked body has no Content-Length: the limit applies while reading it
    body = _publish_of_size(20000)
    r = requests.post(b.url, data=(body[i:i + 1000] for i in range(0, len(body), 1000)),
                      headers={"Content-Type": "application/json"}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 413
    server_answers_handshake(b)


@pytest.mark.pubsub_only
def test_default_request_body_limit(broker):
    body = _publish_of_size(1536 * 1024)
    head = (f"POST /faye HTTP/1.1\r\nHost: 127.0.0.1:{broker.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    status, _, _ = raw_http(broker, head + body)
    assert status == 413
    assert post_raw(broker, _publish_of_size(512 * 1024)).status_code == 200
    server_answers_handshake(broker)


@pytest.mark.pubsub_only
@pytest.mark.parametrize("body", [
    b"[" * 100000 + b"]" * 100000,
    b'{"a":' * 50000 + b"1" + b"}" * 50000,
    b'{"channel":"/a","data":' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'[{"channel":"/a","data":' + b'{"k":' * 100 + b"1" + b"}" * 100 + b"}]",
], ids=["arrays", "objects", "deep-data", "deep-object-data"])
def test_deeply_nested_json(broker, body):
    """Faye has no nesting limit (it even accepts 100000 levels); pubsub answers 400."""
    assert_bad_request(post_raw(broker, body))
    server_answers_handshake(broker)


@pytest.mark.pubsub_only
def test_json_depth_limit_setting(make_broker):
    b = make_broker(timeout=SHORT_TIMEOUT, extra_args=("--max-json-depth", "8"))
    ok = b'[{"channel":"/a","data":[[1]],"id":"ok"}]'
    assert post(b, ok) == [{"id": "ok", "channel": "/a", "successful": True}]
    deep = b'[{"channel":"/a","data":' + b"[" * 20 + b"]" * 20 + b',"id":"deep"}]'
    assert_bad_request(post_raw(b, deep))
    with WS(b) as w:
        w.send(deep.decode())
        w.send([])
        reply = w.recv(timeout=5)
        if reply != []:                  # the deep frame may be answered with an error reply
            assert len(reply) == 1, reply
            assert_error_reply(reply[0])
            assert w.recv(timeout=5) == []
    server_answers_handshake(b)


def test_moderately_nested_data_is_delivered(broker):
    cid = handshake(broker)
    subscribe(broker, cid, "/nest")
    connect_now(broker, cid)
    data = 1
    for i in range(40):
        data = [data] if i % 2 else {"k": data}
    publish(broker, "/nest", data, id="n")
    assert connect_now(broker, cid, "c1") == [{"channel": "/nest", "data": data, "id": "n"}]
    server_answers_handshake(broker)


# ------------------------------------------------------------------ WebSocket

@pytest.mark.pubsub_only
def test_websocket_frame_limit(make_broker):
    b = make_broker(timeout=SHORT_TIMEOUT, extra_args=("--max-frame-bytes", "4096"))
    bystander = WS(b)
    bcid = bystander.handshake()
    bystander.send([{"channel": "/meta/subscribe", "clientId": bcid, "subscription": "/by", "id": "s"}])
    bystander.recv()
    with WS(b) as w:
        w.send(_publish_of_size(4000).decode())
        assert w.recv() == [{"id": "big", "channel": "/big", "successful": True}]
        w.send(_publish_of_size(8000).decode())
        assert w.recv_close() == 1009
    # the limit covers a message split into continuation frames too
    with WS(b) as w:
        body = _publish_of_size(8000)
        w.sock.send_frame(websocket.ABNF(fin=0, opcode=websocket.ABNF.OPCODE_TEXT, data=body[:3000]))
        w.sock.send_frame(websocket.ABNF(fin=0, opcode=websocket.ABNF.OPCODE_CONT, data=body[3000:6000]))
        try:
            w.sock.send_frame(websocket.ABNF(fin=1, opcode=websocket.ABNF.OPCODE_CONT, data=body[6000:]))
        except (BrokenPipeError, ConnectionResetError, websocket.WebSocketConnectionClosedException):
            pass
        assert w.recv_close() == 1009
    _assert_session_works(b, bystander, bcid, "/by")
    bystander.close()
    server_answers_handshake(b)


def _assert_session_works(b, w, cid, channel):
    w.send([connect_msg(cid, "by0", "websocket", advice_timeout=0)])
    reply = w.recv()
    assert reply[0]["successful"] is True and reply[0]["id"] == "by0", reply
    w.send([connect_msg(cid, "by1", "websocket")])
    publish(b, channel, "still here", id="sh")
    assert w.recv() == [{"channel": channel, "data": "still here", "id": "sh"}]


GARBAGE_TEXT = ["{nope", "", " ", "\"hi\"", "1", "null", "[", "]]]", "{\"channel\":", "\u0000\u0001", "x" * 5000]


def test_websocket_garbage_text(broker):
    bystander = WS(broker)
    bcid = bystander.handshake()
    bystander.send([{"channel": "/meta/subscribe", "clientId": bcid, "subscription": "/gt", "id": "s"}])
    bystander.recv()
    with WS(broker) as w:
        cid = w.handshake()
        for g in GARBAGE_TEXT:
            w.send(g)
            if target() == "pubsub":
                # pubsub answers each bad frame with a Bayeux error instead of ignoring it.
                assert w.recv() == [{"successful": False, "error": ANY_ERROR}], g
        w.assert_quiet(0.5)            # nothing more: Faye ignores invalid JSON and scalars
        w.send([])
        assert w.recv() == []          # and the socket stays open
        w.send([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/gt2", "id": "s2"}])
        assert w.recv() == [{"id": "s2", "clientId": cid, "channel": "/meta/subscribe", "successful": True,
                             "subscription": "/gt2"}]
    _assert_session_works(broker, bystander, bcid, "/gt")
    bystander.close()
    server_answers_handshake(broker)


def test_websocket_binary_frames(broker):
    bystander = WS(broker)
    bcid = bystander.handshake()
    bystander.send([{"channel": "/meta/subscribe", "clientId": bcid, "subscription": "/bin", "id": "s"}])
    bystander.recv()
    w = WS(broker)
    w.send_bytes(b'[{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["websocket"]}]')
    if target() == "pubsub":
        # pubsub reads UTF-8 JSON in a binary frame as a text frame (as Faye's Node server does; iOS and Java
        # clients send binary frames).
        [reply] = w.recv(timeout=3)
        assert reply["channel"] == "/meta/handshake" and reply["successful"] is True
        cid = reply["clientId"]
    w.send_bytes(bytes(range(256)))
    if target() == "pubsub":
        # Garbage in a binary frame is answered as garbage in a text frame, and the session goes on.
        assert w.recv(timeout=3) == [{"successful": False, "error": ANY_ERROR}]
        w.send_bytes(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/bin2",
                                  "id": "s2"}]).encode())
        assert w.recv(timeout=3) == [{"id": "s2", "clientId": cid, "channel": "/meta/subscribe",
                                      "successful": True, "subscription": "/bin2"}]
    # Faye 1.4 (Ruby) ignores binary frames; either way the socket still answers.
    w.send([])
    assert w.recv(timeout=3) == []
    w.close()
    _assert_session_works(broker, bystander, bcid, "/bin")
    bystander.close()
    server_answers_handshake(broker)


def test_websocket_invalid_utf8_text_frame(broker):
    bystander = WS(broker)
    bcid = bystander.handshake()
    bystander.send([{"channel": "/meta/subscribe", "clientId": bcid, "subscription": "/u8", "id": "s"}])
    bystander.recv()
    with WS(broker) as w:
        w.send_bytes(b'[{"channel":"/u8","data":"\xff"}]', opcode=websocket.ABNF.OPCODE_TEXT)
        assert w.recv_close() == 1007
    _assert_session_works(broker, bystander, bcid, "/u8")
    bystander.close()
    server_answers_handshake(broker)


def test_websocket_ping_is_answered(broker):
    with WS(broker) as w:
        w.sock.ping(b"hello")
        w.sock.settimeout(5)
        frame = w.sock.recv_frame()
        assert frame.opcode == websocket.ABNF.OPCODE_PONG
        assert frame.data == b"hello"
        w.send([])
        assert w.recv() == []
    server_answers_handshake(broker)


def test_websocket_abrupt_disconnects(broker):
    """Sockets that vanish mid-handshake, mid-frame or with a held connect do not hurt the server."""
    import socket
    for partial in [b"GET /faye HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",
                    upgrade_request(broker.port, host="x") + b"\x81\xfe\x10"]:
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        s.sendall(partial)
        s.close()
    w = WS(broker)
    cid = w.handshake()
    w.send([connect_msg(cid, "c0", "websocket", advice_timeout=0)])
    w.recv()
    w.send([connect_msg(cid, "c1", "websocket")])
    w.sock.sock.close()                  # no close frame
    time.sleep(0.3)
    publish(broker, "/nobody", 1)
    server_answers_handshake(broker)


@pytest.mark.pubsub_only
@pytest.mark.parametrize("key", ["short", "dGhlIHNhbXBsZSBub25jZQ", "not base64 at all!!!!!!!", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"])
def test_websocket_upgrade_with_a_bad_key_is_refused(broker, key):
    """Sec-WebSocket-Key must be 16 bytes in base64 (RFC 6455 4.1): anything else is a 400, never a 101."""
    import socket
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    s.sendall(upgrade_request(broker.port, key=key, host="x"))
    status = s.recv(200).split(b"\r\n")[0]
    s.close()
    assert status == b"HTTP/1.1 400 Bad Request", status
    server_answers_handshake(broker)


# ------------------------------------------------------------------ raw HTTP garbage

@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"POST /faye HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /faye HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64)),
], ids=["request-line", "content-length", "chunk-size", "tls-hello"])
def test_garbage_http(broker, raw):
    import socket
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    try:
        s.sendall(raw)
        data = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pytest.fail(f"the connection was not closed within 5 s; got {data[:200]!r}")
        except ConnectionResetError:
            pass
    finally:
        s.close()
    if data:
        assert data.startswith(b"HTTP/1.1 400") or data.startswith(b"HTTP/1.0 400"), data[:200]
    server_answers_handshake(broker)


# ------------------------------------------------------------------ fuzz

FUZZ_SEED = int(os.environ.get("WIRE_FUZZ_SEED", "20240607"))
FUZZ_HTTP_CASES = int(os.environ.get("WIRE_FUZZ_HTTP_CASES", "300"))
FUZZ_WS_CASES = int(os.environ.get("WIRE_FUZZ_WS_CASES", "200"))
STRUCTURAL = b'[]{}",:\\0123456789-.etruefalsn /'


def _base_messages(cid):
    return [
        [handshake_msg("f1", ("long-polling", "websocket"))],
        [{"channel": "/meta/subscribe", "clientId": cid, "subscription": ["/fz/a", "/fz/*"], "id": "f2"}],
        [{"channel": "/meta/unsubscribe", "clientId": cid, "subscription": "/fz/a", "id": "f3"}],
        [{"channel": "/fz/a", "data": {"text": "h\u00e9llo", "n": [1, 2.5, None, True]}, "clientId": cid,
          "id": "f4", "ext": {"token": "t"}}],
        [connect_msg(cid, "f5", advice_timeout=0)],
        [{"channel": "/fz/b", "data": "x", "id": "f6"}, {"channel": "/fz/c", "data": [], "id": "f7"}],
        {"channel": "/fz/d", "data": {"k": "v"}},
    ]


def _mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.randrange(7)
        pos = rng.randrange(len(data) + 1) if data else 0
        if op == 0 and data:                                    # byte flip
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op == 1 and data:                                  # bit flip
            data[min(pos, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 2:                                           # truncation
            data = data[:pos]
        elif op == 3:                                           # random bytes inserted
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
        elif op == 4:                                           # JSON-ish byte inserted
            data[pos:pos] = bytes([rng.choice(STRUCTURAL)])
        elif op == 5 and data:                                  # deletion
            del data[pos:pos + rng.randrange(1, 4)]
        elif op == 6 and data:                                  # duplicated slice
            end = min(len(data), pos + rng.randrange(1, 16))
            data[pos:pos] = data[pos:end]
    return bytes(data)


def _faye_hangs_on(body):
    """Ruby Faye never answers a request with a non-object element; pubsub answers it.
    Against Faye such inputs are left out of the fuzz (see test_non_object_elements)."""
    try:
        text = body.decode("utf-8")
        value = json.loads(text)
    except (UnicodeDecodeError, ValueError):
        return False

    def flat(v):
        if isinstance(v, list):
            for x in v:
                yield from flat(x)
        else:
            yield v
    return any(not isinstance(e, dict) for e in flat(value)) if isinstance(value, list) else False


def _fuzz_cases(rng, cid, n):
    bases = [json.dumps(m, ensure_ascii=False).encode("utf-8") for m in _base_messages(cid)]
    out = []
    while len(out) < n:
        body = _mutate(rng, rng.choice(bases))
        if os.environ.get("PUBSUB_TARGET", "pubsub") == "faye" and _faye_hangs_on(body):
            continue
        out.append(body)
    return out


def test_fuzz_http(short_broker):
    b = short_broker
    rng = random.Random(FUZZ_SEED)
    cid = handshake(b)
    cases = _fuzz_cases(rng, cid, FUZZ_HTTP_CASES)
    wait = SHORT_TIMEOUT + 8     # a mutation may leave a valid connect that is held for the timeout

    def send(i_body):
        i, body = i_body
        ctype = "application/json" if i % 5 else "application/x-www-form-urlencoded"
        payload = body if i % 5 else b"message=" + urllib.parse.quote_from_bytes(body).encode()
        try:
            r = post_raw(b, payload, content_type=ctype, timeout=wait)
        except requests.RequestException as e:
            return f"case {i} {body!r}: {type(e).__name__}: {e}"
        if r.status_code in (400, 413):
            return None
        if r.status_code != 200:
            return f"case {i} {body!r}: HTTP {r.status_code} {r.text[:200]!r}"
        try:
            reply = r.json()
        except ValueError:
            return f"case {i} {body!r}: not JSON: {r.text[:200]!r}"
        if not isinstance(reply, list) or not all(isinstance(m, dict) for m in reply):
            return f"case {i} {body!r}: not an array of objects: {reply!r}"
        return None

    # Sequential: two concurrent connects of one client would supersede each other,
    # and Faye never answers a superseded connect.
    problems = [p for p in map(send, enumerate(cases)) if p]
    assert not problems, "\n".join(problems[:20]) + f"\n({len(problems)} problems)\n{b.log()[-2000:]}"
    server_answers_handshake(b)


def test_fuzz_websocket(short_broker):
    b = short_broker
    rng = random.Random(FUZZ_SEED + 1)
    cid = handshake(b)
    cases = _fuzz_cases(rng, cid, FUZZ_WS_CASES)
    w = WS(b)
    reopened = 0
    problems = []
    for i, body in enumerate(cases):
        sentinel = f"sentinel-{i}"
        try:
            w.send_bytes(body, opcode=websocket.ABNF.OPCODE_TEXT)
            w.send([{"channel": "/fz/sentinel", "data": i, "id": sentinel}])
            deadline = time.monotonic() + SHORT_TIMEOUT + 8
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    problems.append(f"case {i} {body!r}: no sentinel reply")
                    break
                reply = w.recv(timeout=left)
                if not isinstance(reply, list) or not all(isinstance(m, dict) for m in reply):
                    problems.append(f"case {i} {body!r}: frame {reply!r}")
                if any(isinstance(m, dict) and m.get("id") == sentinel for m in reply):
                    break
        except (websocket.WebSocketConnectionClosedException, BrokenPipeError, ConnectionResetError,
                AssertionError) as e:
            valid_text = True
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                valid_text = False
            if valid_text:
                problems.append(f"case {i} {body!r}: socket closed ({type(e).__name__}: {e})")
            w.close()
            w = WS(b)
            reopened += 1
        except websocket.WebSocketTimeoutException:
            problems.append(f"case {i} {body!r}: timed out")
            w.close()
            w = WS(b)
    w.close()
    assert not problems, "\n".join(problems[:20]) + f"\n({len(problems)} problems)\n{b.log()[-2000:]}"
    server_answers_handshake(b)
