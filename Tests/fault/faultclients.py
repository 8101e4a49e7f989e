"""The subscribers of the fault suite. Each reaches the broker through a fault proxy, puts every event its
application gets in a faultkit.Tally (deliver(n)), and the gaps it is told of (announce(what)).

    SubscribeCLI   `pubsub subscribe --accept-gaps` (resumes with positions); a `recovered: false` line on stderr
                   is an announced gap
    AckClient      a Bayeux client with the acknowledgement extension (ext.ack), written here from its description:
                   handshake with ext.ack = true; each /meta/connect sends ext.ack = the batch number of the last
                   connect reply received (0 before any); a successful connect reply's ext.ack is the new batch
                   number. WebSocket or long-polling. A session the broker ended (advice.reconnect = handshake) is an
                   announced gap.
    FayeRuby       Faye 1.4's Ruby client (faye_counter.rb), WebSocket or long-polling: no positions, no acks; a
                   handshake after the first (the broker ended its session) is the only announcement it can get,
                   counted as one with `handshake_is_gap`
    BrowserClient  the broker's client.js in headless Chromium, loaded through the proxy; its `resume` event with
                   recovered: false is an announced gap
    SSEClient      a client over EventSource following docs/PROTOCOL.md: handshake and connects over HTTP, events on
                   GET <mount>/<clientId> (text/event-stream); on every new stream it subscribes again with
                   ext.resume from the position of the last event it got; `recovered: false` is an announced gap

Every wait is bounded (socket timeouts, deadlines); stop() ends a client within seconds.
"""

import http.client
import itertools
import json
import os
import socket
import subprocess
import threading
import time

from faultkit import Tally
from pubsubtest.broker import pubsub_bin
from pubsubtest.process import stop_group
from pubsubtest.websocket import BayeuxWebSocket

HERE = os.path.dirname(os.path.abspath(__file__))
FAYE_COUNTER = os.path.join(HERE, "faye_counter.rb")


def _event_number(message, channel):
    """The n of an event on `channel`, else None."""
    if message.get("channel") != channel or "successful" in message:
        return None
    data = message.get("data")
    return data.get("n") if isinstance(data, dict) else None


class _Process:
    """A subscriber process whose stdout and stderr lines are handed to callbacks by threads. With `is_err`, both
    streams share one pipe and one reader, which keeps the order in which the process wrote them (an event printed
    before a notice is counted before it), and `is_err(line)` tells the notices apart."""

    def __init__(self, cmd, on_out, on_err, is_err=None):
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT if is_err else subprocess.PIPE, start_new_session=True)
        self.err = []
        keep_err = self._keep_err(on_err)
        if is_err:
            self.threads = [threading.Thread(
                target=self._read, args=(self.proc.stdout, lambda line: (keep_err if is_err(line) else on_out)(line)),
                daemon=True)]
        else:
            self.threads = [threading.Thread(target=self._read, args=(self.proc.stdout, on_out), daemon=True),
                            threading.Thread(target=self._read, args=(self.proc.stderr, keep_err), daemon=True)]
        for t in self.threads:
            t.start()

    def _keep_err(self, on_err):
        def handle(line):
            self.err.append(line)
            on_err(line)
        return handle

    @staticmethod
    def _read(stream, handle):
        for raw in iter(stream.readline, b""):
            handle(raw.decode("utf-8", "replace").rstrip("\n"))

    def stop(self):
        stop_group(self.proc, timeout=5)
        for t in self.threads:
            t.join(timeout=2)


