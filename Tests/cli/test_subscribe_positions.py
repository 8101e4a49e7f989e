"""`pubsub subscribe` that does not lose events: --position-file across a kill -9, recovered: false and its exit
status, a corrupt position file, and a resume after the broker ended the session (docs/SUBSCRIBE.md)."""

import json
import os
import signal
import threading
import time

import pytest

from clitools import run
from pubsubtest.bayeux import publish
from pubsubtest.broker import Broker, pubsub_bin
from pubsubtest.metrics import metric, scrape
from pubsubtest.process import Lines
from pubsubtest.wait import wait_until

pytestmark = pytest.mark.timeout(90)

NOT_RECOVERED = 3


def subscriber(b, position_file, *args):
    sub = Lines([pubsub_bin(), "subscribe", "--url", b.url, "--position-file", str(position_file), *args, "/feed/*"])
    sub.wait_for(lambda: "subscribed to" in sub.errors(), 30, "the subscription")
    return sub


def numbers(sub):
    for t in sub.threads:
        t.join(timeout=5)
    return [json.loads(line)["n"] for line in sub.lines()]


class Publisher(threading.Thread):
    """Publishes {"n": 1} … {"n": total} on /feed/a, one every `pause` seconds."""

    def __init__(self, b, total, pause=0.004):
        super().__init__(daemon=True)
        self.b, self.total, self.pause = b, total, pause
        self.published = 0
        self.error = None

    def run(self):
        try:
            for n in range(1, self.total + 1):
                publish(self.b, "/feed/a", {"n": n})
                self.published = n
                time.sleep(self.pause)
        except Exception as e:  # reported by the test
            self.error = e


@pytest.mark.parametrize("transport", [[], ["--websocket"]])
def test_kill_9_mid_stream_then_restart_prints_every_event_once_in_order(tmp_path, transport):
    total = 400
    position_file = tmp_path / "positions.json"
    with Broker(timeout=45, extra_args=["--history-size", "2000"]) as b:
        first = subscriber(b, position_file, *transport)
        publisher = Publisher(b, total)
        publisher.start()
        try:
            wait_until(lambda: len(first.lines()) >= 100, 30, message="100 events printed by the first run")
            first.kill9()
            killed_at = publisher.published
            # Published while no subscriber runs.
            wait_until(lambda: publisher.published >= killed_at + 100, 30, message="100 events published meanwhile")
            second = subscriber(b, position_file, *transport)
            publisher.join(60)
            assert publisher.error is None and publisher.published == total, publisher.error
            wait_until(lambda: second.lines() and json.loads(second.lines()[-1])["n"] == total, 30,
                       message="the last event printed by the second run")
            second.stop()
        finally:
            first.stop()
        one, two = numbers(first), numbers(second)
        assert one and two, (one, two)
        # The kill may land between an event's line and the rename of the file that records it: that one line
        # (and never more) is printed again by the next run.
        repeated = one[-1:] if two[:1] == one[-1:] else []
        assert one + two[len(repeated):] == list(range(1, total + 1)), (one[-5:], two[:5])
        assert "recovered" in second.errors() and "recovered: false" not in second.errors(), second.errors()
        recovered = int(second.errors().split("recovered ")[1].split(" ")[0])
        assert recovered >= 100, second.errors()
        saved = json.loads(position_file.read_text())
        assert saved["version"] == 1 and set(saved["positions"]) == {"/feed/*"}, saved
        assert not os.path.exists(str(position_file) + ".tmp")


def test_a_position_the_history_no_longer_holds_exits_3_then_the_next_run_goes_on(tmp_path):
    position_file = tmp_path / "positions.json"
    with Broker(timeout=45, extra_args=["--history-size", "5"]) as b:
        first = subscriber(b, position_file, "--count", "2")
        publish(b, "/feed/a", {"n": 1})
        publish(b, "/feed/a", {"n": 2})
        first.proc.wait(15)
        assert first.proc.returncode == 0 and numbers(first) == [1, 2], first.errors()
        kept = position_file.read_text()
        for n in range(3, 23):           # 20 events: more than the broker's history of 5
            publish(b, "/feed/a", {"n": n})
        p = run(["subscribe", "--url", b.url, "--position-file", str(position_file), "--timeout", "10", "/feed/*"])
        assert p.returncode == NOT_RECOVERED, (p.returncode, p.stderr)
        assert p.stdout == ""
        assert "recovered: false" in p.stderr and "refetch" in p.stderr, p.stderr
        # The file now holds the broker's position at that run: after a refetch, the next run goes on from it.
        assert position_file.read_text() != kept
        third = subscriber(b, position_file, "--count", "1")
        publish(b, "/feed/a", {"n": 23})
        third.proc.wait(15)
        assert third.proc.returncode == 0 and numbers(third) == [23], third.errors()
        assert "recovered 0 events" in third.errors(), third.errors()


