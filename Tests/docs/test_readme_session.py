"""The README's "A session that works when pasted" is pasted, block by block, against the real binary: the curl
session (a long-poll connect that waits, then returns with the event published from another shell) and the
command-line client. Only the port changes (a free one instead of 9292) and the binary path."""

import os
import re
import signal
import subprocess
import urllib.request

import pytest

import mdcheck
from pubsubtest.ports import free_port
from pubsubtest.wait import wait_until

SECTION = "A session that works when pasted"


def binary():
    return os.environ.get("PUBSUB_BIN", os.path.join(mdcheck.REPO, ".build", "debug", "pubsub"))


def session_blocks():
    """The code blocks of the README's session section, in order, as (info, text)."""
    tokens = mdcheck._md.parse(open(os.path.join(mdcheck.REPO, "README.md"), encoding="utf-8").read())
    blocks, inside = [], False
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag == "h2":
            inside = tokens[i + 1].content == SECTION
        elif inside and token.type == "fence":
            blocks.append((token.info.strip(), token.content))
    return blocks


def one_block(predicate, what):
    found = [text for info, text in session_blocks() if info == "sh" and predicate(text)]
    assert len(found) == 1, f"the README's session should have exactly one block that {what}"
    return found[0]


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


@pytest.fixture
def broker():
    bin_path = binary()
    assert os.access(bin_path, os.X_OK), f"pubsub binary not found at {bin_path} (set PUBSUB_BIN)"
    # the README starts it with `swift run -c release pubsub serve`: the same command, on a free port
    serve = one_block(lambda t: t.strip() == "swift run -c release pubsub serve", "starts the broker")
    assert serve.strip().endswith("pubsub serve")
    port = free_port()
    proc = subprocess.Popen([bin_path, "serve", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/healthz").strip() == "ok", 10,
                   message="the broker to answer /healthz", ignore=(OSError,))
        yield bin_path, port
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def held_connects(port):
    metrics = get(f"http://127.0.0.1:{port}/metrics")
    return sum(float(v) for v in re.findall(r'^pubsub_clients\{transport="[^"]*"\} (\S+)$', metrics, re.M))


def on_port(text, port):
    assert "127.0.0.1:9292" in text
    return text.replace("127.0.0.1:9292", f"127.0.0.1:{port}")


def test_the_curl_session_delivers_the_published_event(broker):
    _, port = broker
    subscriber = one_block(lambda t: "/meta/handshake" in t, "subscribes with curl")
    publisher = one_block(lambda t: t.startswith("curl") and '"/jobs/42"' in t, "publishes with curl")

    second = subprocess.Popen(["bash", "-c", on_port(subscriber, port)], stdout=subprocess.PIPE, text=True)
    try:
        # the second terminal's last connect is held by the broker, waiting for an event
        wait_until(lambda: held_connects(port) == 1, 10, message="the second connect to be held", ignore=(OSError,))
        assert second.poll() is None
        third = subprocess.run(["bash", "-c", on_port(publisher, port)], capture_output=True, text=True, timeout=10)
        assert third.returncode == 0
        assert third.stdout == '[{"channel":"/jobs/42","successful":true}]'
        out, _ = second.communicate(timeout=10)
    finally:
        second.kill()
    assert '"channel":"/meta/subscribe","successful":true,"subscription":"/jobs/*"' in out
    # the held connect came back with the event, as the README shows
    assert re.search(r'"channel":"/meta/connect","successful":true.*\},\{"channel":"/jobs/42","data":\{"progress":100\},'
                     r'"ext":\{"position":"2\.', out), out


def test_the_cli_session_delivers_the_published_event(broker):
    bin_path, port = broker
    block = one_block(lambda t: "pubsub subscribe" in t and "pubsub publish" in t, "uses the command-line client")
    lines = [re.sub(r"\s+#.*", "", l).strip() for l in block.splitlines() if l.strip()]
    assert len(lines) == 2 and all(l.startswith(".build/release/pubsub ") for l in lines), lines
    subscribe, publish = (l.replace(".build/release/pubsub", bin_path, 1) for l in lines)
    env = dict(os.environ, PUBSUB_URL=f"http://127.0.0.1:{port}/faye")
    env.pop("PUBSUB_SECRET", None)

    second = subprocess.Popen(["bash", "-c", "exec " + subscribe], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert "subscribed to /jobs/*" in second.stderr.readline()
        third = subprocess.run(["bash", "-c", publish], capture_output=True, text=True, timeout=20, env=env)
        assert third.returncode == 0, third.stderr
        assert second.stdout.readline() == '{"progress":100}\n'
        second.send_signal(signal.SIGINT)
        assert second.wait(timeout=10) == 0
    finally:
        second.kill()