class SubscribeCLI:
    def __init__(self, url, channel, transport, name=None):
        self.tally = Tally(name or f"pubsub subscribe ({transport})")
        self.ready = threading.Event()
        cmd = [pubsub_bin(), "subscribe", "--url", url, "--accept-gaps"]
        if transport == "websocket":
            cmd.append("--websocket")
        # One pipe for both: a `recovered: false` notice and the events around it are counted in the order
        # printed (two readers could count an event printed before the notice after it).
        self.process = _Process(cmd + [channel], self._out, self._err, is_err=lambda line: line.startswith("pubsub:"))

    def _out(self, line):
        try:
            data = json.loads(line)
        except ValueError:
            self.tally.note(f"unparsable line {line[:80]!r}")
            return
        if isinstance(data, dict) and isinstance(data.get("n"), int):
            self.tally.deliver(data["n"])

    def _err(self, line):
        if "subscribed to" in line:
            self.ready.set()
        if "recovered: false" in line:
            self.tally.announce(line)
        elif "ended this session" in line:
            self.tally.note("session ended by the broker")

    def wait_ready(self, timeout=15):
        if not self.ready.wait(timeout):
            raise AssertionError(f"pubsub subscribe did not subscribe in {timeout}s: {self.process.err[-10:]}")

    def stop(self):
        self.process.stop()

    def diagnostics(self):
        lines = [line for line in self.process.err if "subscribed to" not in line]
        return [f"exit {self.process.proc.returncode}"] + lines[-8:]


class AckClient:
    """See the module's docstring. `url` is the proxy's http:// URL of the mount."""

    def __init__(self, url, channel, transport, name=None, read_timeout=12.0):
        self.url = url
        self.host, rest = url.split("://", 1)[1].split("/", 1)
        self.path = "/" + rest
        self.ws_url = "ws://" + self.host + self.path
        self.channel = channel
        self.transport = transport
        self.read_timeout = read_timeout
        self.tally = Tally(name or f"ack client ({transport})")
        self.ids = itertools.count(1)
        self.client_id = None
        self.subscribed = False
        self.batch = 0
        self.ack_granted = None
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.errors = []
        self.reconnects = 0
        self.http = None
        self.ws = None
        self.thread = threading.Thread(target=self._run, name=self.tally.name, daemon=True)
        self.thread.start()

    # -- messages --

    def _msg(self, channel, **fields):
        return {"channel": channel, "id": str(next(self.ids)), **fields}

    def _handshake_message(self):
        return self._msg("/meta/handshake", version="1.0", supportedConnectionTypes=[self.transport],
                         ext={"ack": True})

    def _connect_message(self):
        return self._msg("/meta/connect", clientId=self.client_id, connectionType=self.transport,
                         ext={"ack": self.batch})

    def _handle(self, replies):
        """Delivers events, applies the handshake's and the connects' replies. Returns the connect reply (or
        None)."""
        connect = None
        for m in replies if isinstance(replies, list) else [replies]:
            n = _event_number(m, self.channel)
            if n is not None:
                self.tally.deliver(n)
                continue
            channel = m.get("channel")
            if channel == "/meta/handshake":
                if not m.get("successful"):
                    raise RuntimeError(f"handshake refused: {m}")
                self.client_id = m["clientId"]
                self.batch = 0
                self.ack_granted = (m.get("ext") or {}).get("ack") is True
            elif channel == "/meta/subscribe":
                if not m.get("successful"):
                    raise RuntimeError(f"subscribe refused: {m}")
                self.subscribed = True
                self.ready.set()
            elif channel == "/meta/connect":
                connect = m
                if m.get("successful"):
                    ack = (m.get("ext") or {}).get("ack")
                    if isinstance(ack, int) and not isinstance(ack, bool):
                        self.batch = ack
                elif (m.get("advice") or {}).get("reconnect") == "handshake" or str(m.get("error", "")).startswith("401"):
                    self.tally.announce(f"session ended by the broker: {m.get('error')}")
                    self.client_id = None
                    self.batch = 0
        return connect

    # -- long-polling --

    def _post(self, messages, timeout):
        """One request on a connection of its own (closed after it, as the proxy may break any). http.client, not
        pubsubtest.bayeux: stop() closes the connection under a request the proxy holds."""
        self.http = http.client.HTTPConnection(self.host, timeout=timeout)
        try:
            self.http.request("POST", self.path, json.dumps(messages),
                              {"Content-Type": "application/json", "Connection": "close"})
            response = self.http.getresponse()
            body = response.read()
        finally:
            self.http.close()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status} {body[:200]!r}")
        return json.loads(body)

    def _long_polling(self):
        if self.client_id is None:
            self._handle(self._post([self._handshake_message()], 5))
            self.subscribed = False
        if not self.subscribed:
            self._handle(self._post([self._msg("/meta/subscribe", clientId=self.client_id,
                                               subscription=self.channel)], 5))
        while not self.stopping.is_set():
            self._handle(self._post([self._connect_message()], self.read_timeout))
            if self.client_id is None:
                return

    # -- WebSocket --

    def _ws_send(self, messages):
        self.ws.send(messages)

    def _ws_until(self, done):
        while not self.stopping.is_set():
            connect = self._handle(self.ws.recv(self.read_timeout))   # a close frame or a reset raises: reconnect
            if done(connect):
                return connect
        return None

    def _websocket(self):
        self.ws = BayeuxWebSocket(self.ws_url, timeout=self.read_timeout)
        if self.client_id is None:
            self._ws_send([self._handshake_message()])
            self._ws_until(lambda _c: self.client_id is not None)
            self.subscribed = False
        if not self.subscribed:
            self._ws_send([self._msg("/meta/subscribe", clientId=self.client_id, subscription=self.channel)])
            self._ws_until(lambda _c: self.subscribed)
        while not self.stopping.is_set():
            self._ws_send([self._connect_message()])
            self._ws_until(lambda c: c is not None)
            if self.client_id is None:
                return

    # -- the loop --

    def _close(self):
        for conn in (self.http, self.ws):
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001  (closing a broken connection)
                    pass
        self.http = self.ws = None

    def _run(self):
        while not self.stopping.is_set():
            try:
                if self.transport == "websocket":
                    self._websocket()
                else:
                    self._long_polling()
            except Exception as e:  # noqa: BLE001  (a fault: reconnect with the same session)
                if self.stopping.is_set():
                    break
                self.errors.append(f"{type(e).__name__}: {e}"[:200])
                self.reconnects += 1
                self._close()
                self.stopping.wait(0.3)
        self._close()

    def wait_ready(self, timeout=15):
        if not self.ready.wait(timeout):
            raise AssertionError(f"{self.tally.name} did not subscribe in {timeout}s: {self.errors[-5:]}")

    def stop(self):
        self.stopping.set()
        self._close()
        self.thread.join(timeout=self.read_timeout + 5)

    def diagnostics(self):
        return [f"ack granted by the handshake: {self.ack_granted}, last batch {self.batch}, "
                f"{self.reconnects} reconnects"] + self.errors[-4:]


