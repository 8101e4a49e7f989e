"""The soak driver of Tests/soak: one `pubsub serve` on an engine configuration, N clients of one transport, each
woken by publishes many times, and the broker's heap (from its /metrics), resident memory and descriptors (from
/proc) read before, during and after.

    with Backends() as backends:                       # Redis, Redis Cluster, Sentinel: started when first asked
        result = soak(backends, "cluster-3", "long-polling", clients=50, warmup=1000, connects=10000)
        print(result.heap_slope, result.slope, result.fds_baseline, result.fds_after)

What one client does, over and over (`session_connects` times per session, then a new session on a new socket):
handshake, subscribe to a channel of its own (`/s<i>/x`: a first segment of its own, so that with `--redis-shards`
the clients' channels fall on every shard), then `/meta/connect` after `/meta/connect`, each one answered by the
publish that the publisher sends to its channel once the connect has been sent (and had `park_delay` to be
parked); then unsubscribe, disconnect, close. A "connect" below is one such round: a connect sent and the
client's publish delivered. Clients and publisher are asyncio tasks of one thread (the broker, not the driver,
sets the pace).

Transports, over asyncio streams (keep-alive HTTP/1.1, and a small RFC 6455 client):
    long-polling       POST /faye, the connect held until the publish
    callback-polling   JSON-P: GET /faye?message=…&jsonp=cb, the connect held the same way
    websocket          one WebSocket per session; after each delivery the client sends its next connect, which
                       answers the one before (the broker holds one connect per client)
    eventsource        GET /faye/<clientId> (text/event-stream) per session, the deliveries on it; each round a
                       POST of the `eventsource` connect (answered at once) before the publish

The memory figures, read when `warmup` connects are done, `SAMPLES - 2` times during the next `connects`, and at
the end: the heap in use, `pubsub_heap_allocated_bytes` scraped from the broker's /metrics (what malloc handed out
and did not get back, to the byte; the broker runs with glibc's tcache off, see SoakBroker), and VmRSS from /proc.
Each reading is taken in the same state: the publisher stops, every client's connect waits for its publish (none
is mid-handshake or mid-reply), the broker is left SETTLE seconds, then the reading, then the publishes go on.
Read so, the heap of a broker that keeps nothing is flat to within a KiB, where readings taken on the fly moved by
±20-90 KiB with what was in flight.

`heap_slope`, the figure a bound applies to, is the least-squares slope through those readings in bytes per
connect of the heap less what the Redis engines keep by design for each publish (acknowledged_positions_bytes():
with Sentinel or a Redis Cluster, 16 bytes per publish in doubling steps, up to 2 MiB per engine);
`heap_raw_slope` the same without taking it off, `positions_slope` that part alone, `heap_per_connect` the
difference of the two ends over the connects between them. `slope` and `bytes_per_connect` are the same of VmRSS,
which moves in allocator steps of ~132 KiB and so says little about a few dozen bytes per connect. A binary that
does not serve the heap gauge (one built before it) gets `heap_slope` None. The descriptors: /proc/<pid>/fd
before any client, and again once every client has disconnected and closed its sockets (waited for up to
`fd_wait` seconds).

`python3 Tests/soak/measure_shards.py` runs it against several binaries in one session (docs/BENCHMARKS-cluster.md).
"""

import asyncio
import collections
import json
import os
import re
import shutil
import time
import urllib.parse

from pubsubtest.broker import Broker
from pubsubtest.redis import RedisCluster, RedisServer, Sentinel, wait_ready
from pubsubtest.websocket import CLOSE, PING, PONG, TEXT, frame, upgrade_headers

KiB = 1 << 10
ROUND_TIMEOUT = 20  # seconds a connect may wait for its publish before the soak fails
SAMPLES = 12  # memory readings from the end of the warm-up to the end (both included)
SETTLE = 0.05  # seconds the broker is left to settle, every client waiting, before a reading
ENGINES = ("memory", "redis", "cluster-1", "cluster-3", "sentinel")
TRANSPORTS = ("long-polling", "websocket", "callback-polling", "eventsource")
FIGURES = []  # the Result of every soak run in this process (Tests/soak/conftest.py prints them: table())
CONNECTION_TYPES = ["long-polling", "callback-polling", "websocket", "eventsource"]


# ---------------------------------------------------------------- the broker process, from /proc

