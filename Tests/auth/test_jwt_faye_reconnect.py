"""A connection token that expires mid-session: the broker answers the next /meta/connect 401 with advice
`handshake`, and Faye's own Ruby client handshakes again with a fresh token (fetched by an extension before each
handshake, as the browser client's `token` option does), resubscribes, and keeps receiving."""

import json
import os
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from authkit import Broker, HS_SECRET, claims, hs256, publish

HERE = os.path.dirname(os.path.abspath(__file__))
CHANNEL = "/jobs/42"
TTL = 3


class TokenServer:
    """The app's login endpoint: a fresh token for user 42, valid TTL seconds, on every GET."""

    def __init__(self):
        self.issued = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.issued += 1
                body = hs256(claims("42", ttl=TTL, channels=[CHANNEL])).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["websocket", "long-polling"])
def test_faye_client_rehandshakes_with_a_fresh_token(transport):
    ruby = shutil.which("ruby")
    assert ruby, "ruby is not installed: run scripts/install-test-deps (Debian ruby-faye)"
    tokens = TokenServer()
    script = os.path.join(HERE, "faye_token_client.rb")
    try:
        with Broker(timeout=1, extra_args=["--jwt-key", HS_SECRET]) as b:
            env = dict(os.environ, FAYE_DISABLE_WEBSOCKET="1" if transport == "long-polling" else "")
            proc = subprocess.Popen([ruby, script, b.url, tokens.url, CHANNEL, str(TTL * 2 + 4)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            sent = []
            stop = time.monotonic() + TTL * 2 + 3
            n = 0
            while time.monotonic() < stop:
                time.sleep(0.4)
                n += 1
                reply = publish(b, CHANNEL, n, ext={"token": hs256(claims("app", publish=[CHANNEL]))})
                assert reply["successful"] is True, reply
                sent.append(n)
            out, err = proc.communicate(timeout=30)
            lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            # The exit status says how a client that stopped early ended (a signal is negative).
            assert lines and lines[-1]["event"] == "done", (proc.returncode, out[-2000:], err[-2000:])
            wire_in = [l["message"] for l in lines if l["event"] == "wire" and l["dir"] == "in"]
            expired = [m for m in wire_in if m.get("channel") == "/meta/connect" and m.get("successful") is False]
            assert expired, "no connect was refused"
            assert expired[0]["error"].endswith(":Token expired") and expired[0]["advice"]["reconnect"] == "handshake"
            handshakes = [m for m in wire_in if m.get("channel") == "/meta/handshake" and m.get("successful")]
            client_ids = {m["clientId"] for m in handshakes}
            assert len(client_ids) >= 2, handshakes  # handshook again, as a new session
            assert tokens.issued >= 2
            subscribes = [m for m in wire_in if m.get("channel") == "/meta/subscribe" and m.get("successful")]
            assert len({m["clientId"] for m in subscribes}) >= 2  # and resubscribed
            received = [l["data"] for l in lines if l["event"] == "message"]
            # Messages published after the last re-handshake arrive: the new session is authorized.
            assert sent[-1] in received or sent[-2] in received, (sent, received)
    finally:
        tokens.close()