class FayeRuby:
    """faye_counter.rb: Faye's Ruby client subscribed to `channel`. With `handshake_is_gap`, every handshake after
    the first (the broker ended the session: advice handshake) counts as an announced gap: the only way a Faye
    client can be told that it may have missed events."""

    def __init__(self, url, channel, transport, name=None, deadline=80, handshake_is_gap=False):
        self.tally = Tally(name or f"Faye Ruby client ({transport})")
        self.handshake_is_gap = handshake_is_gap
        self.ready = threading.Event()
        self.handshakes = 0
        self.downs = 0
        self.process = _Process(["ruby", FAYE_COUNTER, url, transport, channel, str(deadline)], self._out,
                                lambda line: None)

    def _out(self, line):
        try:
            e = json.loads(line)
        except ValueError:
            return
        kind = e.get("event")
        if kind == "message" and isinstance(e.get("n"), int):
            self.tally.deliver(e["n"])
        elif kind == "subscribed":
            self.ready.set()
        elif kind == "handshake":
            self.handshakes += 1
            if self.handshakes > 1 and self.handshake_is_gap:
                self.tally.announce("a new session: the broker advised a handshake")
        elif kind == "transport" and e.get("state") == "down":
            self.downs += 1

    def wait_ready(self, timeout=20):
        if not self.ready.wait(timeout):
            raise AssertionError(f"the Faye client did not subscribe in {timeout}s: {self.process.err[-10:]}")

    def stop(self):
        self.process.stop()
        self.tally.note(f"{self.handshakes} handshakes, {self.downs} transport:down")

    def diagnostics(self):
        return self.process.err[-5:]