def rss(pid):
    """Resident memory now, in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


HEAP_METRIC = re.compile(rb"^pubsub_heap_allocated_bytes ([0-9.e+]+)$", re.M)


async def heap(port):
    """The broker's heap in use now (`pubsub_heap_allocated_bytes` on its /metrics), in bytes; None when the
    binary does not serve it. One connection per reading, closed at once."""
    conn = await HttpConn(port).open()
    try:
        status, body = await conn.request("GET", "/metrics", headers="Connection: close\r\n")
    finally:
        conn.close()
    if status != 200:
        raise AssertionError(f"/metrics: HTTP {status}")
    m = HEAP_METRIC.search(body)
    return int(float(m.group(1))) if m else None


# ---------------------------------------------------------------- what the Redis engine keeps per publish, by design

ACKNOWLEDGED_KEPT = 100_000  # RedisEngine.publish: the newest acknowledged positions kept (Sentinel, Cluster)


def shard_of(channel, shards):
    """ShardMap.shard(ofChannel:) with one segment: FNV-1a (64 bits) of the first segment, modulo the shards."""
    if shards == 1:
        return 0
    key = "/" + channel.split("/")[1]
    h = 0xcbf29ce484222325
    for byte in key.encode():
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h % shards


def acknowledged_positions_bytes(engine, by_channel):
    """The heap that the Redis engines of a broker hold for the positions of their acknowledged publishes, after
    `by_channel` publishes (channel -> count): with Sentinel or a Redis Cluster each engine (each shard) keeps the
    sequence of each of its publishes, the newest ACKNOWLEDGED_KEPT of them, to count at a failover those the new
    master lacks. They sit in an NIO CircularBuffer<UInt64> (slots of 16 bytes: UInt64?) that starts with 64 and
    doubles when full, so 16 bytes per publish on average, in steps that double, and at most 2 MiB per engine
    (131,072 slots) once 100,000 publishes were made. One Redis and memory keep none: 0."""
    if engine not in ("sentinel", "cluster-1", "cluster-3"):
        return 0
    shards = 3 if engine == "cluster-3" else 1
    per_shard = collections.Counter()
    for channel, n in by_channel.items():
        per_shard[shard_of(channel, shards)] += n
    total = 0
    for n in per_shard.values():
        slots = 64
        while slots <= min(n, ACKNOWLEDGED_KEPT):
            slots *= 2
        total += 16 * slots
    return total


# ---------------------------------------------------------------- Redis behind the engines

class Backends:
    """The Redis servers the engine configurations need, each started the first time a cell asks for it and
    shared by every later cell (each cell's broker uses a key prefix of its own): one redis-server, a Redis
    Cluster of three masters without replicas, and a master watched by one sentinel (quorum 1)."""

    def __init__(self):
        self.redis = None
        self.cluster = None
        self.sentinel_master = None
        self.sentinel = None
        self.cells = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    @staticmethod
    def available():
        """None if redis-server and redis-cli are there, else why not."""
        missing = [b for b in ("redis-server", "redis-cli") if not shutil.which(b)]
        return f"{', '.join(missing)} not installed (scripts/install-test-deps)" if missing else None

    def args(self, engine):
        """The `pubsub serve` flags of an engine configuration, starting what it needs."""
        self.cells += 1
        prefix = ["--redis-prefix", f"soak{self.cells}:"]
        if engine == "memory":
            return []
        if engine == "redis":
            if self.redis is None:
                self.redis = RedisServer()
                self.redis.start()
            return ["--engine", "redis", "--redis-url", self.redis.url] + prefix
        if engine in ("cluster-1", "cluster-3"):
            if self.cluster is None:
                cluster = RedisCluster(masters=3, replicas=0)
                cluster.start()
                self.cluster = cluster
            return ["--engine", "redis", "--redis-cluster", self.cluster.seeds,
                    "--redis-shards", engine[-1]] + prefix
        if engine == "sentinel":
            if self.sentinel is None:
                self.sentinel_master = RedisServer()
                self.sentinel_master.start()
                sentinel = Sentinel(self.sentinel_master, quorum=1)
                sentinel.start()
                self.sentinel = sentinel
            return ["--engine", "redis", "--redis-sentinels", f"127.0.0.1:{self.sentinel.port}",
                    "--redis-master-name", "mymaster"] + prefix
        raise ValueError(f"unknown engine configuration {engine!r} (want one of {ENGINES})")

    def stop(self):
        for server in (self.sentinel, self.sentinel_master, self.redis, self.cluster):
            if server is not None:
                server.stop()
        self.redis = self.cluster = self.sentinel_master = self.sentinel = None


class SoakBroker(Broker):
    """`pubsub serve` from a binary of our choice (the default is pubsub_bin(): $PUBSUB_BIN), with glibc's
    per-thread cache of freed chunks (tcache) off: the heap figure then counts the chunks the broker holds, and not
    also up to 7 freed chunks of each size up to 1 KiB that each thread keeps for its next malloc. Those caches
    fill over minutes where one thread frees what another allocated (the Redis engines' threads and the event
    loops), ~100-130 KiB over the 3-shard cells' threads: 40-90 bytes per connect in a soak's window that are the
    allocator's and bounded, not the broker's (the 3-shard WebSocket cell: 86 bytes per connect with tcache, 6
    without; heaptrack finds the same live heap after 1,000 and 3,000 connects)."""

    TUNABLES = "glibc.malloc.tcache_count=0"

    def __init__(self, binary=None, **kw):
        super().__init__(**kw)
        self.binary = binary

    def _command(self):
        cmd, cwd = super()._command()
        if self.binary:
            cmd[0] = self.binary
        tunables = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), self.TUNABLES]))
        return ["env", f"GLIBC_TUNABLES={tunables}"] + cmd, cwd  # env execs the broker: same pid


# ---------------------------------------------------------------- HTTP/1.1 and WebSocket over asyncio streams

class HttpConn:
    """One keep-alive HTTP/1.1 connection (asyncio streams)."""

    def __init__(self, port):
        self.port = port
        self.reader = self.writer = None

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    def send(self, method, path, body=b"", headers=""):
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n{headers}"
        if method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)

    async def read_head(self):
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(lines[0].split(" ")[1]), headers

    async def read_chunk(self):
        """One chunk of a chunked body (b"" for the last one)."""
        size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def read_response(self):
        status, headers = await self.read_head()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while chunk := await self.read_chunk():
                body += chunk
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, body

    async def request(self, method, path, body=b"", headers=""):
        self.send(method, path, body, headers)
        return await self.read_response()

    def close(self):
        if self.writer is not None:
            self.writer.close()


class WsClosed(EOFError):
    """The broker closed the WebSocket (a close frame): its code and reason."""

    def __init__(self, code, reason):
        super().__init__(f"websocket closed by the broker: {code} {reason!r}")
        self.code = code


class WsConn(HttpConn):
    """A WebSocket client (RFC 6455, text frames) over asyncio streams: a ping is answered, a close is EOF."""

    async def open(self):
        await super().open()
        self.send("GET", "/faye", headers=upgrade_headers())
        status, _ = await self.read_head()
        if status != 101:
            raise AssertionError(f"websocket upgrade: HTTP {status}")
        return self

    @staticmethod
    def _frame(payload, opcode):
        return frame(opcode, payload, mask=b"\0\0\0\0")  # masked with a key of zeros: the payload as it is

    def send_text(self, text):
        self.writer.write(self._frame(text.encode(), TEXT))

    async def recv_text(self):
        message = b""
        while True:
            b0, b1 = await self.reader.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(await self.reader.readexactly(2), "big")
            elif n == 127:
                n = int.from_bytes(await self.reader.readexactly(8), "big")
            payload = await self.reader.readexactly(n)
            opcode = b0 & 0x0F
            if opcode == PING:
                self.writer.write(self._frame(payload, PONG))
            elif opcode == CLOSE:
                raise WsClosed(int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None, payload[2:])
            elif opcode in (0x0, 0x1, 0x2):
                message += payload
                if b0 & 0x80:
                    return message.decode()


class EventStream(HttpConn):
    """GET /faye/<clientId> with Accept: text/event-stream; next_messages() reads the next `data:` block."""

    def __init__(self, port, cid):
        super().__init__(port)
        self.cid = cid
        self.text = ""

    async def open(self):
        await super().open()
        self.send("GET", f"/faye/{self.cid}", headers="Accept: text/event-stream\r\nCache-Control: no-cache\r\n")
        status, headers = await self.read_head()
        if status != 200:
            raise AssertionError(f"eventsource: HTTP {status}")
        self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        return self

    async def next_messages(self):
        while True:
            m = re.search(r"\r\n\r\n|\n\n", self.text)
            if m:
                block, self.text = self.text[:m.start()], self.text[m.end():]
                data = [line[len("data: "):] for line in block.splitlines() if line.startswith("data: ")]
                if data:
                    return json.loads("".join(data))
                continue
            if self.chunked:
                chunk = await self.read_chunk()
            else:
                chunk = await self.reader.read(65536)
            if not chunk:
                raise EOFError("eventsource stream ended")
            self.text += chunk.decode()


# ---------------------------------------------------------------- the publisher

class Publisher:
    """Publishes one event to each channel asked for, `park_delay` after it was asked (so that the connect sent
    just before has been parked), in one POST per batch, one batch at a time, on one keep-alive connection.
    While `flowing` is clear it publishes nothing: every client ends up waiting for its publish (`waiting`)."""

    def __init__(self, port, park_delay):
        self.port, self.park_delay = port, park_delay
        self.asked = asyncio.Queue()
        self.holding = 0  # an ask taken from the queue, not yet published
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.errors = []
        self.published = 0
        self.by_channel = collections.Counter()  # publishes sent, by channel (acknowledged_positions_bytes())

    def ask(self, channel):
        self.asked.put_nowait((time.monotonic(), channel))

    @property
    def waiting(self):
        """Clients whose publish has been asked for and not sent."""
        return self.asked.qsize() + self.holding

    async def run(self):
        conn = await HttpConn(self.port).open()
        try:
            while True:
                first, channel = await self.asked.get()
                self.holding = 1
                await self.flowing.wait()
                wait = first + self.park_delay - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                batch = [channel]
                while not self.asked.empty():
                    batch.append(self.asked.get_nowait()[1])
                self.holding = 0
                self.published += len(batch)
                self.by_channel.update(batch)
                body = json.dumps([{"channel": ch, "data": {"n": self.published}} for ch in batch]).encode()
                status, reply = await conn.request("POST", "/faye", body)
                if status != 200 or not all(m.get("successful") for m in json.loads(reply)):
                    self.errors.append(f"publish: HTTP {status} {reply[:300]!r}")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (reported by the soak)
            self.errors.append(f"publisher: {e!r}")
        finally:
            conn.close()


# ---------------------------------------------------------------- the clients

class Client:
    """One client of a transport: sessions one after another until told to stop (see the module's docstring)."""

    def __init__(self, index, port, transport, publisher, tally, session_connects):
        self.index, self.port, self.transport = index, port, transport
        self.publisher, self.tally, self.session_connects = publisher, tally, session_connects
        self.channel = f"/s{index}/x"
        self.stopping = False
        self.errors = []
        self.sessions = 0
        self.http = self.ws = self.stream = None
        self.msg_id = 0
        self.inbox = []

    def _message(self, channel, **fields):
        self.msg_id += 1
        return {"channel": channel, "id": str(self.msg_id), **fields}

    def _send_http(self, messages):
        text = json.dumps(messages)
        if self.transport == "callback-polling":
            self.http.send("GET", "/faye?" + urllib.parse.urlencode({"message": text, "jsonp": "cb"}))
        else:
            self.http.send("POST", "/faye", text.encode())

    async def _read_http(self):
        status, body = await self.http.read_response()
        text = body.decode()
        if self.transport == "callback-polling":
            if status != 200 or not text.startswith("/**/cb("):
                raise AssertionError(f"JSON-P: HTTP {status} {text[:300]!r}")
            text = text[len("/**/cb("):-2]
        elif status != 200:
            raise AssertionError(f"HTTP {status} {text[:300]!r}")
        return json.loads(text)

    async def _ws_until(self, done):
        """Reads WebSocket frames until `done(messages so far)`; returns and forgets them."""
        while not done(self.inbox):
            self.inbox.extend(json.loads(await self.ws.recv_text()))
        got, self.inbox = self.inbox, []
        return got

    async def _request(self, messages):
        """A request whose replies come at once (handshake, subscribe, unsubscribe, disconnect)."""
        if self.ws is None:
            self._send_http(messages)
            replies = await self._read_http()
        else:
            self.ws.send_text(json.dumps(messages))
            ids = {m["id"] for m in messages}
            replies = [m for m in await self._ws_until(lambda ms: ids <= {m.get("id") for m in ms})
                       if m.get("id") in ids]
        meta = [r for r in replies if r.get("channel", "").startswith("/meta/")]
        if not meta or not all(r.get("successful") for r in meta):
            raise AssertionError(f"{messages[0]['channel']}: {replies}")
        return meta

    async def _session(self):
        if self.transport == "websocket":
            self.ws = await WsConn(self.port).open()
        else:
            self.http = await HttpConn(self.port).open()
        try:
            self.sessions += 1
            ctype = self.transport
            cid = (await self._request([self._message(
                "/meta/handshake", version="1.0", supportedConnectionTypes=CONNECTION_TYPES)]))[0]["clientId"]
            await self._request([self._message("/meta/subscribe", clientId=cid, subscription=self.channel)])
            if self.transport == "eventsource":
                self.stream = await EventStream(self.port, cid).open()
            elif self.transport == "websocket":
                # The first connect is answered at once; from then on one connect is held at a time.
                await self._request([self._message("/meta/connect", clientId=cid, connectionType=ctype)])
                self.ws.send_text(json.dumps([self._message("/meta/connect", clientId=cid, connectionType=ctype)]))
            done = 0
            while done < self.session_connects and not self.stopping:
                await asyncio.wait_for(self._round(cid, ctype), ROUND_TIMEOUT)
                done += 1
                self.tally.connects += 1
            unsubscribe = self._message("/meta/unsubscribe", clientId=cid, subscription=self.channel)
            if self.ws is not None:
                # The unsubscribe's reply comes after the answer of the connect still held: skip to it.
                self.ws.send_text(json.dumps([unsubscribe]))
                got = await self._ws_until(lambda ms: any(m.get("id") == unsubscribe["id"] for m in ms))
                if not all(m.get("successful") for m in got if m.get("channel") == "/meta/unsubscribe"):
                    raise AssertionError(f"unsubscribe: {got}")
                # The disconnect's reply comes before the broker closes the socket, on every engine.
                await self._request([self._message("/meta/disconnect", clientId=cid)])
            else:
                await self._request([unsubscribe])
                await self._request([self._message("/meta/disconnect", clientId=cid)])
        finally:
            for conn in (self.ws, self.stream, self.http):
                if conn is not None:
                    conn.close()
            self.http = self.ws = self.stream = None

    async def _round(self, cid, ctype):
        """One connect, woken by this client's publish."""
        if self.transport == "websocket":
            self.publisher.ask(self.channel)
            await self._ws_until(lambda ms: any(m.get("channel") == self.channel for m in ms))
            # The next connect answers the one held (that answer is read with a later frame).
            self.ws.send_text(json.dumps([self._message("/meta/connect", clientId=cid, connectionType=ctype)]))
            return
        if self.transport == "eventsource":
            await self._request([self._message("/meta/connect", clientId=cid, connectionType=ctype)])
            self.publisher.ask(self.channel)
            while not any(m.get("channel") == self.channel for m in await self.stream.next_messages()):
                pass
            return
        asked = False
        while True:
            # Long-polling and JSON-P: the connect is held until the publish answers it.
            self._send_http([self._message("/meta/connect", clientId=cid, connectionType=ctype)])
            if not asked:
                self.publisher.ask(self.channel)
                asked = True
            replies = await self._read_http()
            connect = [r for r in replies if r.get("channel") == "/meta/connect"]
            if not connect or not connect[0].get("successful"):
                raise AssertionError(f"connect: {replies}")
            if any(r.get("channel") == self.channel for r in replies):
                return

    async def run(self):
        try:
            while not self.stopping:
                await self._session()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (reported by the soak)
            self.errors.append(f"client {self.index} ({self.transport}): {e!r}")


class Tally:
    connects = 0


# ---------------------------------------------------------------- one soak

def least_squares_slope(points):
    """The slope of the least-squares line through (x, y) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


class Result:
    """What one soak measured (see soak()). `samples`: (connects, VmRSS, heap in use or None, the heap that the
    engines hold for acknowledged positions by design: acknowledged_positions_bytes()) readings."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    @property
    def rss_warm(self):
        return self.samples[0][1]

    @property
    def rss_end(self):
        return self.samples[-1][1]

    @property
    def has_heap(self):
        return all(h is not None for _, _, h, _ in self.samples)

    @property
    def bytes_per_connect(self):
        """RSS growth from the end of the warm-up to the end, per connect."""
        return (self.rss_end - self.rss_warm) / self.measured

    @property
    def slope(self):
        """Least-squares slope of RSS over connects through the samples of the measured part, in bytes/connect
        (less moved by one allocator step at either end than bytes_per_connect)."""
        return least_squares_slope([(c, r) for c, r, _, _ in self.samples])

    @property
    def positions_slope(self):
        """Least-squares slope of the heap kept for acknowledged positions (acknowledged_positions_bytes())."""
        return least_squares_slope([(c, a) for c, _, _, a in self.samples])

    @property
    def heap_raw_slope(self):
        """Least-squares slope of the heap in use over connects, in bytes/connect (None without it)."""
        return least_squares_slope([(c, h) for c, _, h, _ in self.samples]) if self.has_heap else None

    @property
    def heap_slope(self):
        """The same, less the heap kept for acknowledged positions: what the bound applies to (None without it)."""
        return least_squares_slope([(c, h - a) for c, _, h, a in self.samples]) if self.has_heap else None

    @property
    def heap_per_connect(self):
        """Growth of the heap in use less the acknowledged positions, from the end of the warm-up to the end, per
        connect (None without it)."""
        if not self.has_heap:
            return None
        (_, _, h0, a0), (_, _, h1, a1) = self.samples[0], self.samples[-1]
        return ((h1 - a1) - (h0 - a0)) / self.measured

    def curve(self):
        """The samples as `connects:+KiB` of RSS over the RSS after warm-up."""
        return " ".join(f"{c}:+{(r - self.rss_warm) // KiB}" for c, r, _, _ in self.samples)

    def heap_curve(self):
        """The samples as `connects:KiB` of heap in use less acknowledged positions, over the same after warm-up
        ("" without it)."""
        if not self.has_heap:
            return ""
        base = self.samples[0][2] - self.samples[0][3]
        return " ".join(f"{c}:{(h - a - base) / KiB:+.1f}" for c, _, h, a in self.samples)

    def describe(self):
        if self.has_heap:
            h0, h1 = self.samples[0][2], self.samples[-1][2]
            a0, a1 = self.samples[0][3], self.samples[-1][3]
            positions = (f", of which acknowledged positions {a0 / KiB:.0f} -> {a1 / KiB:.0f} KiB, "
                         f"{self.positions_slope:.1f} bytes/connect; heap without them {self.heap_slope:.1f} "
                         f"bytes/connect (slope; {self.heap_per_connect:.1f} end to end)") if a1 else ""
            heap = (f"heap {self.heap_raw_slope:.1f} bytes/connect (slope; {self.heap_start / 2**20:.2f} MiB at start, "
                    f"{h0 / 2**20:.2f} after {self.warmup} warm-up connects, {h1 / 2**20:.2f} after {self.measured} "
                    f"more{positions}); ")
        else:
            heap = "heap: not served by this binary; "
        return (f"{self.engine}/{self.transport}: {heap}"
                f"RSS {self.slope:.1f} bytes/connect (slope; {self.bytes_per_connect:.1f} end to end; "
                f"{self.rss_start / 2**20:.1f} MiB at start, {self.rss_warm / 2**20:.1f} after warm-up, "
                f"{self.rss_end / 2**20:.1f} at the end); {self.seconds:.1f} s, "
                f"{self.measured / self.seconds:.0f} connects/s; fds {self.fds_baseline} before the clients, "
                f"{self.fds_busy} with them, {self.fds_after} after they left; {self.sessions} sessions")


def soak(backends, engine, transport, *, clients=50, warmup=1000, connects=10000, session_connects=10**9,
         park_delay=0.003, binary=None, extra_args=(), fd_wait=10.0, progress=None):
    """Runs one soak (see the module's docstring) and returns its Result; raises with the broker's log if a
    client or the publisher failed."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r} (want one of {TRANSPORTS})")
    args = backends.args(engine)
    # A history of 100 events: the memory engine's is full within the warm-up (the default, 1000, would still be
    # filling while RSS is measured). Connects held up to 30 s: only the publishes answer them.
    b = SoakBroker(binary=binary, timeout=30, extra_args=args + [
        "--history-size", "100", "--log-level", "warning"] + list(extra_args))
    b.start()
    try:
        if engine != "memory":
            wait_ready(b)
        return asyncio.run(_soak(b, engine, transport, clients, warmup, connects, session_connects, park_delay,
                                 fd_wait, progress))
    finally:
        b.stop()


async def _soak(b, engine, transport, clients, warmup, connects, session_connects, park_delay, fd_wait, progress):
    pid = b.pid
    await asyncio.sleep(0.5)
    fds_baseline, rss_start = open_fds(pid), rss(pid)
    heap_start = await heap(b.port)
    publisher = Publisher(b.port, park_delay)
    tally = Tally()
    workers = [Client(i, b.port, transport, publisher, tally, session_connects) for i in range(clients)]
    publishing = asyncio.create_task(publisher.run())
    running = [asyncio.create_task(w.run()) for w in workers]

    def failed():
        return [e for w in workers for e in w.errors] + publisher.errors

    def fail(what):
        return AssertionError(f"{engine}/{transport}: {what}: {failed()[:5]} (broker alive: {b.alive()})\n"
                              f"{b.log()[-3000:]}")

    samples = []  # (connects, RSS, heap, acknowledged positions) every (SAMPLES - 1)th of the measured connects

    async def sample():
        # Read in the same state each time: the publisher stops, every client's connect waits for its publish
        # (none is mid-handshake, mid-request or mid-reply), the broker finishes what the last replies started.
        publisher.flowing.clear()
        try:
            while publisher.waiting < clients:
                if failed() or not b.alive() or all(t.done() for t in running):
                    raise fail(f"after {tally.connects} connects, waiting for every client to wait")
                await asyncio.sleep(0.005)
            await asyncio.sleep(SETTLE)
            n = tally.connects
            samples.append((n, rss(pid), await heap(b.port),
                            acknowledged_positions_bytes(engine, publisher.by_channel)))
        finally:
            publisher.flowing.set()
        return n

    async def reach(n, sample_every=None):
        while tally.connects < n:
            if failed() or not b.alive() or all(t.done() for t in running):
                raise fail(f"after {tally.connects} connects")
            if sample_every and tally.connects >= samples[-1][0] + sample_every:
                await sample()
            await asyncio.sleep(0.02)
        return tally.connects

    try:
        await reach(warmup)
        fds_busy, t0 = open_fds(pid), time.monotonic()
        warm = await sample()
        if progress:
            progress(f"{engine}/{transport}: warm-up done, {warm} connects, RSS {samples[0][1] / 2**20:.1f} MiB")
        await reach(warmup + connects, sample_every=max(1, connects // (SAMPLES - 1)))
        end, t1 = await sample(), time.monotonic()
        for w in workers:
            w.stopping = True
        # Each client ends its round, unsubscribes, disconnects and closes its sockets.
        done, pending = await asyncio.wait(running, timeout=ROUND_TIMEOUT + 5)
        if failed() or pending:
            raise fail(f"{len(pending)} clients did not leave")
    finally:
        for t in running + [publishing]:
            t.cancel()
        await asyncio.gather(*running, publishing, return_exceptions=True)
    deadline = time.monotonic() + fd_wait
    while open_fds(pid) > fds_baseline and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    result = Result(engine=engine, transport=transport, warmup=warm, measured=end - warm, seconds=t1 - t0,
                    rss_start=rss_start, heap_start=heap_start, fds_baseline=fds_baseline,
                    fds_busy=fds_busy, fds_after=open_fds(pid), sessions=sum(w.sessions for w in workers),
                    samples=samples,
                    binary=b._command()[0][2], log=b.log())
    FIGURES.append(result)
    return result


def table(results):
    """The figures of several soaks as a Markdown table (bytes per connect after the warm-up), then each one's
    description and curves. "heap" is the heap in use less the acknowledged positions the Redis engines keep by
    design (their own column)."""
    def num(x):
        return "—" if x is None else f"{x:.1f}"

    lines = ["| cell | heap slope | heap end − warm-up | bound | acknowledged positions | RSS slope "
             "| RSS end − warm-up | connects | s | fds before → after |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r.engine}/{r.transport} | {num(r.heap_slope)} | {num(r.heap_per_connect)} "
                     f"| {getattr(r, 'bound', '')} | {r.positions_slope:.1f} | {r.slope:.1f} "
                     f"| {r.bytes_per_connect:.1f} | {r.measured} | {r.seconds:.0f} "
                     f"| {r.fds_baseline} → {r.fds_after} |")
    for r in results:
        lines.append(r.describe())
        if r.has_heap:
            lines.append(f"    heap less acknowledged positions after warm-up, KiB by connects: {r.heap_curve()}")
        lines.append(f"    RSS after warm-up +KiB by connects: {r.curve()}")
    return "\n".join(lines)
