"""The counting harness of the fault suite: a publisher of numbered events, a tally per subscriber, a schedule of
faults played on fault proxies, and the figures of each run.

    publisher = Publisher(broker.url, CHANNEL)           # straight to the broker, never through a proxy
    client = SomeClient(proxy.url, CHANNEL, ...)       # every subscriber goes through a proxy
    results = play([client], [proxy], publisher)        # publish, break the network, stop, wait, count
    assert results[0].silent == []

What is counted, per client, once the publisher stopped and the client is quiet (no new delivery for QUIET
seconds, or every acknowledged event delivered; bounded by SETTLE_DEADLINE):
    acknowledged  events whose publish got a successful reply (only they are promised)
    delivered     distinct events the client's application got
    silent        acknowledged events never delivered and not inside an announced gap
    announced     acknowledged events never delivered, inside a gap the client was told about (a resume answered
                  `recovered: false`, a session the broker ended: each client says which it saw)
    duplicates    deliveries of an event already delivered
    out_of_order  first deliveries of an acknowledged event lower than one delivered before it
An announcement covers the events between the highest one delivered before it and the lowest one delivered after
it. Not a timed test: nothing here asserts how long anything took.
"""

import http.client
import json
import threading
import time

from pubsubtest.wait import wait_until

CHANNEL = "/fault/events"
RATE = 30            # events per second
WARMUP = 1.0         # seconds of publishing before the first fault
TAIL = 1.5           # seconds of publishing after the last fault
QUIET = 2.0          # seconds without a new delivery after which a client is taken to have caught up
SETTLE_DEADLINE = 25.0
FIGURES = []         # every Result of this run (conftest.py prints them at the end)

# The default schedule: (fault, seconds, ending), played one after another with GAP seconds of calm after each.
#   stall     the client side sees nothing (the broker's writes pile up in the kernel), then `ending`
#   stall+    the same, and what the client sends is not read either
#   blackhole bytes swallowed both ways, sockets open, then `ending`
SCHEDULE = (("stall", 2.0, "reset"), ("blackhole", 1.0, "drop"), ("stall+", 1.5, "reset"), ("stall", 1.0, "drop"))
GAP = 1.0


class Publisher:
    """Publishes {"n": first}, {"n": first + 1}, … on `channel` at `rate` per second, one HTTP POST each, and keeps
    the numbers whose reply was successful. Publishers to one channel are told apart by `first` (each numbers
    below `first + SPAN`)."""

    SPAN = 1_000_000

    def __init__(self, url, channel=CHANNEL, rate=RATE, timeout=5.0, first=1):
        self.url = url
        self.first = first
        self.host, rest = url.split("://", 1)[1].split("/", 1)
        self.path = "/" + rest
        self.channel = channel
        self.rate = rate
        self.timeout = timeout
        self.acked = set()
        self.sent = 0
        self.errors = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=self.timeout + 5)

    def _run(self):
        started = time.monotonic()
        n = self.first - 1
        while not self._stop.is_set():
            n += 1
            due = started + (n - self.first) / self.rate
            delay = due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            body = json.dumps([{"channel": self.channel, "data": {"n": n}}])
            self.sent = n - self.first + 1
            # One connection per publish: a server that closes an idle keep-alive connection (puma) would
            # otherwise fail the next publish, and retrying one that may have been handled is not allowed here.
            conn = http.client.HTTPConnection(self.host, timeout=self.timeout)
            try:
                conn.request("POST", self.path, body, {"Content-Type": "application/json", "Connection": "close"})
                response = conn.getresponse()
                text = response.read()
                if response.status == 200 and all(m.get("successful") for m in json.loads(text)):
                    self.acked.add(n)
                else:
                    self.errors.append(f"{n}: HTTP {response.status} {text[:200]!r}")
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.errors.append(f"{n}: {e!r}")
            finally:
                conn.close()


    def owns(self, n):
        return self.first <= n < self.first + self.SPAN