BROWSER_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>fault suite</title>
<script src="{url}/client.js"></script></head><body>
<script>
window.got = [];
window.notes = [];
var client = new Faye.Client({url_json}, {{retry: 1, timeout: 10}});
{setup}
client.bind('transport:down', function () {{ notes.push('down'); }});
client.bind('resume', function (channel, outcome) {{
  notes.push('resume ' + JSON.stringify(outcome));
  if (!outcome.recovered) got.push('GAP');
}});
client.subscribe({channel_json}, function (data) {{ got.push(data && data.n); }})
  .then(function () {{ window.subscribed = true; }}, function (e) {{ window.subscribeError = String(e); }});
</script></body></html>
"""


class BrowserClient:
    """client.js in a Chromium tab (the `page` fixture), loaded from `url` (the proxy); the page is served by the
    test's page server (another origin). A thread takes what the page got every 0.2 s."""

    def __init__(self, page, page_server, url, channel, transport, name=None):
        self.page = page
        self.tally = Tally(name or f"client.js in Chromium ({transport})")
        setup = "client.disable('websocket');" if transport == "long-polling" else ""
        html = BROWSER_PAGE.format(url=url, url_json=json.dumps(url), channel_json=json.dumps(channel), setup=setup)
        page.navigate(page_server.add(f"/fault-{transport}-{time.monotonic_ns()}.html", html))
        self.transport = transport
        self.notes = []
        self.errors = []
        self.stopping = threading.Event()
        self.thread = None

    def wait_ready(self, timeout=20):
        self.page.wait_for("window.subscribed || window.subscribeError", timeout=timeout, what="the subscription")
        error = self.page.evaluate("window.subscribeError || null")
        assert error is None, error
        self.chosen = self.page.evaluate("client.getTransport()")
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _take(self):
        got, notes = self.page.evaluate("[window.got.splice(0), window.notes.splice(0)]")
        for item in got:
            if item == "GAP":
                self.tally.announce("resume: recovered false")
            elif isinstance(item, int):
                self.tally.deliver(item)
        self.notes.extend(notes)

    def _poll(self):
        while not self.stopping.wait(0.2):
            try:
                self._take()
            except Exception as e:  # noqa: BLE001  (kept for the report; the next poll tries again)
                self.errors.append(repr(e)[:200])

    def stop(self):
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=20)
        try:
            self._take()
        except Exception as e:  # noqa: BLE001
            self.errors.append(repr(e)[:200])
        downs = sum(1 for n in self.notes if n == "down")
        self.tally.note(f"transport {getattr(self, 'chosen', '?')}, {downs} transport:down, "
                        f"{len(self.notes) - downs} resumes")

    def diagnostics(self):
        return [n for n in self.notes if n != "down"][-6:] + self.errors[-3:]