def test_accept_gaps_says_so_and_goes_on(tmp_path):
    position_file = tmp_path / "positions.json"
    with Broker(timeout=45, extra_args=["--history-size", "5"]) as b:
        p = run(["subscribe", "--url", b.url, "--position-file", str(position_file), "--timeout", "1", "/feed/*"])
        assert p.returncode == 0, p.stderr
        for n in range(1, 21):
            publish(b, "/feed/a", {"n": n})
        second = subscriber(b, position_file, "--accept-gaps", "--count", "1")
        assert "recovered: false" in second.errors() and "going on from here" in second.errors(), second.errors()
        publish(b, "/feed/a", {"n": 21})
        second.proc.wait(15)
        assert second.proc.returncode == 0 and numbers(second) == [21], second.errors()


@pytest.mark.parametrize("content, why", [
    ("", "empty"),
    ("{not json", "not JSON"),
    ('{"positions":{}}', "no version"),
    ('{"version":1,"positions":{"/feed/*":7}}', "is not a string"),
])
def test_a_corrupt_position_file_is_one_clear_line_and_exit_65(tmp_path, content, why):
    position_file = tmp_path / "positions.json"
    position_file.write_text(content)
    with Broker(timeout=45) as b:
        p = run(["subscribe", "--url", b.url, "--position-file", str(position_file), "--timeout", "5", "/feed/*"])
    assert p.returncode == 65, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(position_file) in lines[0] and why in lines[0] and "corrupt" in lines[0], p.stderr
    assert position_file.read_text() == content     # left as it was


def test_a_lost_session_is_resumed_with_the_events_published_meanwhile():
    """The subscriber is stopped (SIGSTOP) until the broker forgets its session; events are published
    meanwhile; once continued it handshakes again, resumes, and prints them all, in order."""
    with Broker(timeout=1, extra_args=["--history-size", "100"]) as b:
        sub = Lines([pubsub_bin(), "subscribe", "--url", b.url, "/feed/*"])
        try:
            sub.wait_for(lambda: "subscribed to" in sub.errors(), 30, "the subscription")
            publish(b, "/feed/a", {"n": 1})
            wait_until(lambda: len(sub.lines()) == 1, 10, message="the first event")
            os.killpg(sub.proc.pid, signal.SIGSTOP)
            for n in range(2, 12):
                publish(b, "/feed/a", {"n": n})
            # Until the broker has forgotten the session (no connect for twice its timeout).
            wait_until(lambda: metric(scrape(b), "pubsub_sessions_expired_total") >= 1, 20,
                       message="the stopped subscriber's session expired")
            os.killpg(sub.proc.pid, signal.SIGCONT)
            wait_until(lambda: "ended this session" in sub.errors(), 20, message="the session ended")
            publish(b, "/feed/a", {"n": 12})
            wait_until(lambda: len(sub.lines()) >= 12, 20, message="every event")
            assert [json.loads(line)["n"] for line in sub.lines()] == list(range(1, 13)), sub.lines()
            # Events already on their way when the session ended (a held connect's answer) count as received.
            recovered = int(sub.errors().split("resumed /feed/*: recovered ")[1].split(" ")[0])
            assert 1 <= recovered <= 10, sub.errors()
        finally:
            sub.stop()


def test_a_position_file_needs_a_broker_that_gives_positions(tmp_path):
    position_file = tmp_path / "positions.json"
    with Broker(timeout=45, extra_args=["--history-size", "0"]) as b:
        p = run(["subscribe", "--url", b.url, "--position-file", str(position_file), "--timeout", "5", "/feed/*"])
        assert p.returncode == NOT_RECOVERED, (p.returncode, p.stderr)
        assert "needs a broker that gives positions" in p.stderr and not position_file.exists(), p.stderr
        # Without a position file the same broker is subscribed to as before.
        p = run(["subscribe", "--url", b.url, "--timeout", "1", "/feed/*"])
        assert p.returncode == 0, p.stderr