class Tally:
    """What one client's application got: each event's number in arrival order, and the gaps it was told of."""

    def __init__(self, name):
        self.name = name
        self.lock = threading.Lock()
        self.arrivals = []       # n, in the order the application got them
        self.announcements = []  # (index into arrivals when it came, what was said)
        self.notes = []          # what else the client saw (reconnects, handshakes), for the summary
        self.last_arrival = time.monotonic()

    def deliver(self, n):
        with self.lock:
            self.arrivals.append(n)
            self.last_arrival = time.monotonic()

    def announce(self, what):
        with self.lock:
            self.announcements.append((len(self.arrivals), what))

    def note(self, what):
        with self.lock:
            self.notes.append(what)

    def snapshot(self):
        with self.lock:
            return list(self.arrivals), list(self.announcements), list(self.notes), self.last_arrival


class Result:
    def __init__(self, name, acked, arrivals, announcements, notes):
        self.name = name
        self.acknowledged = len(acked)
        distinct = set(arrivals)
        self.delivered = len(distinct & acked)
        self.duplicates = len(arrivals) - len(distinct)
        # Order is promised among acknowledged events: one that was not (its publish failed) may come anywhere.
        seen, top, self.late = set(), 0, []
        for n in arrivals:
            if n not in acked:
                continue
            if n not in seen:
                if n < top:
                    self.late.append(n)
                seen.add(n)
            top = max(top, n)
        self.out_of_order = len(self.late)
        # A publish answered with an error (or never answered) may still be delivered: not a fault, but shown.
        self.unacknowledged_delivered = sorted(distinct - acked)
        covered = set()
        for index, _what in announcements:
            before = max(arrivals[:index], default=0)
            after = min(arrivals[index:], default=max(acked, default=0) + 1)
            covered.update(range(before + 1, after))
        missing = sorted(acked - distinct)
        self.silent = [n for n in missing if n not in covered]
        self.announced = [n for n in missing if n in covered]
        self.announcements = [what for _, what in announcements]
        self.notes = notes

    @property
    def lost(self):
        return len(self.silent) + len(self.announced)

    def line(self):
        silent = _ranges(self.silent)
        return (f"{self.name}: acknowledged {self.acknowledged}, delivered {self.delivered}, "
                f"silent losses {len(self.silent)}{' ' + silent if silent else ''}, "
                f"announced losses {len(self.announced)} ({len(self.announcements)} announcements), "
                f"duplicates {self.duplicates}, out of order {self.out_of_order}"
                + (f" {_ranges(sorted(self.late))}" if self.late else "")
                + (f", delivered though not acknowledged {_ranges(self.unacknowledged_delivered)}"
                   if self.unacknowledged_delivered else "")
                + (f"; {', '.join(self.notes)}" if self.notes else ""))

    def row(self):
        return {"client": self.name, "acknowledged": self.acknowledged, "delivered": self.delivered,
                "silent": len(self.silent), "announced": len(self.announced), "duplicates": self.duplicates,
                "out_of_order": self.out_of_order}


def _ranges(numbers, limit=8):
    """[3, 4, 5, 9] -> "[3-5, 9]" (at most `limit` ranges shown)."""
    if not numbers:
        return ""
    spans, start, prev = [], numbers[0], numbers[0]
    for n in numbers[1:]:
        if n != prev + 1:
            spans.append((start, prev))
            start = n
        prev = n
    spans.append((start, prev))
    text = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans[:limit])
    return f"[{text}{', …' if len(spans) > limit else ''}]"