class SSEClient:
    """See the module's docstring. `url` is the proxy's http:// URL of the mount."""

    def __init__(self, url, channel, name=None, connect_every=2.0):
        self.host, rest = url.split("://", 1)[1].split("/", 1)
        self.hostname, port = self.host.split(":")
        self.port = int(port)
        self.path = "/" + rest
        self.channel = channel
        self.connect_every = connect_every
        self.tally = Tally(name or "EventSource client")
        self.ids = itertools.count(1)
        self.client_id = None
        self.position = None
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.errors = []
        self.streams = 0
        self.resumes = []
        self.sock = None
        self.thread = threading.Thread(target=self._run, name="sse", daemon=True)
        self.thread.start()

    def _post(self, messages):
        conn = http.client.HTTPConnection(self.host, timeout=8)
        try:
            conn.request("POST", self.path, json.dumps(messages), {"Content-Type": "application/json"})
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status} {body[:200]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def _msg(self, channel, **fields):
        return {"channel": channel, "id": str(next(self.ids)), **fields}

    def _handshake(self):
        reply = self._post([self._msg("/meta/handshake", version="1.0",
                                      supportedConnectionTypes=["eventsource", "long-polling"])])[0]
        if not reply.get("successful"):
            raise RuntimeError(f"handshake refused: {reply}")
        self.client_id = reply["clientId"]
        if self.position is None:
            self.position = (reply.get("ext") or {}).get("position")

    def _subscribe(self):
        fields = {"clientId": self.client_id, "subscription": self.channel}
        if self.position:
            fields["ext"] = {"resume": self.position}
        replies = self._post([self._msg("/meta/subscribe", **fields)])
        reply = next(r for r in replies if r.get("channel") == "/meta/subscribe")
        if not reply.get("successful"):
            raise RuntimeError(f"subscribe refused: {reply}")
        resumed = (reply.get("ext") or {}).get("resume")
        if resumed is not None:
            self.resumes.append(resumed)
            if not resumed.get("recovered"):
                self.tally.announce(f"resume: {resumed}")
        self._events(replies)

    def _connect(self):
        replies = self._post([self._msg("/meta/connect", clientId=self.client_id, connectionType="eventsource")])
        self._events(replies)
        for r in replies:
            if r.get("channel") == "/meta/connect" and not r.get("successful"):
                self.tally.note(f"session ended by the broker: {r.get('error')}")
                self.client_id = None

    def _events(self, messages):
        for m in messages if isinstance(messages, list) else [messages]:
            n = _event_number(m, self.channel)
            if n is not None:
                self.tally.deliver(n)
                position = (m.get("ext") or {}).get("position")
                if position:
                    self.position = position

    def _open_stream(self):
        self.sock = socket.create_connection((self.hostname, self.port), timeout=5)
        self.sock.sendall((f"GET {self.path}/{self.client_id} HTTP/1.1\r\nHost: {self.host}\r\n"
                           "Accept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("stream closed before its head")
            head += chunk
        head, rest = head.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        if " 200 " not in lines[0] + " ":
            raise RuntimeError(f"eventsource: {lines[0]}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        self.raw = bytearray(rest)
        self.text = ""
        self.streams += 1
        self._parse()

    def _read_stream(self):
        """Reads what came on the stream (1 s at most) and hands over the complete `data:` blocks."""
        self.sock.settimeout(1.0)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            return
        if not chunk:
            raise ConnectionError("stream ended")
        self.raw += chunk
        self._parse()

    def _parse(self):
        if self.chunked:
            while True:
                end = self.raw.find(b"\r\n")
                if end < 0:
                    break
                size = int(bytes(self.raw[:end]).split(b";")[0], 16)
                if size == 0:
                    raise ConnectionError("stream ended (last chunk)")
                if len(self.raw) < end + 2 + size + 2:
                    break
                self.text += bytes(self.raw[end + 2:end + 2 + size]).decode()
                del self.raw[:end + 2 + size + 2]
        else:
            self.text += bytes(self.raw).decode()
            self.raw.clear()
        # Lines end with CRLF, LF or CR (a CR at the end may be half of a CRLF: kept for the next read).
        keep = "\r" if self.text.endswith("\r") else ""
        self.text = self.text[:len(self.text) - len(keep)].replace("\r\n", "\n").replace("\r", "\n") + keep
        while True:
            cut = self.text.find("\n\n")
            if cut < 0:
                break
            block, self.text = self.text[:cut], self.text[cut + 2:]
            data = "".join(line[len("data: "):] for line in block.split("\n") if line.startswith("data: "))
            if data:
                self._events(json.loads(data))

    def _run(self):
        while not self.stopping.is_set():
            try:
                if self.client_id is None:
                    self._handshake()
                # Subscribed (on a new stream of the same session: again, with ext.resume, docs/PROTOCOL.md) before
                # the stream opens, so that the range it recovers goes out on the stream before anything newer.
                self._subscribe()
                self._open_stream()
                self._connect()
                self.ready.set()
                next_connect = time.monotonic() + self.connect_every
                while not self.stopping.is_set() and self.client_id is not None:
                    self._read_stream()
                    if time.monotonic() >= next_connect:
                        self._connect()
                        next_connect = time.monotonic() + self.connect_every
            except Exception as e:  # noqa: BLE001  (a fault: a new stream)
                if self.stopping.is_set():
                    break
                self.errors.append(f"{type(e).__name__}: {e}"[:200])
                self.stopping.wait(0.3)
            finally:
                if self.sock is not None:
                    self.sock.close()
                    self.sock = None

    def wait_ready(self, timeout=15):
        if not self.ready.wait(timeout):
            raise AssertionError(f"the EventSource client did not subscribe in {timeout}s: {self.errors[-5:]}")

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=15)
        self.tally.note(f"{self.streams} streams, resumes {self.resumes[-6:]}")

    def diagnostics(self):
        return self.errors[-4:]
