"""WebSocket compression side by side with Faye's own Ruby client (Debian ruby-faye 1.4.0, Faye::Client on
EventMachine, no permessage-deflate: websocket-driver offers no extension unless one is added).

The Ruby client and a Python `websockets` client that negotiates permessage-deflate subscribe to one channel; a large
job-progress event (compressed once per publish by the broker, for the Python client only) must reach both intact,
and so must a large event the Python client publishes compressed itself. The Ruby client reports the response
headers of its WebSocket upgrade (no extension answered) and the transport it ended on (WebSocket).
"""

import json
import os
import queue
import shutil
import subprocess
import threading
import time

import pytest
import requests

from pubsubtest.broker import Broker
from pubsubtest.compression import ANSWER, WebSocketSession, job_progress

pytestmark = [pytest.mark.pubsub_only, pytest.mark.timeout(60)]

# Subscribes to CHANNEL with Faye::Client, prints one JSON line per event, and, once COUNT have come, the transport
# it used and the Sec-WebSocket-Extensions of its upgrade response, then disconnects.
RUBY = r"""
require 'json'
require 'faye'
$stdout.sync = true
def emit(fields) $stdout.puts(JSON.generate(fields)) end

url, channel, count, deadline = ARGV
count = count.to_i
EM.run do
  EM.error_handler { |e| emit('event' => 'error', 'error' => "#{e.class}: #{e.message}"); EM.stop }
  EM.add_timer(deadline.to_f) { emit('event' => 'done', 'ok' => false, 'reason' => 'deadline'); EM.stop }
  client = Faye::Client.new(url, timeout: 30)
  got = 0
  sub = client.subscribe(channel) do |data|
    emit('event' => 'message', 'data' => data)
    got += 1
    next if got < count
    transport = client.instance_variable_get(:@dispatcher)&.instance_variable_get(:@transport)
    socket = transport&.instance_variable_get(:@socket)
    headers = socket.respond_to?(:headers) ? socket.headers : nil
    emit('event' => 'transport', 'class' => transport.class.name,
         'status' => socket.respond_to?(:status) ? socket.status : nil,
         'extensions' => headers && headers['Sec-WebSocket-Extensions'],
         'upgrade' => headers && headers['Upgrade'])
    client.disconnect
    EM.add_timer(0.3) { emit('event' => 'done', 'ok' => true); EM.stop }
  end
  sub.callback { emit('event' => 'subscribed') }
  sub.errback { |e| emit('event' => 'done', 'ok' => false, 'reason' => "subscribe: #{e}"); EM.stop }
end
exit!(0)
"""


@pytest.fixture(scope="module")
def ruby_faye():
    ruby = shutil.which("ruby")
    if not ruby:
        pytest.fail("ruby is not installed; run scripts/install-test-deps (Debian ruby-faye)")
    probe = subprocess.run([ruby, "-e", "require 'faye'; require 'eventmachine'; require 'faye/websocket'"],
                           capture_output=True, text=True, timeout=20)
    if probe.returncode != 0:
        pytest.fail(f"the faye gem does not load: {probe.stderr.strip()}; run scripts/install-test-deps")
    return ruby


class RubyClient:
    """faye's Ruby client in a process of its own; its JSON lines are read as they come."""

    def __init__(self, ruby, script, url, channel, count, deadline=25):
        self.lines = queue.Queue()
        self.all = []
        self.proc = subprocess.Popen([ruby, script, url, channel, str(count), str(deadline)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        self.stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if line:
                try:
                    event = json.loads(line)
                except ValueError:
                    event = {"event": "unparsable", "line": line}
                self.all.append(event)
                self.lines.put(event)
        self.lines.put(None)

    def wait(self, kind, timeout=20):
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"Ruby client: no {kind} within {timeout}s: {self.all} {''.join(self.stderr)}")
            if event is None:
                raise AssertionError(f"Ruby client ended before {kind}: {self.all} {''.join(self.stderr)}")
            if event.get("event") in ("error", "done") and kind != "done":
                raise AssertionError(f"Ruby client: {event} while waiting for {kind}: {self.all}")
            if event.get("event") == kind:
                return event

    def close(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=5)


def test_faye_ruby_client_and_a_compressing_python_client_get_the_same_large_events(ruby_faye, tmp_path):
    script = tmp_path / "faye_subscriber.rb"
    script.write_text(RUBY)
    channel = "/interop/compression/jobs"
    with Broker(timeout=30) as b:
        ruby = RubyClient(ruby_faye, str(script), b.url, channel, count=2)
        try:
            ruby.wait("subscribed")
            with WebSocketSession(b) as py:
                assert py.answered == [ANSWER] and py.extensions == ["permessage-deflate"], py.answered
                py.subscribe(channel)

                # published over HTTP: compressed once for the Python client, plain for the Ruby one
                first = job_progress(4096, job="render-7", step=11)
                r = requests.post(b.url, json=[{"channel": channel, "data": first}], timeout=10)
                assert r.status_code == 200 and r.json()[0]["successful"] is True, r.text
                assert py.event(channel)["data"] == first
                assert ruby.wait("message")["data"] == first

                # published by the Python client in a compressed message of its own
                second = job_progress(2048, job="render-7", step=12)
                py.send([{"channel": channel, "clientId": py.cid, "data": second, "id": "py-1"}])
                assert py.wait(lambda m: m.get("id") == "py-1")["successful"] is True
                assert py.event(channel)["data"] == second
                assert ruby.wait("message")["data"] == second

            transport = ruby.wait("transport")
            assert transport["class"] == "Faye::Transport::WebSocket", transport
            assert transport["status"] == 101 and (transport["upgrade"] or "").lower() == "websocket", transport
            assert transport["extensions"] is None, f"Faye's Ruby client offered nothing, yet: {transport}"
            assert ruby.wait("done")["ok"] is True
            assert [e["data"] for e in ruby.all if e.get("event") == "message"] == [first, second]
        finally:
            ruby.close()