def play_faults(proxies, schedule=SCHEDULE, gap=GAP, log=None):
    """Plays `schedule` on every proxy at once; returns what was done, one line per fault."""
    done = []
    for kind, seconds, ending in schedule:
        # A fault is played on open connections: a client between two is waited for (3 s at most).
        wait_until(lambda: all(p.counters()["active"] for p in proxies), 3, raises=False)
        if kind == "blackhole":
            hit = [p.blackhole() for p in proxies]
        else:
            hit = [p.stall(None, both=kind == "stall+") for p in proxies]
        time.sleep(seconds)
        ended = [p.reset() if ending == "reset" else p.drop() for p in proxies]
        for p in proxies:
            p.heal()
        done.append(f"{kind} {seconds:g}s on {hit} connections, then {ending} of {ended}")
        if log:
            log(done[-1])
        time.sleep(gap)
    return done


def settle(clients, acked_of, quiet=QUIET, deadline=SETTLE_DEADLINE):
    """Waits until each client has every event acknowledged to it (`acked_of(client)`) or got nothing new for
    `quiet` seconds (at most `deadline` seconds in all)."""
    def settled(c):
        arrivals, _, _, last = c.tally.snapshot()
        return acked_of(c) <= set(arrivals) or time.monotonic() - last >= quiet

    return wait_until(lambda: all(settled(c) for c in clients), deadline, interval=0.1, raises=False)


def only(arrivals, announcements, keep):
    """The arrivals that `keep` accepts, and the announcements placed among those: a client's tally restricted to
    one publisher's events, which are then counted (order, gaps) as if that publisher were alone."""
    kept, index_of = [], []
    for n in arrivals:
        index_of.append(len(kept))
        if keep(n):
            kept.append(n)
    index_of.append(len(kept))
    return kept, [(index_of[i], what) for i, what in announcements]


def play(clients, proxies, publishers, schedule=SCHEDULE, *, tail=TAIL, faults=None, per_publisher=False):
    """Publishes (one Publisher, or several started and stopped together: a client with an `acked_by` attribute is
    counted against that one, the others against the first), plays the faults on `proxies` (or calls `faults()`,
    which plays its own and returns what it did, one line per fault), stops publishing, waits for the clients to
    settle, stops them and returns one Result per client (also printed, and kept in FIGURES). With
    `per_publisher`, every client is counted against each publisher apart, on that publisher's events alone: one
    Result per client and publisher, in that order."""
    publishers = list(publishers) if isinstance(publishers, (list, tuple)) else [publishers]

    def publisher_of(c):
        return getattr(c, "acked_by", None) or publishers[0]

    def acked_of(c):
        if per_publisher:
            return set().union(*(p.acked for p in publishers))
        return set(publisher_of(c).acked)

    for p in publishers:
        p.start()
    try:
        time.sleep(WARMUP)
        done = faults() if faults else play_faults(proxies, schedule)
        time.sleep(tail)
    finally:
        for p in publishers:
            p.stop()
    settled = settle(clients, acked_of)
    results = []
    for c in clients:
        c.stop()
        arrivals, announcements, notes, _ = c.tally.snapshot()
        counted = [(p, f"{c.tally.name}, events from {p.url}") for p in publishers] if per_publisher else [
            (publisher_of(c), c.tally.name)]
        for p, name in counted:
            mine, told = only(arrivals, announcements, p.owns) if per_publisher else (arrivals, announcements)
            r = Result(name, set(p.acked), mine, told, notes)
            r.faults = done
            results.append(r)
            FIGURES.append(r)
            print("FAULT " + r.line())
    for p in publishers:
        print(f"publisher to {p.url}: {p.sent} sent, {len(p.acked)} acknowledged, {len(p.errors)} errors "
              f"{p.errors[:3]}")
    print(f"faults: {'; '.join(done)}; settled: {settled}")
    for c in clients:
        for line in getattr(c, "diagnostics", lambda: [])():
            print(f"  {c.tally.name}: {line}")
    return results


def table(results):
    """The figures as a Markdown table, one row per client."""
    lines = ["| client | acknowledged | delivered | silent losses | announced losses | duplicates | out of order |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.name} | {r.acknowledged} | {r.delivered} | {len(r.silent)} | {len(r.announced)} | "
                     f"{r.duplicates} | {r.out_of_order} |")
    return "\n".join(lines)
