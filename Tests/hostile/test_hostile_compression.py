"""A decompression bomb over WebSocket compression (permessage-deflate, RFC 7692).

A client negotiates permessage-deflate and sends a compressed message of about 1 MiB (under `--max-frame-bytes`,
2 MiB here) that inflates to 1 GiB of spaces. The broker must stop inflating at the message limit and close with
1009, again and again, without its memory growing and while it keeps serving its other clients.
"""

import json
import threading
import time
import zlib

from hostilekit import MiB, RSS_BOUND, hostile_broker, new_client_served, read_http_head, raw_socket, rss

from pubsubtest.compression import ANSWER
from pubsubtest.websocket import RSV1, TEXT, frame, upgrade_request

MAX_FRAME = 2 * MiB
INFLATED = 1 << 30         # what the bomb inflates to
SEGMENT = 16 * MiB         # compressed once and repeated: 64 segments make the bomb
WARM_UP = 5               # the first bombs settle the allocator (measured: about +13 MiB after 3, then flat)
ATTEMPTS = 50
AT_ONCE = 8
GROWTH_BOUND = 4 * MiB     # resident memory after ATTEMPTS more bombs, over what it was after the warm-up
TOTAL_BOUND = 32 * MiB     # resident memory after all of them, over the baseline before the first

_bomb = None


def bomb():
    """Raw DEFLATE of a publish whose data is 1 GiB of spaces, as a permessage-deflate message (final 00 00 ff ff
    removed). Each part ends in a full flush (no back-references across it), so the same compressed segment can be
    repeated: built in a fraction of a second instead of compressing 1 GiB."""
    global _bomb
    if _bomb is None:
        head = zlib.compressobj(9, zlib.DEFLATED, -15)
        prefix = head.compress(b'[{"channel":"/bomb","data":"') + head.flush(zlib.Z_FULL_FLUSH)
        body = zlib.compressobj(9, zlib.DEFLATED, -15)
        segment = body.compress(b" " * SEGMENT) + body.flush(zlib.Z_FULL_FLUSH)
        _bomb = (prefix + segment * (INFLATED // SEGMENT))[:-4]
        # what it inflates to, checked on its first 64 MiB
        d = zlib.decompressobj(-15)
        first = d.decompress(_bomb + b"\x00\x00\xff\xff", 64 * MiB)
        assert first.startswith(b'[{"channel":"/bomb","data":"   ') and len(first) == 64 * MiB
        assert first.count(b" ") == 64 * MiB - len(b'[{"channel":"/bomb","data":"'), "not all spaces"
    return _bomb


def compressed_frame(payload):
    """A final text frame with RSV1, masked with the key 0 (a valid key that leaves the payload as it is)."""
    return frame(TEXT, payload, rsv=RSV1, mask=b"\0\0\0\0")


def upgrade(b, offer="permessage-deflate; client_max_window_bits"):
    s = raw_socket(b, timeout=10)
    s.sendall(upgrade_request(b.port, offer=offer))
    status, headers, rest = read_http_head(s, timeout=10)
    assert status == 101, (status, headers)
    assert headers.get("sec-websocket-extensions") == ANSWER, headers
    return s, rest


def close_code(s, data, timeout=15):
    """The status code of the first frame the broker sends after the bomb, which must be a close."""
    deadline = time.monotonic() + timeout
    while len(data) < 4:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(4096)
        except (TimeoutError, ConnectionResetError) as e:
            raise AssertionError(f"no close frame after the bomb ({data!r}): {e!r}") from None
        if not chunk:
            raise AssertionError(f"the connection ended without a close frame ({data!r})")
        data += chunk
    assert data[0] == 0x88, f"the broker answered the bomb with a frame other than a close: {data[:100]!r}"
    return int.from_bytes(data[2:4], "big")


def detonate(b):
    s, rest = upgrade(b)
    try:
        s.sendall(compressed_frame(bomb()))
        return close_code(s, rest)
    finally:
        s.close()


def test_a_decompression_bomb_is_closed_with_1009_and_costs_no_memory():
    payload = bomb()
    assert len(payload) < MAX_FRAME, len(payload)
    with hostile_broker({"max-frame-bytes": MAX_FRAME}) as (b, g):
        base = rss(b.pid)
        codes = [detonate(b) for _ in range(WARM_UP)]
        time.sleep(0.3)
        warm = rss(b.pid)
        t0 = time.monotonic()
        for i in range(ATTEMPTS):
            codes.append(detonate(b))
            if i % 10 == 9:
                g.assert_served(f"after {WARM_UP + i + 1} bombs")
            g.assert_rss(f"after {WARM_UP + i + 1} bombs of {len(payload)} bytes inflating to {INFLATED} bytes")
        elapsed = time.monotonic() - t0
        assert codes == [1009] * (WARM_UP + ATTEMPTS), codes
        time.sleep(0.3)
        after = rss(b.pid)

        # and AT_ONCE at the same time
        results = []
        threads = [threading.Thread(target=lambda: results.append(detonate(b))) for _ in range(AT_ONCE)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert results == [1009] * AT_ONCE, results
        g.assert_rss(f"after {AT_ONCE} bombs at once")
        time.sleep(0.3)
        end = rss(b.pid)

        report = (f"bombs of {len(payload) / MiB:.2f} MiB inflating to {INFLATED >> 20} MiB: RSS baseline "
                  f"{base / MiB:.1f} MiB, {(warm - base) / MiB:+.1f} MiB after {WARM_UP}, "
                  f"{(after - warm) / MiB:+.1f} MiB over the next {ATTEMPTS} ({elapsed:.1f}s), "
                  f"{(end - base) / MiB:+.1f} MiB after {AT_ONCE} more at once; "
                  f"peak {g.growth() / MiB:+.1f} MiB (suite bound {RSS_BOUND // MiB} MiB)")
        print(report)
        assert after - warm <= GROWTH_BOUND, report
        assert end - base <= TOTAL_BOUND, report
        g.assert_served("after the bombs")
        assert new_client_served(b) is True
        g.assert_fds_back(what="the bombs")
        # a compressed message of an honest size is still taken on a new connection
        s, rest = upgrade(b)
        try:
            text = json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                                "supportedConnectionTypes": ["websocket"]}]).encode()
            c = zlib.compressobj(wbits=-15)
            s.sendall(compressed_frame(c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH)[:-4]))
            data = rest
            while b"successful" not in data:
                chunk = s.recv(65536)
                assert chunk, data
                data += chunk
            assert b'"successful":true' in data, data
        finally:
            s.close()
